"""Speed of our DiT against diffusers' Flux2Transformer2DModel on the same random weights, in one run.

    python benchmarks/dit_vs_diffusers.py [--device cpu|cuda] [--dtype float32|bfloat16] [--size 512]

Builds a klein-shaped DiT (head dim 128) of reduced depth with random weights, writes it in the BFL layout,
loads it through our loader, and times forward passes of both implementations on identical inputs
(text 512 tokens, a size x size image, plus optionally one reference of the same size). Prints the median
time of each and the ratio. Needs the test extra (diffusers).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import klein_shapes  # noqa: E402  (puts the repository and tests/ on the path)
import torch
from tiny_dit import write_bfl_file  # noqa: E402

from flux2_core.dit_files import load_transformer  # noqa: E402
from flux2_core.rope import image_ids, reference_ids, text_ids  # noqa: E402


def timed(fn, repeats: int, device: torch.device) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = klein_shapes.parser(__doc__.splitlines()[0], "image side in pixels")
    parser.add_argument("--reference", action="store_true", help="add one reference of the same size")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    hidden = args.heads * 128
    reference = klein_shapes.klein_shaped_dit(args.heads, args.depth)
    with tempfile.TemporaryDirectory() as tmp:
        ours = load_transformer(
            write_bfl_file(reference.float().cpu(), Path(tmp) / "bench.safetensors"),
            dtype=dtype,
            device=device,
        ).transformer
    reference.to(device, dtype)

    grid = args.size // 16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, grid * grid, 128, generator=g).to(device, dtype)
    ctx = torch.randn(1, 512, reference.config.joint_attention_dim, generator=g).to(device, dtype)
    t = torch.tensor([0.7], device=device)
    x_ids, ctx_ids = image_ids(grid, grid).to(device), text_ids(512).to(device)
    ref = ref_ids = None
    if args.reference:
        ref = torch.randn(1, grid * grid, 128, generator=g).to(device, dtype)
        ref_ids = reference_ids([(grid, grid)]).to(device)
    joint_x = x if ref is None else torch.cat([x, ref], 1)
    joint_ids = x_ids if ref is None else torch.cat([x_ids, ref_ids])

    with torch.inference_mode():
        ours_s = timed(lambda: ours(x, x_ids, t, ctx, ctx_ids, ref, ref_ids), args.repeats, device)
        theirs_s = timed(
            lambda: reference(
                hidden_states=joint_x,
                encoder_hidden_states=ctx,
                timestep=t,
                img_ids=joint_ids,
                txt_ids=ctx_ids,
                return_dict=False,
            ),
            args.repeats,
            device,
        )
    tokens = 512 + joint_x.shape[1]
    print(
        f"DiT {hidden} wide, {args.depth}+{4 * args.depth} blocks, {tokens} tokens, {args.dtype} on {device}"
    )
    print(f"  ours      {ours_s * 1000:8.1f} ms / forward")
    print(f"  diffusers {theirs_s * 1000:8.1f} ms / forward")
    print(f"  ratio (diffusers / ours): {theirs_s / ours_s:.2f}x")


if __name__ == "__main__":
    main()
