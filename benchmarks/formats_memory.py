"""Memory and speed of every checkpoint format, measured on one klein-shaped DiT written in each of them.

    python benchmarks/formats_memory.py [--heads 8 --depth 2 --tokens 1024]

Each file is loaded in a fresh process (so the peak RSS of loading is that file's alone), and the process
reports: load time, load peak RSS above the process's baseline, the bytes the model holds (parameters and
buffers: quantised layers stay quantised), and the DiT time per step (median of 3 after a warm-up) at
``--tokens`` image tokens plus 128 text tokens, in ``--dtype`` (the compute dtype). Ratios are to the
file's size and to the bf16 file's step time; ``--dtype bfloat16`` keeps the unquantised layers in bf16 too
(as on a GPU), so what a model holds is then close to its file's size. "run peak" adds the 4 steps'
activations, one layer's dequantised weight at a time and every weight page read. Then, for the real klein
4B and 9B shapes, the bytes each format holds once loaded, planned from the tensor shapes alone.
"""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from klein_shapes import ROOT, klein_shaped_dit, parser

from flux2_core.ops import linears

FORMATS = ["bf16", "fp8", "nvfp4", "int8-convrot", "gguf-Q8_0", "gguf-Q4_0", "gguf-Q4_K"]


def write(fmt: str, sd: dict, folder: Path) -> Path:
    from quant_files import quantised_layers, write_gguf, write_quantised
    from safetensors.torch import save_file

    if fmt == "bf16":
        path = folder / "flux-2-klein-bf16.safetensors"
        save_file({k: v.to(torch.bfloat16).contiguous() for k, v in sd.items()}, str(path))
        return path
    if fmt.startswith("gguf-"):
        path = folder / f"flux-2-klein-{fmt[5:]}.gguf"
        quantised = {layer + ".weight": fmt[5:] for layer in quantised_layers(sd)}
        write_gguf({k: v.to(torch.bfloat16).float() for k, v in sd.items()}, path, "flux",
                   {**{k: "BF16" for k, v in sd.items() if v.ndim == 2}, **quantised})  # fmt: skip
        return path
    path = folder / f"flux-2-klein-{fmt}.safetensors"
    kind = {"fp8": "float8_e4m3fn", "nvfp4": "nvfp4", "int8-convrot": "int8_tensorwise"}[fmt]
    write_quantised(sd, path, kind, convrot=256 if fmt == "int8-convrot" else 0)
    return path


def rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()


