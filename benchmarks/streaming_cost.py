"""What block streaming costs: one DiT step with every weight resident against the same step streamed.

    python benchmarks/streaming_cost.py [--device cpu|cuda] [--dtype float32|bfloat16] [--size 512]
        [--heads 8] [--depth 2] [--resident-mb 0] [--repeats 5]

Builds a klein-shaped DiT (head dim 128) of reduced width and depth with random weights, loads it through
our loader, and times one forward (a sampling step: ``size``^2 output tokens and 512 text tokens) resident,
then with its blocks streamed from CPU memory (``--resident-mb``: the budget of weights kept on the device),
and resident again after streaming is turned off. Prints the median times, the ratio, the weights kept on the
device and, on CUDA, the peak device memory of each; checks that the outputs are identical.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import klein_shapes  # noqa: E402  (puts the repository and tests/ on the path)
import torch
from tiny_dit import write_bfl_file  # noqa: E402

from flux2_core.devices.streaming import disable_streaming, enable_streaming  # noqa: E402
from flux2_core.dit.files import load_transformer  # noqa: E402
from flux2_core.dit.rope import image_ids  # noqa: E402


def main() -> None:
    parser = klein_shapes.parser(__doc__.splitlines()[0], "output side in pixels")
    parser.add_argument("--resident-mb", type=float, default=0.0, help="weights kept on the device")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-pin", action="store_true", help="stream from ordinary (pageable) memory")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    hidden, grid = args.heads * 128, args.size // 16
    dit = klein_shapes.klein_shaped_dit(args.heads, args.depth, args.single)
    with tempfile.TemporaryDirectory() as tmp:
        net = load_transformer(
            write_bfl_file(dit, Path(tmp) / "bench.safetensors"), variant="distilled", dtype=dtype
        ).transformer
    del dit
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, grid * grid, 128, generator=g).to(device, dtype)
    ctx = torch.randn(1, 512, 3 * hidden, generator=g).to(device, dtype)
    t = torch.tensor([0.7], device=device)
    x_ids = image_ids(grid, grid)  # on the CPU, as the sampler passes them (the model adds the text's)
    cuda = device.type == "cuda"

    def timed() -> tuple[float, torch.Tensor, int]:
        times, out = [], None
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        for i in range(args.repeats + 1):  # the first run warms up
            start = time.perf_counter()
            with torch.inference_mode():
                out = net(x, x_ids, t, ctx)
            if cuda:
                torch.cuda.synchronize()
            if i:
                times.append(time.perf_counter() - start)
        return statistics.median(times), out, torch.cuda.max_memory_allocated() if cuda else 0

    weights = sum(p.nbytes for p in net.parameters()) + sum(b.nbytes for b in net.buffers())
    net.to(device)
    resident_s, expected, resident_peak = timed()
    streamer = enable_streaming(
        net, device, resident_bytes=int(args.resident_mb * 2**20), pin=False if args.no_pin else None
    )
    streamed_s, streamed, streamed_peak = timed()
    copies = []  # the copies alone: every streamed block's weights to the device once, as a step does
    for _ in range(args.repeats):
        start = time.perf_counter()
        for block in streamer._blocks.values():
            block.host.to(device, copy=True)
        if cuda:
            torch.cuda.synchronize()
        copies.append(time.perf_counter() - start)
    copy_s = statistics.median(copies)
    disable_streaming(net)
    again_s, again, _ = timed()
    assert torch.equal(streamed, expected) and torch.equal(again, expected)
    mib = 2**20
    print(
        f"klein-shaped DiT {hidden} wide, {args.depth}+{len(net.single_blocks)} blocks "
        f"({weights / mib:.0f} MiB of "
        f"weights), {args.size}^2 ({grid * grid} image + 512 text tokens), {args.dtype} on {device}"
    )
    print(f"  resident                 {resident_s * 1000:9.1f} ms per step")
    print(
        f"  streamed                 {streamed_s * 1000:9.1f} ms per step  ({len(streamer.streamed_blocks)} "
        f"of {len(streamer.streamed_blocks) + len(streamer.resident_blocks)} blocks, "
        f"{streamer.streamed_bytes / mib:.0f} MiB streamed, {streamer.resident_bytes / mib:.0f} MiB resident)"
    )
    print(
        f"  the copies alone         {copy_s * 1000:9.1f} ms per step  "
        f"({streamer.streamed_bytes / copy_s / 1e9:.1f} GB/s)"
    )
    print(f"  resident again           {again_s * 1000:9.1f} ms per step")
    print(f"  streaming costs {streamed_s / resident_s:.2f}x the resident step; outputs identical")
    if cuda:
        print(
            f"  peak device memory: resident {resident_peak / mib:.0f} MiB, "
            f"streamed {streamed_peak / mib:.0f} MiB ({streamed_peak / resident_peak:.2f}x)"
        )
    if args.json:
        figures = {
            "device": str(device), "gpu": torch.cuda.get_device_name(device) if cuda else None,
            "dtype": args.dtype, "hidden": hidden, "blocks": [args.depth, len(net.single_blocks)],
            "size": args.size, "weight_bytes": weights, "streamed_bytes": streamer.streamed_bytes,
            "resident_s": resident_s, "streamed_s": streamed_s, "copies_s": copy_s, "again_s": again_s,
            "ratio": streamed_s / resident_s, "resident_peak": resident_peak, "streamed_peak": streamed_peak,
            "identical": True,
        }  # fmt: skip
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
