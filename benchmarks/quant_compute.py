"""A klein DiT step from fp8, nvfp4, W4A8, AWQ and int8 files: in format, dequantised, native ComfyUI, bf16.

    python benchmarks/quant_compute.py --shapes klein-4b klein-9b [--depth 2 --single 8 --size 1024]
    python benchmarks/quant_compute.py --dry-run    # tiny widths on the CPU: the plumbing, no timings
    python benchmarks/quant_compute.py --device cpu --shapes klein-4b --depth 1 --single 4 --size 512 \
        --formats int8 w4a8 --modes auto format dequantize --repeats 2   # the CPU's in-format gain

One process, one random klein-shaped DiT per shape (klein's real widths: 4B 3072, 9B 4096, with ``--depth``
double and ``--single`` single blocks; a step's time scales with the block count), written as ComfyUI's fp8
and nvfp4 layouts, W4A8 (``asym_w4a8_int8`` by comfy-kitchen's own quantiser: int4 codebook, fp8 group scales
of 16, ConvRot 256), AWQ W4A16 (group 64, by the formats spec's formula) and int8 (per row, ConvRot 256), as
``--formats`` lists. Each is timed as one DiT step (median of ``--repeats`` after a warm-up; ``--size``²
output, 512 text tokens): ours with ``quant_compute`` auto (in format where the GPU can, the choice printed
per format), ours with ``dequantize`` (today's dequantise-then-matmul), native ComfyUI on the same tensors
(``COMFYUI_PATH`` set: its mixed-precision ops, in format on the same GPUs; the formats 0.29 reads), and the
bf16 weights (ours and native). Ratios are to ours in bf16; "vs ours dequantised" is the in-format gain. Each
output is also compared with ours in bf16 (relative error), so a path that ran but computed garbage shows.
``held_bytes`` is what each model holds (parameters and buffers); ``peak_rss_bytes`` the process's peak
resident memory.
``--modes`` adds ``format`` (in format wherever a kernel exists; on a CPU, auto measures per shape class in 16
bits and keeps the faster: its first step pays the measurement, the timed ones do not).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import torch
from klein_shapes import klein_shaped_dit

SHAPES = {"klein-4b": 24, "klein-9b": 32}  # heads of 128: the real widths


def nvfp4_state_dict(bfl: dict) -> dict:
    """``bfl`` with its block linears in ComfyUI's nvfp4 layout (E2M1 pairs, swizzled float8 block scales, a
    per-tensor ``weight_scale_2``), quantised by the suite's writer."""
    import suite_models as sm
    from quant_files import nvfp4

    def quantise(w):
        return {role: t.to(w.device) for role, t in nvfp4(w.float().cpu())[0].items()}

    return sm.quantised_state_dict(bfl, "nvfp4", quantise)


def w4a8_state_dict(bfl: dict) -> dict:
    """``bfl`` with its block linears in ComfyUI's asym_w4a8_int8 layout, by comfy-kitchen's own quantiser
    (on the weights' device, by the backend comfy-kitchen picks there)."""
    import suite_models as sm
    from comfy_kitchen.tensor import AsymW4A8Int8Layout

    def quantise(w):
        qdata, params = AsymW4A8Int8Layout.quantize(w.float())
        tensors = AsymW4A8Int8Layout.state_dict_tensors(qdata, params)
        return {f"weight{suffix}": t for suffix, t in tensors.items()}

    entry = {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 256}
    return _marked(sm.quantised_state_dict(bfl, "asym_w4a8_int8", quantise), entry)


def awq_state_dict(bfl: dict) -> dict:
    """``bfl`` with its block linears in AWQ W4A16 (group 64), by the formats spec's formula."""
    import suite_models as sm
    from quant_files import awq

    def quantise(w):
        return awq(w.float(), 64, w.dtype)[0]

    return _marked(
        sm.quantised_state_dict(bfl, "awq_w4a16", quantise), {"format": "awq_w4a16", "group_size": 64}
    )


def int8_state_dict(bfl: dict) -> dict:
    """``bfl`` with its block linears in int8 per row with ConvRot 256, as klein's int8 releases."""
    import suite_models as sm
    from quant_files import int8

    def quantise(w):
        q, scale = int8(w.float(), per_row=True, convrot=256)
        return {"weight": q, "weight_scale": scale}

    entry = {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 256}
    return _marked(sm.quantised_state_dict(bfl, "int8_tensorwise", quantise), entry)


def _marked(tensors: dict, entry: dict) -> dict:
    from quant_files import marker

    return {k: marker(entry) if k.endswith(".comfy_quant") else v for k, v in tensors.items()}


FILES = {
    "fp8": lambda bfl: __import__("suite_models").fp8_state_dict(bfl),
    "nvfp4": nvfp4_state_dict,
    "w4a8": w4a8_state_dict,
    "awq": awq_state_dict,
    "int8": int8_state_dict,
}


def ours(tensors: dict, device, dtype, mode: str):
    from flux2_core.dit.files import DIT_SPEC
    from flux2_core.weights.checkpoint import Checkpoint
    from flux2_core.weights.loading import load_checkpoint

    checkpoint = Checkpoint(Path("bench.safetensors"), tensors)
    net = load_checkpoint(DIT_SPEC, checkpoint, dtype, device, quant_compute=mode).module
    return lambda inp: net(inp.x, inp.our_x_ids, inp.t, inp.ctx), net


