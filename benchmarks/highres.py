"""High resolution: one step of one pass at a size (with and without position extrapolation) against one step
of a tiled refine of the same canvas, in time and peak live tensor memory.

    python benchmarks/highres.py [--device cpu|cuda] [--dtype float32|bfloat16] [--size 2048]
        [--tile 1024 --overlap 128] [--heads 24 --depth 1 --single 4] [--repeats 1]

Builds a klein-shaped DiT (head dim 128; ``--heads 24`` is klein 4B's width) with random weights and, in one
process, times each case's step and counts its peak of live tensors (``live_tensors``: the memory the step's
tensors need beyond the weights and inputs; on a GPU also ``max_memory_allocated``):

* ``one pass``: the DiT on the whole ``--size`` canvas (512 text tokens), positions as today;
* ``one pass, dype``: the same with position extrapolation at a base of half the size (so it acts);
* ``tiled refine``: every ``--tile`` px tile of the canvas with its reference, blended (one step of
  ``flux2_core.upscale.tiled``).

Random weights: the costs are the shape's own; the pictures mean nothing.
"""

from __future__ import annotations

import klein_shapes  # noqa: E402  (puts the repository and tests/ on the path)
import torch
from live_tensors import peak_tensor_bytes

from flux2_core.configs import VARIANTS  # noqa: E402
from flux2_core.dit.extrapolation import PositionExtrapolation  # noqa: E402
from flux2_core.dit.transformer import Flux2Model  # noqa: E402
from flux2_core.flow import pack, unpack  # noqa: E402
from flux2_core.sampling import latent_velocity  # noqa: E402
from flux2_core.upscale.tiled import TiledRefine, _tile_velocity, tile_grid  # noqa: E402

MB = 2**20


def main() -> None:
    parser = klein_shapes.parser(__doc__.splitlines()[0], "canvas side in pixels")
    parser.add_argument("--tile", type=int, default=1024)
    parser.add_argument("--overlap", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.set_defaults(heads=24, depth=1, single=4, size=2048)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    net = klein_shapes.our_dit(args, dtype, device)
    model = Flux2Model(net, VARIANTS["distilled"], "klein-shaped")
    side = args.size // 16
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, 128, side, side, generator=generator).to(device)
    text = torch.randn(1, 512, net.config.context_in_dim, generator=generator).to(device, dtype)
    sigma = torch.tensor([0.9], device=device)
    dype = PositionExtrapolation(max(256, args.size // 2 // 16 * 16))
    refine = TiledRefine(model, text, x.cpu(), 4, 0.5, 0, args.tile, args.overlap)
    grid = tile_grid(args.size, args.size, args.tile, args.overlap)
    schedule = [1.0, 0.9, 0.5, 0.2, 0.0]

    def tiled_step():
        canvas, weights, out = x, grid.weights(), torch.zeros_like(x)
        for k, (rows, cols) in enumerate(grid.windows()):
            v = _tile_velocity(refine, (rows, cols), schedule)(pack(canvas[..., rows, cols]), 0.9)
            size = (rows.stop - rows.start, cols.stop - cols.start)
            out[..., rows, cols] += weights[k].to(device) * unpack(v, *size)
        return out

    calls = {
        "one pass": lambda: latent_velocity(model, x, sigma, text),
        "one pass, dype": lambda: latent_velocity(model, x, sigma, text, extrapolation=dype),
        f"tiled refine ({len(grid.windows())} tiles)": tiled_step,
    }
    medians, _ = klein_shapes.in_turn(calls, args.repeats, device)
    print(f"{args.size}x{args.size}, hidden {net.config.hidden_size}, {args.depth} + {args.single} blocks, "
          f"{args.dtype} on {device}; tiles {args.tile} px, overlap {args.overlap}")  # fmt: skip
    for name, call in calls.items():
        with torch.inference_mode():
            peak = peak_tensor_bytes(call)
        print(f"  {name:28s} {medians[name]:8.2f} s/step   peak live tensors {peak / MB:9.0f} MiB")


if __name__ == "__main__":
    main()
