"""What the DiT's block ops and ``torch.compile`` change: one DiT step with the plain ops against the fused
ones, and compiled against eager.

    python benchmarks/block_ops_cost.py --compare ops [--device cuda] [--dtype bfloat16] [--size 1024]
        [--heads 24 --depth 1 --single 4] [--repeats 5] [--json out.json]
    python benchmarks/block_ops_cost.py --compare compile [...]      # torch.compile of the whole forward
    python benchmarks/block_ops_cost.py --compare ops compile [...]  # both, in one process

One process, one klein-shaped DiT (head size 128, klein's RoPE axes; ``--heads 24`` is klein 4B's width) with
random weights made on the device in the compute dtype, one step of ``--size``² output and 512 text tokens:

* ``ops``: the same step with ``FLUX2_BLOCK_OPS=plain`` (the reference PyTorch ops and SDPA: what a GPU runs)
  and ``FLUX2_BLOCK_OPS=fused`` (the elementwise steps fused, q/k norm + RoPE in chunks of tokens, the scratch
  buffer, the measured attention kernel: what a CPU runs below float32), called in turn after a warm-up each;
* ``compile``: the step eager (the ops ``block_ops.ops_for`` chooses) against ``torch.compile`` of the whole
  DiT forward (under compilation the plain ops run: one graph); the first compiled call, which compiles, is
  timed apart, then both are called in turn.

Printed: the median time per step, the ratios fused / plain and compiled / eager (< 1: faster), and the
largest difference of each output from the first one's (relative to its largest value). ``--json`` writes the
figures (after each comparison, so a run stopped by a time limit keeps what it finished).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import klein_shapes  # (also puts the repository and tests/ on the path)
import torch
from control_cost import random_module

from flux2_core.configs import Flux2Config
from flux2_core.dit.block_ops import OPS_ENV, ops_for
from flux2_core.dit.rope import image_ids
from flux2_core.dit.transformer import Flux2Transformer

TEXT_TOKENS = 512


def with_ops(name: str | None, call):
    """``call`` under ``FLUX2_BLOCK_OPS=name`` (None: unset, the ops ``ops_for`` chooses); the variable is
    read at every DiT call, so the calls can alternate in one process."""

    def run():
        before = os.environ.pop(OPS_ENV, None)
        if name is not None:
            os.environ[OPS_ENV] = name
        try:
            return call()
        finally:
            os.environ.pop(OPS_ENV, None)
            if before is not None:
                os.environ[OPS_ENV] = before

    return run


def compared(calls: dict, repeats: int, device: torch.device) -> dict:
    """The calls in turn (``klein_shapes.in_turn``): median seconds, every time, the ratio of the second to
    the first, and each output's largest difference from the first's, relative to its largest value."""
    median, times = klein_shapes.in_turn(calls, repeats, device)
    outs = {name: call().float() for name, call in calls.items()}
    first, second = list(calls)
    ref = outs[first]
    return {
        "median_s": median,
        "times_s": times,
        "ratio": median[second] / median[first],
        "max_rel_diff": {n: ((o - ref).abs().max() / ref.abs().max()).item() for n, o in outs.items()},
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def report(name: str, res: dict) -> None:
    first, second = list(res["median_s"])
    for label, seconds in res["median_s"].items():
        diff = res["max_rel_diff"][label]
        print(f"  {label:9s} {seconds * 1e3:9.1f} ms a step   (output vs {first}: {diff:.2e} of its largest)")
    print(f"  {name}: {second} / {first} = {res['ratio']:.3f}x the time", flush=True)


def main() -> None:
    parser = klein_shapes.parser(__doc__.splitlines()[0], "image side in pixels")
    parser.add_argument("--compare", nargs="+", choices=["ops", "compile"], default=["ops", "compile"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    parser.set_defaults(heads=24, depth=1, single=4, size=1024)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    hidden, grid = args.heads * 128, args.size // 16
    single = 4 * args.depth if args.single is None else args.single
    config = Flux2Config(hidden_size=hidden, num_heads=args.heads, depth=args.depth,
                         depth_single_blocks=single, context_in_dim=3 * hidden)  # fmt: skip
    start = time.perf_counter()
    net = random_module(lambda: Flux2Transformer(config), device, dtype, seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, grid * grid, 128, generator=g).to(device, dtype)
    ctx = torch.randn(1, TEXT_TOKENS, config.context_in_dim, generator=g).to(device, dtype)
    t = torch.tensor([0.7], device=device)
    x_ids = image_ids(grid, grid)  # on the CPU, as the sampler passes them (the model adds the text's)

    def step(model=net):
        return model(x, x_ids, t, ctx)

    params = sum(p.numel() for p in net.parameters())
    figures = {
        "device": str(device),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "torch": torch.__version__,
        "dtype": args.dtype,
        "hidden": hidden,
        "blocks": [args.depth, single],
        "parameters": params,
        "size": args.size,
        "tokens": grid * grid + TEXT_TOKENS,
        "repeats": args.repeats,
    }
    print(
        f"klein-shaped DiT {hidden} wide, {args.depth}+{single} blocks ({params / 1e6:.0f} M parameters, "
        f"built in {time.perf_counter() - start:.1f} s), {args.size}² ({grid * grid} image + {TEXT_TOKENS} "
        f"text tokens), {args.dtype} on {device}",
        flush=True,
    )

    def save() -> None:
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(figures, indent=1))

    with torch.inference_mode():
        if "ops" in args.compare:
            calls = {"plain": with_ops("plain", step), "fused": with_ops("fused", step)}
            figures["ops"] = res = compared(calls, args.repeats, device)
            report("block ops", res)
            save()
        if "compile" in args.compare:
            eager_ops = with_ops(None, lambda: ops_for(device, dtype).name)()
            compiled = torch.compile(net)
            sync(device)
            begin = time.perf_counter()
            with_ops(None, lambda: step(compiled))()
            sync(device)
            compile_s = time.perf_counter() - begin
            print(f"  compiled in {compile_s:.1f} s (its first call); eager: the {eager_ops} ops", flush=True)
            calls = {"eager": with_ops(None, step), "compiled": with_ops(None, lambda: step(compiled))}
            res = compared(calls, args.repeats, device)
            figures["compile"] = {**res, "compile_s": compile_s, "eager_ops": eager_ops}
            report("torch.compile", res)
            save()


if __name__ == "__main__":
    main()
