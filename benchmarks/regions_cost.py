"""What regional prompts cost: one DiT step with a global prompt and N regions against the plain step.

    python benchmarks/regions_cost.py --heads 24 --depth 1 --single 1 --size 1024 --regions 3
        # klein 4B's real widths (hidden 3072 = 24 heads x 128, text 7680) with 1 + 1 blocks, at 1024²
    python benchmarks/regions_cost.py --heads 24 --depth 1 --single 1 --size 1024 --regions 3 --refs 1
        # a regional edit step against a plain edit step: one reference of --ref-size² (default --size)

Both calls run the same DiT in the same process, in turn (plain, regional, plain, ...), after one warm-up
each: the plain step reads one 512-token prompt; the regional one reads the global prompt and N region
prompts (512 tokens each, as FLUX.2 Text Encode gives them) under the regional mask (each region a vertical
stripe of the picture), attended group by group (``attention.GroupedMask``). With ``--refs`` both calls carry
the same references (random latents appended after the image, as a plain klein edit has them), the regional
one under the mask extended over them (``RegionalMask.with_references``). Printed: the median time per
step, the peak of live tensor memory during the step (``live_tensors``), and the ratios regional / plain.
Per-block costs are what grow, so a few blocks at the real widths give the ratio of the whole model.
"""

from __future__ import annotations

import time

import klein_shapes
import torch
from live_tensors import peak_tensor_bytes

from flux2_core.dit.call import call_extras
from flux2_core.dit.rope import image_ids, reference_ids
from flux2_core.steering.regions import Region, RegionalPrompt, regional_plan


def main() -> None:
    parser = klein_shapes.parser(__doc__.splitlines()[0], "image side in pixels")
    parser.add_argument("--regions", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--refs", type=int, default=0, help="reference images in both calls")
    parser.add_argument("--ref-size", type=int, default=None, help="their side in pixels (default --size)")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: the process's CPU time (a shared or paused machine does not inflate it)",
    )
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    net = klein_shapes.our_dit(args, dtype, device)
    grid, width = args.size // 16, net.config.context_in_dim
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, grid * grid, 128, generator=g).to(device, dtype)
    glob = torch.randn(1, 512, width, generator=g)
    regions = []
    for k in range(args.regions):  # vertical stripes
        mask = torch.zeros(args.size, args.size)
        mask[:, k * args.size // args.regions : (k + 1) * args.size // args.regions] = 1
        regions.append(Region(torch.randn(1, 512, width, generator=g), mask))
    context, mask = regional_plan(RegionalPrompt(glob, tuple(regions)), (grid, grid), dtype, device)
    t, x_ids = torch.tensor([0.5], device=device), image_ids(grid, grid)
    refs, ref_grid = None, (args.ref_size or args.size) // 16
    if args.refs:
        ref_tokens = torch.randn(1, args.refs * ref_grid * ref_grid, 128, generator=g).to(device, dtype)
        refs = (ref_tokens, reference_ids([(ref_grid, ref_grid)] * args.refs))
    calls = {  # the text's ids are the model's own (``rope.text_ids`` of the prompt's length)
        "plain": lambda: net(x, x_ids, t, glob.to(device, dtype), call_extras(references=refs)),
        "regional": lambda: net(
            x, x_ids, t, context.to(device, dtype), call_extras(references=refs, regions=mask)
        ),
    }
    with torch.inference_mode():
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        median, _ = klein_shapes.in_turn(calls, args.repeats, device, clock)
        peaks = {name: peak_tensor_bytes(call) for name, call in calls.items()}
    print(
        f"{device} {args.dtype}, {net.config.hidden_size} wide, {net.config.depth}+"
        f"{net.config.depth_single_blocks} blocks, {args.size}x{args.size} ({grid * grid} image tokens), "
        f"{args.regions} regions + a global prompt ({context.shape[1]} text tokens; the mask in "
        f"{len(mask.groups) + (1 if refs else 0)} groups of queries)"
        + (
            f", {args.refs} reference(s) of {ref_grid * 16}² ({refs[0].shape[1]} tokens) in both"
            if refs
            else ""
        )
    )
    for name in calls:
        print(
            f"{name}: {median[name] * 1e3:.0f} ms {'of CPU time ' if args.clock == 'cpu' else ''}a step, "
            f"peak {peaks[name] / 2**20:.0f} MiB of live tensors"
        )
    print(
        f"regional / plain: time {median['regional'] / median['plain']:.2f}x, memory "
        f"{peaks['regional'] / peaks['plain']:.2f}x"
    )


if __name__ == "__main__":
    main()