def choices(net, device) -> dict:
    from flux2_core.ops import linears

    found = {}
    for _, layer in linears(net):
        compute = getattr(layer.source, "compute", None)
        if compute is not None:
            fmt = layer.source.layer.format
            found[fmt] = compute.choice(fmt, torch.device(device)).how
    return found


def timed(run, inp, device, repeats: int) -> tuple[float, torch.Tensor]:
    with torch.inference_mode():
        out = run(inp)  # warm-up (and the choice's log line)
        times = []
        for _ in range(repeats):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            run(inp)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return statistics.median(times), out.float()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--single", type=int, default=8)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--formats", nargs="+", default=["fp8", "nvfp4", "w4a8", "awq"], choices=list(FILES))
    p.add_argument(
        "--modes", nargs="+", default=["auto", "dequantize"], choices=["auto", "format", "dequantize"]
    )
    p.add_argument("--json", default=None)
    p.add_argument("--dry-run", action="store_true", help="2 heads, 1+1 blocks, 64², float32 on the CPU")
    args = p.parse_args()
    if args.dry_run:
        args.device, args.dtype, args.depth, args.single, args.size, args.repeats = (
            "cpu",
            "float32",
            1,
            1,
            64,
            1,
        )
    import suite_models as sm
    from tiny_dit import bfl_state_dict

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    native = sm.comfy_import(device.type == "cuda", sdpa=True)
    results = {"machine": machine(device), "shapes": {}}
    for shape in args.shapes:
        heads = 2 if args.dry_run else SHAPES[shape]
        dit = klein_shaped_dit(heads, args.depth, args.single)
        bfl = {k: v.to(dtype) for k, v in bfl_state_dict(dit).items()}
        del dit
        case = sm.Case(shape, args.size)
        inp = sm.make_inputs(case, 3 * heads * 128, device, dtype)
        rows, reference = {}, None
        for fmt in ["bf16", *args.formats]:
            tensors = bfl if fmt == "bf16" else FILES[fmt](bfl)
            for mode in ("dequantize",) if fmt == "bf16" else args.modes:
                run, net = ours(tensors, device, dtype, mode)
                seconds, out = timed(run, inp, device, args.repeats)
                reference = out if reference is None else reference
                label = "ours bf16" if fmt == "bf16" else f"ours {fmt} {mode}"
                held = sum(t.numel() * t.element_size() for t in [*net.parameters(), *net.buffers()])
                print(f"  ({shape} {fmt} {mode}: {seconds * 1000:.1f} ms)", flush=True)
                rows[label] = {
                    "s": seconds,
                    "error": rel(out, reference),
                    "choice": choices(net, device),
                    "held_bytes": held,
                }
                del run, net
            if native and fmt in ("bf16", "fp8", "nvfp4", "int8"):  # what native ComfyUI 0.29 reads
                nat = sm.Native(dict(tensors), device, dtype)
                step = nat.step(case, inp)
                seconds, out = timed(lambda _, step=step: step(), inp, device, args.repeats)
                rows[f"native {fmt}"] = {"s": seconds, "error": rel(out, reference)}
                del nat, step
        base = rows["ours bf16"]["s"]
        for label, row in rows.items():
            row["vs ours bf16"] = row["s"] / base
            twin = label.replace(" auto", " dequantize")
            if twin != label and twin in rows:
                row["vs ours dequantised"] = row["s"] / rows[twin]["s"]
            twin = label.replace(" format", " dequantize")
            if twin != label and twin in rows:
                row["vs ours dequantised"] = row["s"] / rows[twin]["s"]
        results["shapes"][shape] = {"width": heads * 128, "blocks": [args.depth, args.single], "rows": rows}
        blocks = f"{args.depth}+{args.single} blocks"
        print(f"\n{shape}: {heads * 128} wide, {blocks}, {args.size}², {args.dtype}, {device}")
        for label, row in rows.items():
            gain = row.get("vs ours dequantised")
            gain = f"  {gain:.2f}x ours dequantised" if gain else ""
            held = f"  {row['held_bytes'] / 1e9:.2f} GB held" if "held_bytes" in row else ""
            print(f"  {label:28} {row['s'] * 1000:9.1f} ms  {row['vs ours bf16']:5.2f}x bf16{gain}"
                  f"  rel. error {row['error']:.4f}{held}")  # fmt: skip
            for fmt, how in row.get("choice", {}).items():
                print(f"      {fmt}: {how}")
    if not native:
        print("\n(native ComfyUI not measured: set COMFYUI_PATH)")
    results["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(f"peak resident memory {results['peak_rss_bytes'] / 1e9:.2f} GB")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


def rel(out: torch.Tensor, reference: torch.Tensor) -> float:
    return ((out - reference).norm() / reference.norm()).item()


def machine(device: torch.device) -> str:
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        name = torch.cuda.get_device_name(device)
        return f"{name} (compute capability {major}.{minor}), torch {torch.__version__}"
    flags = ""
    try:
        words = set(Path("/proc/cpuinfo").read_text().split())
        flags = " ".join(
            f for f in ("avx512_bf16", "avx512_vnni", "avx_vnni", "amx_int8", "amx_bf16") if f in words
        )
    except OSError:
        pass
    import os

    return f"CPU ({os.cpu_count()} cores; {flags or 'no VNNI/AMX flags'}), torch {torch.__version__}"


if __name__ == "__main__":
    sys.exit(main())
