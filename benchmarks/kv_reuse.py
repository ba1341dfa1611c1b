"""Time saved by keeping the 9B-KV references' K/V across runs, against the cold path, in one run.

    python benchmarks/kv_reuse.py [--device cpu|cuda] [--dtype float32|bfloat16] [--size 512] [--refs 2]

Builds a klein-shaped DiT (head dim 128) of reduced depth with random weights, loads it through our loader as
the KV variant, and times one whole 4-step sampling run the way the sampler node runs it: cold (the store
is empty, so the references' K/V are computed first) and warm (a new prompt and seed, the K/V from the
store). Prints the median time of each, the saving and the ratio, and checks that warm and cold outputs of the
same prompt and seed are identical.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import klein_shapes  # noqa: E402  (puts the repository and tests/ on the path)
import torch
from tiny_dit import write_bfl_file  # noqa: E402

from flux2_core import (  # noqa: E402
    ReferenceLatents,
    RefKVStore,
    SampleRequest,
    SampleSettings,
    encode_reference_kv,
    sample,
)
from flux2_core.dit.files import load_transformer  # noqa: E402


def main() -> None:
    parser = klein_shapes.parser(__doc__.splitlines()[0], "output and reference side in pixels")
    parser.add_argument("--refs", type=int, default=2, help="references of the same size")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    hidden = args.heads * 128
    dit = klein_shapes.klein_shaped_dit(args.heads, args.depth, args.single)
    with tempfile.TemporaryDirectory() as tmp:
        model = load_transformer(
            write_bfl_file(dit, Path(tmp) / "bench.safetensors"), variant="kv", dtype=dtype, device=device
        )
    grid = args.size // 16
    g = torch.Generator().manual_seed(0)
    refs = ReferenceLatents.from_latents(
        [torch.randn(1, 128, grid, grid, generator=g) for _ in range(args.refs)]
    )
    prompts = [torch.randn(1, 512, 3 * hidden, generator=g) for _ in range(2)]
    settings = [SampleSettings(args.size, args.size, 4, 1.0, seed) for seed in (1, 2)]

    def run(store: RefKVStore, k: int) -> torch.Tensor:
        cache, _ = store.get(model, refs, lambda: encode_reference_kv(model, refs))
        return sample(SampleRequest(model, prompts[k], settings[k], references=refs, kv_cache=cache))

    cold_times, warm_times = [], []
    for _ in range(args.repeats):
        store = RefKVStore(max_bytes=2**40)
        start = time.perf_counter()
        cold = run(store, 0)
        cold_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        run(store, 1)  # another prompt and seed, the references' K/V from the store
        warm_times.append(time.perf_counter() - start)
        assert store.hits == 1 and torch.equal(run(store, 0), cold)
    cold_s, warm_s = statistics.median(cold_times), statistics.median(warm_times)
    tokens = args.refs * grid * grid
    print(
        f"9B-KV-shaped DiT {hidden} wide, {args.depth}+{4 * args.depth} blocks, {args.size}^2 output, "
        f"{args.refs} references ({tokens} tokens), 4 steps, {args.dtype} on {device}"
    )
    print(f"  cold run (K/V computed)   {cold_s:8.2f} s")
    print(f"  warm run (K/V reused)     {warm_s:8.2f} s")
    print(
        f"  saved {cold_s - warm_s:.2f} s per run ({cold_s / warm_s:.2f}x); warm and cold outputs identical"
    )


if __name__ == "__main__":
    main()
