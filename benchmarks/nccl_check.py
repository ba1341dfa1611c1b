"""Tensor and sequence parallelism over two processes against one process, on the same random weights.

    python benchmarks/nccl_check.py [--device cuda|cpu] [--json out.json]

Writes a small klein-shaped DiT file (head dim 128, 4 heads so that two processes split it), samples it in
this process, then under ``torch.distributed.run`` with two processes in each mode: NCCL with one GPU per
process (``--device cuda``: needs two GPUs; with fewer it reports why it did not run) or gloo on the CPU.
Rank 0 alone makes the text conditioning and broadcasts it, as the command line does. The latents of every
mode must match the one-process run (float32: max difference below 1e-4); exits 1 when they do not.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import klein_shapes  # noqa: F401  (puts the repository and tests/ on the path)
import torch

from flux2_core.dit.files import load_transformer  # noqa: E402
from flux2_core.sampling import SampleRequest, SampleSettings, sample  # noqa: E402

WORLD = 2
SETTINGS = SampleSettings(128, 128, 3, 1.0, seed=5)


def conditioning(config) -> torch.Tensor:
    return torch.randn(1, 32, config.context_in_dim, generator=torch.Generator().manual_seed(3))


def worker(folder: Path, mode: str, device: str) -> None:
    """One process of the group: its part of the DiT, rank 0's conditioning, the same sampling run."""
    from flux2_core.devices.parallel import broadcast_conditioning, close_distributed, init_distributed
    from flux2_core.devices.parallel_load import load_transformer_parallel

    dist = init_distributed(device)
    model = load_transformer_parallel(folder / "dit.safetensors", mode, "distilled", torch.float32, "cpu")
    model.transformer.to(dist.device)
    ctx = conditioning(model.config) if dist.is_main else None
    latents = sample(SampleRequest(model, broadcast_conditioning(ctx), SETTINGS))
    if dist.is_main:
        torch.save(latents.cpu(), folder / f"{mode}.pt")
    close_distributed()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.mode, args.device)
        return
    report = {"device": args.device, "world": WORLD, "backend": "nccl" if args.device == "cuda" else "gloo"}
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    if args.device == "cuda" and gpus < WORLD:
        report["skipped"] = f"{gpus} GPU(s): NCCL takes one GPU per process, {WORLD} processes need {WORLD}"
        print(report["skipped"])
        write(args.json, report)
        return
    from tiny_dit import make_diffusers_dit, write_bfl_file

    failed = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        dit = make_diffusers_dit(seed=0, num_attention_heads=4, attention_head_dim=128,
                                 joint_attention_dim=256, axes_dims_rope=(32, 32, 32, 32))  # fmt: skip
        model = load_transformer(write_bfl_file(dit, folder / "dit.safetensors"), "distilled", torch.float32)
        model.transformer.to(args.device)
        expected = sample(SampleRequest(model, conditioning(model.config).to(args.device), SETTINGS))
        del model, dit
        for mode in ("tensor", "sequence"):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD),
                   "--master-port", str(free_port()), __file__, "--worker", tmp, "--mode", mode,
                   "--device", args.device]  # fmt: skip
            run = subprocess.run(
                cmd, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"}
            )
            out = folder / f"{mode}.pt"
            if run.returncode or not out.exists():
                report[mode] = {"error": (run.stderr or run.stdout)[-2000:]}
                failed.append(mode)
                continue
            diff = (torch.load(out) - expected.cpu()).abs().max().item()
            report[mode] = {"max_abs_diff_vs_one_process": diff}
            print(f"{mode}: {WORLD} processes ({report['backend']}) against one: max difference {diff:.2e}")
            if diff > 1e-4:
                failed.append(mode)
    write(args.json, report | {"ok": not failed})
    if failed:
        sys.exit(f"parallel modes failed or differ from one process: {', '.join(failed)}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write(path: Path | None, report: dict) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
