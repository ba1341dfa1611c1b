"""What regional prompts cost: one DiT step with a global prompt and N regions against the plain step.

    python benchmarks/regions_cost.py --heads 24 --depth 1 --single 1 --size 1024 --regions 3
        # klein 4B's real widths (hidden 3072 = 24 heads x 128, text 7680) with 1 + 1 blocks, at 1024²

Both calls run the same DiT in the same process, in turn (plain, regional, plain, ...), after one warm-up
each: the plain step reads one 512-token prompt; the regional one reads the global prompt and N region
prompts (512 tokens each, as FLUX.2 Text Encode gives them) under the regional mask (each region a vertical
stripe of the picture), attended group by group (``attention.GroupedMask``). Printed: the median time per
step, the peak of live tensor memory during the step (``live_tensors``), and the ratios regional / plain.
Per-block costs are what grow, so a few blocks at the real widths give the ratio of the whole model.
"""

from __future__ import annotations

import klein_shapes
import torch
from live_tensors import peak_tensor_bytes

from flux2_core.dit.call import call_extras
from flux2_core.dit.rope import image_ids
from flux2_core.steering.regions import Region, RegionalPrompt, regional_plan


def main() -> None:
    parser = klein_shapes.parser(__doc__.splitlines()[0], "image side in pixels")
    parser.add_argument("--regions", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3)
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
    calls = {  # the text's ids are the model's own (``rope.text_ids`` of the prompt's length)
        "plain": lambda: net(x, x_ids, t, glob.to(device, dtype)),
        "regional": lambda: net(x, x_ids, t, context.to(device, dtype), call_extras(regions=mask)),
    }
    with torch.inference_mode():
        median, _ = klein_shapes.in_turn(calls, args.repeats, device)
        peaks = {name: peak_tensor_bytes(call) for name, call in calls.items()}
    print(
        f"{device} {args.dtype}, {net.config.hidden_size} wide, {net.config.depth}+"
        f"{net.config.depth_single_blocks} blocks, {args.size}x{args.size} ({grid * grid} image tokens), "
        f"{args.regions} regions + a global prompt ({context.shape[1]} text tokens; the mask in "
        f"{len(mask.groups)} groups of queries)"
    )
    for name in calls:
        print(
            f"{name}: {median[name] * 1e3:.0f} ms a step, peak {peaks[name] / 2**20:.0f} MiB of live tensors"
        )
    print(
        f"regional / plain: time {median['regional'] / median['plain']:.2f}x, memory "
        f"{peaks['regional'] / peaks['plain']:.2f}x"
    )


if __name__ == "__main__":
    main()
