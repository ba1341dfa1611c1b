"""Where a DiT step's time goes on a CPU: one step of our DiT at a model's real widths, split by kind of work.

    python benchmarks/cpu_profile.py                                   # klein 4B, 9B and dev widths, bf16
    python benchmarks/cpu_profile.py --shapes klein-4b --sizes 512 1024 --refs 0 1 --json out.json
    python benchmarks/cpu_profile.py --shapes klein-4b --dtype float32 --impls ours diffusers  # both

Each shape runs at its real widths (hidden size, heads, text width; FLUX.2 [dev] with its guidance embedder)
with fewer blocks (``--depth`` + ``--single``: the step's share of each kind of work is the same per block),
random weights, batch 1. Every call of the step's parts is timed by a wrapper (the CPU runs them in order, so
wall time is theirs) and summed per kind. The blocks' steps go through the call's ops (``block_ops.ops_for``:
``FusedOps`` on a CPU below float32, ``CpuOps`` in float32; ``FLUX2_BLOCK_OPS`` overrides), so the wrappers
sit on each kind of ops and time whichever the step uses (the JSON names it):

- ``linear``: every linear layer's matrix product (``ops.Linear``), and separately the part of it that goes
  to laying the weights out for the CPU's matrix units on every call (the same products timed once with
  weights laid out beforehand, ``torch.ops.mkldnn._reorder_linear_weight``, and subtracted; bf16 / fp16, 0
  on a CPU whose oneDNN cannot lay them out, as its products then do not);
- ``attention``: the ops' ``attention`` (the kernel of ``attention.py`` they run: the measured choice of the
  fused ops, which is listed, or PyTorch's SDPA), its copies included;
- ``qk norm + rope`` (the fused ops, below float32: one pass, ``FusedOps.qk_norm_rope``), or ``qk norm``
  and ``rope`` apart (float32: ``RMSNorm``, then the rotation in chunks of tokens, ``fused.rope_in_chunks``;
  the plain ops: ``rope.apply_rope``), ``modulation`` (the ops' ``modulate``: the layer norms with shift and
  scale), ``mlp activation`` (SwiGLU: the double blocks' MLPs and the single blocks' ``activate``);
- ``rest``: everything else inside the step: the gated residuals, the casts, the concatenations and layout
  copies around attention, the embedders;
- ``page faults``: the minor page faults the step caused (fresh memory the allocator got from the system and
  the kernel zeroed), with their count; their time is inside the rows above.

``--impls ours diffusers`` profiles diffusers' ``Flux2Transformer2DModel`` on the same weights (ours loaded
from its state dict in BFL's layout, as ``suite.py`` does) with the same split, its parts wrapped where its
blocks reach them: ``nn.Linear``, ``dispatch_attention_fn`` (its SDPA), ``RMSNorm`` (q/k norm),
``apply_rotary_emb`` (rope), ``LayerNorm`` (modulation: the scale and shift it applies inline count in
``rest``) and ``Flux2SwiGLU``. The two alternate per round, so a drift of the machine reaches both.

The matmul peak (``suite.matmul_peak``) is measured in the same run, and each row's achieved GFLOP/s (the
linear and attention FLOPs counted from the shape) is shown against it. ``--json`` writes the table.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from collections import defaultdict
from dataclasses import replace

import suite_models as sm
import torch
import torch.nn.functional as F
from klein_shapes import timed  # (also puts the repository on the path)
from suite import machine, matmul_peak

from flux2_core import ops
from flux2_core.configs import DEV_32B, KLEIN_4B, KLEIN_9B
from flux2_core.dit import block_ops, fused, pointwise
from flux2_core.dit.call import call_extras
from flux2_core.dit.transformer import Flux2Transformer

# the real widths; blocks reduced so that a bf16 copy fits a 24 GB machine
SHAPES = {"klein-4b": KLEIN_4B, "klein-9b": KLEIN_9B, "dev": DEV_32B}
KINDS = ("linear", "attention", "qk norm + rope", "rope", "qk norm", "modulation", "mlp activation")


class Timers:
    """Wall time per kind of work, summed over the wrapped calls of one step."""

    def __init__(self):
        self.seconds: dict[str, float] = defaultdict(float)
        self.linear_shapes: list[tuple[tuple[int, ...], ops.Linear]] = []
        self.on = False

    def wrap(self, kind: str, fn):
        def wrapped(*args, **kwargs):
            if not self.on:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
            self.seconds[kind] += time.perf_counter() - start
            return out

        return wrapped


def instrument(timers: Timers) -> None:
    """Wrap the step's parts where the blocks reach them (the block ops' methods; module and class
    attributes), for this process. No wrapped part calls another: no time is counted twice."""
    for cls in (block_ops.PlainOps, block_ops.CpuOps, block_ops.FusedOps):
        own = vars(cls)  # each class's own methods: an override never calls up to a wrapped one
        for method, kind in (("attention", "attention"), ("modulate", "modulation")):
            if method in own:
                setattr(cls, method, timers.wrap(kind, own[method]))
    fused_ops = block_ops.FusedOps
    fused_ops.qk_norm_rope = timers.wrap("qk norm + rope", vars(fused_ops)["qk_norm_rope"])
    # the plain and CPU ops' q/k norm + RoPE, in its two parts: the norms, then the rotation (every token at
    # once as ``block_ops`` names ``rope.apply_rope``, or in chunks of tokens in place on a CPU)
    pointwise.RMSNorm.forward = timers.wrap("qk norm", pointwise.RMSNorm.forward)
    block_ops.apply_rope = timers.wrap("rope", block_ops.apply_rope)
    fused.rope_in_chunks = timers.wrap("rope", fused.rope_in_chunks)
    # the activation module, which the double blocks' MLPs and the single blocks' ``activate`` both call
    pointwise.SwiGLU.forward = timers.wrap("mlp activation", pointwise.SwiGLU.forward)
    plain = ops.Linear.forward

    def linear(layer, x, out=None):
        if timers.on:
            timers.linear_shapes.append((tuple(x.shape), layer))
        return plain(layer, x, out)

    ops.Linear.forward = timers.wrap("linear", linear)


def instrument_diffusers(timers: Timers) -> None:
    """The same split on diffusers' FLUX.2 DiT: its parts wrapped where its blocks reach them (the module
    docstring). Its linear layers are ``nn.Linear`` (ours, ``ops.Linear``, is no subclass: nothing twice)."""
    from diffusers.models.transformers import transformer_flux2 as dm

    torch.nn.Linear.forward = timers.wrap("linear", torch.nn.Linear.forward)
    dm.dispatch_attention_fn = timers.wrap("attention", dm.dispatch_attention_fn)
    dm.apply_rotary_emb = timers.wrap("rope", dm.apply_rotary_emb)
    torch.nn.RMSNorm.forward = timers.wrap("qk norm", torch.nn.RMSNorm.forward)
    torch.nn.LayerNorm.forward = timers.wrap("modulation", torch.nn.LayerNorm.forward)
    dm.Flux2SwiGLU.forward = timers.wrap("mlp activation", dm.Flux2SwiGLU.forward)


def relayout_seconds(calls: list[tuple[tuple[int, ...], ops.Linear]], dtype: torch.dtype) -> float | None:
    """How much of the linear layers' time goes to laying their weights out per call: each product timed as
    ``F.linear`` does it and with the weight laid out once beforehand (best of 3 each), summed."""
    mkldnn = torch.ops.mkldnn
    if dtype not in (torch.bfloat16, torch.float16) or not hasattr(mkldnn, "_reorder_linear_weight"):
        return None
    total = 0.0
    for shape, layer in calls:
        x = torch.randn(shape, dtype=dtype)
        w = layer.weight.to(dtype)
        try:
            packed = mkldnn._reorder_linear_weight(w, x.numel() // x.shape[-1])
        except RuntimeError:  # a CPU without oneDNN's units for this dtype (no AVX-512 BW / AVX-NE-CONVERT):
            return 0.0  # its products do not use oneDNN's laid-out weights, so nothing is laid out per call
        plain = timed(lambda x=x, w=w: F.linear(x, w), 3, stat=min)
        laid = timed(lambda x=x, p=packed: mkldnn._linear_pointwise(x, p, None, "none", [], ""), 3, stat=min)
        total += max(plain - laid, 0.0)
    return total


def build(config, dtype) -> Flux2Transformer:
    net = Flux2Transformer(config).to(dtype)
    sm.random_fill_(net, 0)
    net.compute_dtype = dtype
    return net.eval()


def build_impls(config, dtype, names) -> dict:
    """The step makers of ``names`` on one set of random weights: ours alone (built directly), or ours loaded
    from diffusers' model's state dict beside it (``suite.py``'s way)."""
    if names == ["ours"]:
        net = build(config, dtype)

        def ours(case, inp):
            g = inp.extra.get("guidance")

            def step():
                refs = None if inp.ref is None else (inp.ref, inp.ref_ids)
                return net(inp.x, inp.x_ids, inp.t, inp.ctx, call_extras(references=refs, guidance=g))

            return step

        return {"ours": ours}
    from tiny_dit import bfl_state_dict

    theirs = sm.build_diffusers_dit(config, "cpu", dtype)
    bfl = bfl_state_dict(theirs)
    impls = {"ours": sm.Ours(bfl, "cpu", dtype).step, "diffusers": sm.Diffusers(theirs).step}
    return {name: impls[name] for name in names}


def profile_case(impls: dict, config, case: sm.Case, dtype, timers: Timers, rounds: int) -> dict:
    """Each of ``impls``' steps on the same inputs: warmed up, then ``rounds`` rounds alternating between
    them; each one's fastest round with its split."""
    dev = config.guidance_embed
    inp = sm.make_inputs(case, config.context_in_dim, "cpu", dtype, guidance=4.0 if dev else None)
    with torch.inference_mode():
        used = block_ops.ops_for("cpu", dtype).name  # the block ops the step runs (chosen without grad)
        steps = {name: make(case, inp) for name, make in impls.items()}
        for step in steps.values():
            step()  # warm-up: the attention kernel's choice is measured here, once per shape class
        runs = {name: [] for name in steps}
        for _ in range(rounds):
            for name, step in steps.items():
                runs[name].append(measure(step, timers))
    return {n: summary(r, dtype, config, case, used if n == "ours" else n) for n, r in runs.items()}


def measure(step, timers: Timers) -> tuple:
    """One timed step: its total, the split, the page faults and the linear calls."""
    timers.seconds.clear()
    timers.linear_shapes.clear()
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    timers.on = True
    start = time.perf_counter()
    step()
    total = time.perf_counter() - start
    timers.on = False
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    return total, dict(timers.seconds), faults, list(timers.linear_shapes)


def summary(runs: list, dtype, config, case, used: str) -> dict:
    """One implementation's fastest round, its split (``rest``: what no wrapper timed) and re-layout share."""
    total, parts, faults, calls = min(runs, key=lambda r: r[0])
    relayout = relayout_seconds(calls, dtype)
    parts["rest"] = total - sum(parts.values())
    return {
        "total_s": total,
        "totals_s": [r[0] for r in runs],
        "parts_s": parts,
        "relayout_s": relayout,
        "page_faults": faults,
        "flops": sm.dit_flops(config, case),
        "ops": used,
        "attention": {str(k): v for k, v in block_ops.KERNELS.chosen.items()},
    }


def report_row(label: str, name: str, res: dict, peak: float) -> str:
    """A markdown row: the step, its GFLOP/s against the peak, each kind's share, the re-layout's share and
    the memory the page faults brought in."""
    total = res["total_s"]
    gflops = res["flops"] / total / 1e9
    cells = [label, name, f"{total * 1e3:.0f} ms", f"{gflops:.0f} ({100 * gflops / peak:.0f}%)"]
    cells += [f"{100 * res['parts_s'].get(kind, 0.0) / total:.1f}%" for kind in (*KINDS, "rest")]
    relayout = res["relayout_s"]
    cells.append("-" if relayout is None else f"{100 * relayout / total:.1f}%")
    cells.append(f"{res['page_faults'] * 4 / 1024:.0f} MB")
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32", "float16"])
    p.add_argument("--sizes", type=int, nargs="+", default=[512, 1024])
    p.add_argument("--refs", type=int, nargs="+", default=[0, 1], help="references of 512² (edit cases)")
    p.add_argument("--depth", type=int, default=1, help="double blocks")
    p.add_argument("--single", type=int, default=4, help="single blocks")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--heads", type=int, help="narrower than the real widths: heads x 128 (tests)")
    p.add_argument("--impls", nargs="+", default=["ours"], choices=["ours", "diffusers"])
    p.add_argument("--json")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    peak = matmul_peak(torch.device("cpu"), [args.dtype], quick=False)[args.dtype]["gflops"]
    info = machine(torch.device("cpu"))
    print(f"{info['cpu']} ({info['cpu_capability']}), {info['torch_threads']} threads, torch {info['torch']}")
    print(f"{args.dtype} matmul peak {peak:.0f} GFLOP/s")
    timers = Timers()
    instrument(timers)
    if "diffusers" in args.impls:
        instrument_diffusers(timers)
    head = "| shape | case | impl | step | GFLOP/s (% peak) | " + " | ".join((*KINDS, "rest"))
    head += " | of linear: weight re-layout | page faults |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    out = {"machine": info, "matmul_peak_gflops": peak, "args": vars(args), "cases": {}}
    for shape in args.shapes:
        config = replace(SHAPES[shape], depth=args.depth, depth_single_blocks=args.single)
        if args.heads:
            config = replace(config, hidden_size=128 * args.heads, num_heads=args.heads, context_in_dim=96)
        impls = build_impls(config, dtype, args.impls)
        for size in args.sizes:
            for refs in args.refs:
                if refs and size != args.sizes[0]:
                    continue  # edits at the first size only
                name = f"t2i {size}²" if not refs else f"edit {size}² + {refs} ref"
                case = sm.Case(name, size, refs, 512)
                results = profile_case(impls, config, case, dtype, timers, args.rounds)
                for impl, res in results.items():
                    out["cases"][f"{shape} {name} {impl}"] = res
                    row = report_row(shape, f"{name} | {impl}", res, peak)
                    print(row, flush=True)
                    lines.append(row)
        del impls
    print("\n" + "\n".join(lines))
    cases = out["cases"].values()
    spread = [statistics.pstdev(r["totals_s"]) / statistics.mean(r["totals_s"]) for r in cases]
    print(f"\nround-to-round spread of the step (stdev / mean): up to {100 * max(spread):.1f}%")
    chosen = ", ".join(f"{k}: {v}" for k, v in block_ops.KERNELS.chosen.items())
    print("attention kernels chosen: " + (chosen or "none (PyTorch's SDPA ran)"))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