def peak_rss() -> int:
    """This process's peak RSS (VmHWM: unlike ru_maxrss, not inherited from the parent across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure_one(path: str, device: str, dtype: torch.dtype, tokens: int) -> dict:
    """In a fresh process: load, hold, time a step."""
    from flux2_core import load_transformer

    base = rss()
    start = time.perf_counter()
    model = load_transformer(path, variant="distilled", dtype=dtype, device=device)
    load_s = time.perf_counter() - start
    peak = peak_rss()
    net = model.transformer
    held = sum(t.numel() * t.element_size() for t in [*net.parameters(), *net.buffers()])
    quantised = sum(1 for _, layer in linears(net) if type(layer.source).__name__ != "PlainWeight")
    g = torch.Generator().manual_seed(0)
    side = int(math.sqrt(tokens))
    x = torch.randn(1, side * side, 128, generator=g).to(device, dtype)
    ctx = torch.randn(1, 128, net.config.context_in_dim, generator=g).to(device, dtype)
    # the image ids on the CPU, as the sampler passes them (the model adds the text's own)
    ids = torch.zeros(side * side, 4)
    ids[:, 1], ids[:, 2] = torch.arange(side * side) // side, torch.arange(side * side) % side
    t = torch.tensor([0.5])
    times = []
    with torch.inference_mode():
        for _ in range(4):
            if device != "cpu":
                torch.cuda.synchronize()
            start = time.perf_counter()
            net(x, ids, t.to(device), ctx)
            if device != "cpu":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return {
        "load_s": load_s,
        "load_peak_rss": peak - base,
        "run_peak_rss": peak_rss() - base,  # loading plus 4 steps: every weight page has been read
        "held_bytes": held,
        "quantised_layers": quantised,
        "step_s": sorted(times[1:])[1],
    }


def real_shapes() -> dict:
    """Bytes held once loaded, per format, for the real klein 4B / 9B shapes (planned, not loaded)."""
    from flux2_core.configs import KLEIN_4B, KLEIN_9B
    from flux2_core.dit.transformer import Flux2Transformer

    out = {}
    for name, config in (("klein 4B", KLEIN_4B), ("klein 9B", KLEIN_9B)):
        with torch.device("meta"):
            net = Flux2Transformer(config)
        from quant_files import QUANTISED

        per_format = {}
        for fmt, bytes_per_weight in (("bf16", 2), ("fp8", 1), ("int8", 1), ("nvfp4", 0.5 + 1 / 16),
                                      ("Q8_0", 34 / 32), ("Q4_K", 144 / 256)):  # fmt: skip
            total = 0
            for key, tensor in net.state_dict().items():
                layer = key.removesuffix(".weight")
                quantised = fmt != "bf16" and key.endswith(".weight") and QUANTISED.fullmatch(layer)
                total += tensor.numel() * (bytes_per_weight if quantised else 2)
            per_format[fmt] = total
        out[name] = per_format
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0], "unused")
    p.add_argument("--tokens", type=int, default=1024, help="image tokens per step (a square grid)")
    p.add_argument("--one", default=None, help=argparse_suppress())
    args = p.parse_args()
    if args.one:
        dtype = getattr(torch, args.dtype)
        print("RESULT " + json.dumps(measure_one(args.one, args.device, dtype, args.tokens)))
        return
    sd = {k: v.detach() for k, v in bfl(args).items()}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in FORMATS:
            path = write(fmt, sd, Path(tmp))
            cmd = [sys.executable, __file__, "--one", str(path), "--device", args.device,
                   "--dtype", args.dtype, "--tokens", str(args.tokens)]  # fmt: skip
            run = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
            line = [x for x in run.stdout.splitlines() if x.startswith("RESULT ")]
            if not line:
                raise SystemExit(f"{fmt} failed:\n{run.stderr[-2000:]}")
            results[fmt] = {"file_bytes": path.stat().st_size, **json.loads(line[0][7:])}
    base = results["bf16"]["step_s"]
    print(f"klein-shaped DiT: {args.heads * 128} wide, {args.depth}+{4 * args.depth} blocks, {args.device}, "
          f"computing in {args.dtype}, {args.tokens} image + 128 text tokens")  # fmt: skip
    print(f"{'format':14}{'file MB':>9}{'held MB':>9}{'held/file':>10}{'load peak/file':>15}"
          f"{'run peak MB':>12}{'step s':>8}{'vs bf16':>8}")  # fmt: skip
    for fmt, r in results.items():
        mb, size = 2**20, r["file_bytes"]
        print(f"{fmt:14}{size / mb:9.1f}{r['held_bytes'] / mb:9.1f}{r['held_bytes'] / size:10.2f}"
              f"{r['load_peak_rss'] / size:15.2f}{r['run_peak_rss'] / mb:12.1f}{r['step_s']:8.3f}"
              f"{r['step_s'] / base:8.2f}")  # fmt: skip
    real = real_shapes()
    print("\nheld once loaded, real shapes (GB), planned from the tensor shapes:")
    for name, per_format in real.items():
        print(f"  {name}: " + ", ".join(f"{fmt} {b / 1e9:.2f}" for fmt, b in per_format.items()))
    print(json.dumps({"measured": results, "real_shapes_bytes": real}))


def bfl(args) -> dict:
    from tiny_dit import bfl_state_dict

    return bfl_state_dict(klein_shaped_dit(args.heads, args.depth, args.single))


def argparse_suppress():
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
