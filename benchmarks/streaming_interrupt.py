"""A streamed sampling run stopped in the middle, then a clean run: nothing is left behind, nothing changes.

    python benchmarks/streaming_interrupt.py [--device cuda] [--dtype bfloat16] [--heads 24] [--depth 2]
        [--single 8] [--size 1024] [--steps 4] [--json out.json]

Loads a klein-shaped DiT with random weights through our loader and streams every block to the device. A
first run is stopped at a block in the middle of its second step (the way ComfyUI's cancel stops one: the
interrupt hook raises before a block), and a second run is asked for an impossible amount of memory at the
same point (an out-of-memory error raised from the same hook). After each: the streamed copies on the
device (``device_bytes``) and the device memory allocated must be back where they were before the run. A
clean run must then give exactly the latents of a run with every weight resident. Writes what it found,
and exits 1 when something was left behind or the latents differ.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import klein_shapes  # noqa: F401  (puts the repository and tests/ on the path)
import torch
from tiny_dit import write_bfl_file  # noqa: E402

from flux2_core import OutOfMemory, SampleRequest, SampleSettings, sample  # noqa: E402
from flux2_core.devices.streaming import disable_streaming, enable_streaming  # noqa: E402
from flux2_core.dit.files import load_transformer  # noqa: E402


class Stop(Exception):
    """What the interrupt hook raises (ComfyUI raises its own interruption the same way)."""


def main() -> None:
    parser = klein_shapes.parser(__doc__.splitlines()[0], "output side in pixels")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    hidden = args.heads * 128
    dit = klein_shapes.klein_shaped_dit(args.heads, args.depth, args.single)
    with tempfile.TemporaryDirectory() as tmp:
        model = load_transformer(write_bfl_file(dit, Path(tmp) / "bench.safetensors"), "distilled", dtype)
    del dit
    blocks = len(model.transformer.blocks())
    ctx = torch.randn(1, 64, 3 * hidden, generator=torch.Generator().manual_seed(1)).to(dtype)
    settings = SampleSettings(args.size, args.size, args.steps, 1.0, seed=7)
    cuda = device.type == "cuda"

    def allocated() -> int:
        if cuda:
            torch.cuda.synchronize(device)
            return torch.cuda.memory_allocated(device)
        return 0

    model.transformer.to(device)
    expected = sample(SampleRequest(model, ctx.to(device), settings))  # every weight resident
    model.transformer.to("cpu")
    streamer = enable_streaming(model.transformer, device)
    ctx = ctx.to(device)
    report = {"device": str(device), "gpu": torch.cuda.get_device_name(device) if cuda else None,
              "dtype": args.dtype, "hidden": hidden, "blocks": blocks, "size": args.size,
              "streamed_blocks": len(streamer.streamed_blocks), "runs": {}}  # fmt: skip
    for name, error in (("interrupted", Stop("stopped")), ("out of memory", OutOfMemory("no memory"))):
        before, calls = allocated(), [0]

        def hook(error=error, calls=calls):
            calls[0] += 1
            if calls[0] == blocks + blocks // 2:  # the second step, halfway through its blocks
                raise error

        try:
            sample(SampleRequest(model, ctx, settings, interrupt=hook))
            stopped = False
        except (Stop, OutOfMemory):
            stopped = True
        left = {
            "stopped": stopped,
            "device_bytes": streamer.device_bytes,
            "allocated_above": allocated() - before,
        }
        report["runs"][name] = left
        print(f"{name}: stopped {stopped}, streamed copies left {left['device_bytes']} bytes, allocated "
              f"{left['allocated_above'] / 2**20:+.1f} MiB against before the run", flush=True)  # fmt: skip
    clean = sample(SampleRequest(model, ctx, settings))
    disable_streaming(model.transformer)
    report["clean_run_identical"] = bool(torch.equal(clean, expected))
    print(f"clean run after them: identical to the resident run: {report['clean_run_identical']}")
    ok = report["clean_run_identical"] and all(
        r["stopped"] and r["device_bytes"] == 0 and r["allocated_above"] <= 0 for r in report["runs"].values()
    )
    report["ok"] = ok
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=1))
    if not ok:
        sys.exit("a stopped streamed run left memory behind or changed the next run's result")


if __name__ == "__main__":
    main()
