"""Speed of our DiT against diffusers' Flux2Transformer2DModel on the same random weights, in one run.

    python benchmarks/dit_vs_diffusers.py [--device cpu|cuda] [--dtype float32|bfloat16] [--size 512]
        [--heads 8 --depth 2 --single 8] [--guidance 4.0] [--reference]

Builds a klein-shaped DiT (head dim 128) of reduced depth with random weights (with ``--guidance``, dev's
guidance embedder, fed that value), loads its weights through our loading pipeline (diffusers names, from
memory), and times forward passes of both implementations on identical inputs (text 512 tokens, a size x
size image, plus optionally one reference of the same size). Prints the median time of each, the ratio and,
on CUDA, each forward's peak memory above the weights. Needs the test extra (diffusers). The real dev shape
is ``--heads 48 --depth 8 --single 48 --guidance 4``: diffusers' copy (64 GB in bfloat16) and ours, which
shares its unfused tensors and holds its own fused q/k/v, take about 110 GB of the device.
"""

from __future__ import annotations

from pathlib import Path

import klein_shapes  # noqa: E402  (puts the repository and tests/ on the path)
import torch

from flux2_core.dit.call import call_extras  # noqa: E402
from flux2_core.dit.files import DIT_SPEC  # noqa: E402
from flux2_core.dit.rope import image_ids, reference_ids, text_ids  # noqa: E402
from flux2_core.weights.checkpoint import Checkpoint  # noqa: E402
from flux2_core.weights.loading import load_checkpoint  # noqa: E402


def main() -> None:
    parser = klein_shapes.parser(__doc__.splitlines()[0], "image side in pixels")
    parser.add_argument("--reference", action="store_true", help="add one reference of the same size")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--guidance", type=float, default=None, help="embedded guidance (a dev-shaped DiT)")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    hidden = args.heads * 128
    embeds = args.guidance is not None
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)  # built on the device in the benchmark's dtype: no float32 copy anywhere
    try:
        with torch.device(device):
            reference = klein_shapes.klein_shaped_dit(args.heads, args.depth, args.single, embeds)
    finally:
        torch.set_default_dtype(default)
    ours = load_checkpoint(DIT_SPEC, Checkpoint(Path("bench"), reference.state_dict()), dtype, device).module
    guidance = torch.tensor([args.guidance], device=device) if embeds else None

    grid = args.size // 16
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, grid * grid, 128, generator=g).to(device, dtype)
    ctx = torch.randn(1, 512, reference.config.joint_attention_dim, generator=g).to(device, dtype)
    t = torch.tensor([0.7], device=device)
    # ids: ours takes them on the CPU (it makes the text's itself and turns them into its RoPE table, as the
    # sampler passes them); diffusers' on the device
    x_ids, ref, ref_ids = image_ids(grid, grid), None, None
    if args.reference:
        ref = torch.randn(1, grid * grid, 128, generator=g).to(device, dtype)
        ref_ids = reference_ids([(grid, grid)])
    joint_x = x if ref is None else torch.cat([x, ref], 1)
    joint_ids = (x_ids if ref is None else torch.cat([x_ids, ref_ids])).to(device)
    ctx_ids = text_ids(512).to(device)

    def run_ours():
        refs = None if ref is None else (ref, ref_ids)
        return ours(x, x_ids, t, ctx, call_extras(references=refs, guidance=guidance))

    def run_theirs():
        return reference(hidden_states=joint_x, encoder_hidden_states=ctx, timestep=t, img_ids=joint_ids,
                         txt_ids=ctx_ids, guidance=guidance, return_dict=False)[0]  # fmt: skip

    with torch.inference_mode():
        difference = (run_ours() - run_theirs()[:, : x.shape[1]]).abs().max().item()
        ours_s, ours_peak = klein_shapes.timed(run_ours, args.repeats, device), peak_above(run_ours, device)
        theirs_s, theirs_peak = (
            klein_shapes.timed(run_theirs, args.repeats, device),
            peak_above(run_theirs, device),
        )
    tokens = 512 + joint_x.shape[1]
    single = 4 * args.depth if args.single is None else args.single
    kind = f"dev-shaped (guidance {args.guidance:g})" if embeds else "klein-shaped"
    print(
        f"{kind} DiT {hidden} wide, {args.depth}+{single} blocks, {tokens} tokens, {args.dtype} on {device}"
    )
    print(f"  outputs differ by at most {difference:.2e}")
    for name, seconds, peak in (("ours", ours_s, ours_peak), ("diffusers", theirs_s, theirs_peak)):
        memory = f", peak {peak / 2**20:.0f} MiB above the weights" if peak is not None else ""
        print(f"  {name:9s} {seconds * 1000:8.1f} ms / forward{memory}")
    print(f"  ratio (diffusers / ours): {theirs_s / ours_s:.2f}x")


def peak_above(fn, device: torch.device) -> int | None:
    """Peak CUDA bytes one call allocates beyond what was allocated before it (None off CUDA)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated(device) - before


if __name__ == "__main__":
    main()
