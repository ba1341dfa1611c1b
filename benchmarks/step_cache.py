"""What the First-Block Cache saves: a full step against a skipped one, and whole runs at a few thresholds.

    python benchmarks/step_cache.py [--device cpu|cuda] [--dtype float32|bfloat16] [--size 512]
        [--heads 8 --depth 2 --single 8] [--steps 20] [--thresholds 0.5,1,2]

Builds a klein-shaped DiT (head dim 128) with random weights and times, in one process:

* one full step (every block) and one skipped step (the first block, the comparison, the stored residual,
  the final layer), by running the same input with the cache forced each way: their ratio is the most a
  skipped step can save on this machine at this shape;
* whole runs of ``--steps`` steps at each threshold against the uncached run: steps that ran every block,
  time, speed-up and the mean change of the final latent (relative to its mean size).

Random weights change their first block's residual by about its own size from step to step (trained models:
a few hundredths to tenths), so the thresholds that skip steps here are larger than the ones to use on a
real model, and the latent changes say nothing of a real image's. The step costs are the shape's own.
"""

from __future__ import annotations

import time

import klein_shapes  # noqa: E402  (puts the repository and tests/ on the path)
import torch

from flux2_core.configs import VARIANTS  # noqa: E402
from flux2_core.dit.call import call_extras  # noqa: E402
from flux2_core.dit.rope import image_ids  # noqa: E402
from flux2_core.dit.step_cache import MAX_STEP_CACHE, FirstBlockCache, StepCache  # noqa: E402
from flux2_core.dit.transformer import Flux2Model  # noqa: E402
from flux2_core.sampling import SampleRequest, SampleSettings, sample  # noqa: E402


def main() -> None:
    parser = klein_shapes.parser(__doc__.splitlines()[0], "image side in pixels")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--thresholds", default="0.5,1,2")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    net = klein_shapes.our_dit(args, dtype, device)
    model = Flux2Model(net, VARIANTS["distilled"], "bench")
    grid = args.size // 16
    torch.manual_seed(0)
    x = torch.randn(1, grid * grid, 128, device=device, dtype=dtype)
    ctx = torch.randn(1, 512, net.config.context_in_dim, device=device, dtype=dtype)
    t = torch.tensor([0.5], device=device)
    x_ids = image_ids(grid, grid)  # on the CPU, as the sampler passes them (the model adds the text's)

    def step(cache):
        with torch.inference_mode():
            net(x, x_ids, t, ctx, call_extras(step_cache=cache))

    full = klein_shapes.timed(lambda: step(None), args.repeats, device)
    skipping = FirstBlockCache(MAX_STEP_CACHE)  # every step after the first it sees is skipped here
    step(skipping)
    skipped = klein_shapes.timed(lambda: step(skipping), args.repeats, device)
    blocks = net.config.depth + net.config.depth_single_blocks
    print(
        f"{device} {args.dtype}, {net.config.hidden_size} wide, {net.config.depth}+"
        f"{net.config.depth_single_blocks} blocks, {args.size}x{args.size} ({grid * grid} image tokens)"
    )
    print(
        f"full step {full * 1e3:.1f} ms, skipped step {skipped * 1e3:.1f} ms: {full / skipped:.2f}x "
        f"(1 of {blocks} blocks)"
    )

    settings = SampleSettings(args.size, args.size, args.steps, 1.0, seed=0)
    text = torch.randn(1, 512, net.config.context_in_dim)
    start = time.perf_counter()
    plain = sample(SampleRequest(model, text, settings))
    plain_time = time.perf_counter() - start
    print(f"{args.steps} steps, no cache: {plain_time:.2f} s")
    for threshold in (float(v) for v in args.thresholds.split(",")):
        cache = StepCache(threshold)
        start = time.perf_counter()
        out = sample(SampleRequest(model, text, settings, step_cache=cache))
        took = time.perf_counter() - start
        change = ((out - plain).abs().mean() / plain.abs().mean()).item()
        print(
            f"threshold {threshold:g}: {cache.passes[0].full_steps} of {args.steps} steps ran every block, "
            f"{took:.2f} s ({plain_time / took:.2f}x), latent change {change:.3f}"
        )


if __name__ == "__main__":
    main()
