"""What the benchmarks share: the command-line options of a klein-shaped DiT, the random DiT itself, and
timing a call."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "fixtures")]
from tiny_dit import make_diffusers_dit  # noqa: E402


def parser(description: str, size_help: str) -> argparse.ArgumentParser:
    """Device, dtype, image size, width (heads x 128) and depth of the benchmarked DiT."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--size", type=int, default=512, help=size_help)
    p.add_argument("--heads", type=int, default=8, help="hidden size = heads x 128")
    p.add_argument("--depth", type=int, default=2, help="double blocks")
    p.add_argument("--single", type=int, default=None, help="single blocks (default: 4x the double blocks)")
    return p


def klein_shaped_dit(heads: int, depth: int, single: int | None = None, guidance: bool = False):
    """A diffusers FLUX.2 DiT with klein's head size (128) and RoPE axes, of reduced width and depth; with
    ``guidance`` the guidance embedder of FLUX.2 [dev] (48 heads, 8 + 48 blocks: the real dev shape)."""
    return make_diffusers_dit(
        seed=0,
        guidance_embeds=guidance,
        num_layers=depth,
        num_single_layers=4 * depth if single is None else single,
        attention_head_dim=128,
        num_attention_heads=heads,
        joint_attention_dim=3 * heads * 128,
        axes_dims_rope=(32, 32, 32, 32),
    )


def our_dit(args, dtype, device):
    """Our DiT of the shape ``args`` ask for (``parser``), random weights, loaded as a file would be."""
    from flux2_core.dit.files import DIT_SPEC
    from flux2_core.weights.checkpoint import Checkpoint
    from flux2_core.weights.loading import load_checkpoint

    reference = klein_shaped_dit(args.heads, args.depth, args.single)
    return load_checkpoint(DIT_SPEC, Checkpoint(Path("bench"), reference.state_dict()), dtype, device).module


def in_turn(calls: dict, repeats: int, device: torch.device, clock=time.perf_counter) -> tuple[dict, dict]:
    """Each zero-argument call once to warm up, then ``repeats`` rounds, one call of each in turn (so a
    machine's drift hits them alike), waiting for the device around each, read on ``clock`` (wall time;
    ``time.process_time``: the process's CPU time, which a machine shared or paused meanwhile does not
    inflate). Returns ({name: median seconds}, {name: [seconds]})."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    times = {name: [] for name in calls}
    for call in calls.values():
        call()
    for _ in range(repeats):
        for name, call in calls.items():
            sync()
            begin = clock()
            call()
            sync()
            times[name].append(clock() - begin)
    return {name: statistics.median(v) for name, v in times.items()}, times


def timed(fn, repeats: int, device: torch.device | str = "cpu", stat=statistics.median) -> float:
    """``stat`` (the median, or ``min``) of ``repeats`` timed calls of ``fn`` after one warm-up call, the
    device synchronised around each on a GPU."""
    device = torch.device(device)
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return stat(times)
