"""What the Fun ControlNet costs: one FLUX.2 [dev] step under the control net against the plain step.

    python benchmarks/control_cost.py --dtype bfloat16 --size 512 --share-single
        # dev's real widths (6144 = 48 heads x 128, Mistral's 15360-wide text) with a quarter of every
        # part: 2 + 12 of its 8 + 48 blocks and 1 of the control net's 4 blocks (8.7 + 1.0 B parameters)
    python benchmarks/control_cost.py --dtype bfloat16 --size 1024 --quarters 4   # the whole model (GPU)

Both calls run the same DiT in the same process, in turn (plain, controlled, plain, ...), after one warm-up
each, on random weights made on the device in the compute dtype (no file: a 32B model's file cannot be written
here). ``--share-single`` makes the single blocks one module run N times: every block still does all of its
work (its weights, 1 GB in bf16, are far larger than any cache, so a repeat reads them from memory again), but
the weights are held once, so the quarter model fits a 24 GB machine. The controlled step is the sampler's:
the control context of the output's tokens ([1, N, 260]) through the control blocks, each hint added after its
double block. Printed: the median time per step, the weights each call needs on the device, the peak of the
memory a step allocates beyond them (CUDA: the allocator's peak; CPU: live tensors counted op by op,
``live_tensors``), and the ratios controlled / plain. The control net holds one double block per two of dev's,
so a quarter of each part keeps the whole model's ratio; ``--quarters`` takes more of both.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

import klein_shapes  # (also puts the repository and tests/ on the path)
import torch
from live_tensors import peak_tensor_bytes

from flux2_core.configs import DEV_32B
from flux2_core.dit.call import call_extras
from flux2_core.dit.control import CONTROL_CHANNELS, Control, ControlConfig, Flux2ControlNet, hint_bytes
from flux2_core.dit.rope import image_ids
from flux2_core.dit.transformer import Flux2Transformer

GIB = 2**30
TEXT_TOKENS = 512  # dev's prompt length (FLUX.2 Text Encode pads to it)


def random_module(build, device: torch.device, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """``build()`` made on the meta device, then given random weights on ``device`` in ``dtype``, one tensor
    at a time (std 1/sqrt(fan-in) for matrices, 1 +- 0.1 for the vectors: norms' scales, biases)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("meta"):
            module = build()
    finally:
        torch.set_default_dtype(default)
    module = module.to_empty(device=device)
    if device.type == "meta":  # a dry run: shapes only
        return module.eval()
    g = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, p.shape[1] ** -0.5, generator=g)
            else:
                p.normal_(1.0, 0.1, generator=g)
    return module.eval()


def measure(call, device: torch.device) -> int:
    """The most memory one call allocates beyond what exists before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        call()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    return peak_tensor_bytes(call)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--size", type=int, default=512, help="image side in pixels")
    p.add_argument("--quarters", type=int, default=1, choices=[1, 2, 3, 4], help="quarters of each part")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--share-single", action="store_true", help="the single blocks' weights held once")
    p.add_argument("--heads", type=int, default=DEV_32B.num_heads, help="narrower than dev (tests): x 128")
    p.add_argument("--text-tokens", type=int, default=TEXT_TOKENS)
    p.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = p.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    q = args.quarters
    width = args.heads * DEV_32B.head_dim  # dev: 48 heads; the text width scales with it (dev: 15360)
    text_width = DEV_32B.context_in_dim * args.heads // DEV_32B.num_heads
    config = replace(DEV_32B, hidden_size=width, num_heads=args.heads, depth=2 * q,
                     depth_single_blocks=12 * q, context_in_dim=text_width)  # fmt: skip
    control_config = ControlConfig(config.hidden_size, config.num_heads, config.mlp_hidden_dim, q)
    start = time.perf_counter()

    def dit() -> Flux2Transformer:
        net = Flux2Transformer(config)
        if args.share_single:
            net.single_blocks = torch.nn.ModuleList([net.single_blocks[0]] * config.depth_single_blocks)
        return net

    net = random_module(dit, device, dtype, seed=0)
    control = random_module(lambda: Flux2ControlNet(control_config), device, dtype, seed=1)

    def logical_bytes(module: torch.nn.Module) -> int:  # every block counted, shared or not
        blocks = module.blocks()
        inside = {id(p) for b in blocks for p in b.parameters()}
        outside = sum(p.nbytes for p in module.parameters() if id(p) not in inside)
        return outside + sum(p.nbytes for b in blocks for p in b.parameters())

    weights = {"dit": logical_bytes(net), "control net": logical_bytes(control)}
    held_now = sum(p.nbytes for m in (net, control) for p in m.parameters())
    print(
        f"built in {time.perf_counter() - start:.0f} s: {weights['dit'] // dtype.itemsize / 1e9:.2f} + "
        f"{weights['control net'] // dtype.itemsize / 1e9:.2f} B parameters, {held_now / GIB:.1f} GiB held",
        flush=True,
    )

    grid = args.size // 16
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, grid * grid, 128, generator=g).to(device, dtype)
    ctx = torch.randn(1, args.text_tokens, config.context_in_dim, generator=g).to(device, dtype)
    context = torch.randn(1, grid * grid, CONTROL_CHANNELS, generator=g).to(device, dtype)
    t, guidance = torch.tensor([0.5], device=device), torch.tensor([4.0], device=device)
    x_ids = image_ids(grid, grid)  # on the CPU, as the sampler passes them (the model adds the text's)
    steer = Control(control, context, 0.75)
    calls = {
        "plain": lambda: net(x, x_ids, t, ctx, call_extras(guidance=guidance)),
        "controlled": lambda: net(x, x_ids, t, ctx, call_extras(guidance=guidance, control=steer)),
    }
    with torch.inference_mode():
        median, times = klein_shapes.in_turn(calls, args.repeats, device)
        peaks = {name: measure(call, device) for name, call in calls.items()}
    held = {"plain": weights["dit"], "controlled": weights["dit"] + weights["control net"]}
    print(
        f"{device} {args.dtype}, {config.hidden_size} wide, {config.depth}+{config.depth_single_blocks} "
        f"blocks and {q} control block(s) (hints after double blocks {list(control_config.layers)}), "
        f"{args.size}x{args.size} ({grid * grid} image tokens, {args.text_tokens} text tokens)"
    )
    for name in calls:
        print(
            f"{name}: {median[name] * 1e3:.0f} ms a step, weights {held[name] / GIB:.2f} GiB (as distinct "
            f"blocks), peak {peaks[name] / 2**20:.0f} MiB allocated by the step"
        )
    planned = hint_bytes(control_config, 1, grid * grid, dtype)
    print(
        f"controlled / plain: time {median['controlled'] / median['plain']:.3f}x, step memory "
        f"{peaks['controlled'] / peaks['plain']:.3f}x, weights {held['controlled'] / held['plain']:.3f}x "
        f"(the plan's hint allowance: {planned / 2**20:.0f} MiB; measured extra "
        f"{(peaks['controlled'] - peaks['plain']) / 2**20:.0f} MiB)"
    )
    if args.json is not None:
        report = {
            "args": {k: str(v) for k, v in vars(args).items()},
            "median_s": median,
            "times_s": times,
            "peak_step_bytes": peaks,
            "weight_bytes": held,
            "planned_hint_bytes": planned,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
