"""How much a region's prompt reaches the picture outside its mask, with and without reference images.

    python benchmarks/regions_leak.py --seeds 8

On tiny random klein weights (the tests' DiT: 2 + 2 blocks, 32 wide) and random reference latents, a global
prompt and one region over the left half of 128 x 128 (8 x 8 tokens); region A's prompt is changed and
the final latents of the two runs compared, outside the region (the right 4 columns) and inside it. The
same with two references (128 x 128 and 96 x 128 pixels), for the plain klein model and the 9B-KV model
(the same weights run as the KV checkpoint), and, for contrast, with a rule the pack does not use: the
references also reading the region's text (every token reads the references, so the region's prompt would
reach the whole picture through them). Printed per model: the mean |change| outside and inside the region,
averaged over the seeds (each seed: new weights, prompts, noise and references), and outside / inside.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from unittest import mock

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "fixtures")]

from tiny_dit import bfl_state_dict, make_diffusers_dit  # noqa: E402

from flux2_core.configs import VARIANTS  # noqa: E402
from flux2_core.dit.attention import GroupedMask, KeyGroup  # noqa: E402
from flux2_core.dit.call import RegionalMask  # noqa: E402
from flux2_core.dit.files import DIT_SPEC  # noqa: E402
from flux2_core.dit.transformer import Flux2Model  # noqa: E402
from flux2_core.references import ReferenceLatents  # noqa: E402
from flux2_core.sampling import SampleRequest, SampleSettings, sample  # noqa: E402
from flux2_core.steering.regions import Region, RegionalPrompt  # noqa: E402
from flux2_core.weights.checkpoint import Checkpoint  # noqa: E402
from flux2_core.weights.loading import load_checkpoint  # noqa: E402

SIZE, SETTINGS = 128, SampleSettings(128, 128, 4, 1.0, 5)
with_references = RegionalMask.with_references


def reading_region_text(self, count, bias, cached):
    """The contrast: the references' own group also reads every region's text."""
    mask = with_references(self, count, bias, cached)
    if cached:
        return mask
    *groups, refs = mask.groups
    keys = torch.cat([torch.arange(self.length), refs.queries])
    bias = None if refs.bias is None else torch.cat([torch.zeros(self.length), refs.bias[-count:]])
    return GroupedMask(mask.length, (*groups, KeyGroup(refs.queries, keys, bias)))


def model(seed: int, variant: str) -> Flux2Model:
    weights = bfl_state_dict(make_diffusers_dit(seed=seed))
    net = load_checkpoint(DIT_SPEC, Checkpoint(Path("leak"), weights), torch.float32, "cpu").module
    return Flux2Model(net, VARIANTS[variant], "tiny klein")


def change(net: Flux2Model, seed: int, refs) -> tuple[float, float]:
    """(mean |change| outside region A, inside it) when A's prompt changes."""
    g = torch.Generator().manual_seed(seed)
    glob = torch.randn(1, 512, 24, generator=g)
    left = torch.zeros(SIZE, SIZE)
    left[:, : SIZE // 2] = 1
    out = []
    for _ in range(2):
        regions = RegionalPrompt(glob, (Region(torch.randn(1, 512, 24, generator=g), left),))
        out.append(sample(SampleRequest(net, glob, SETTINGS, references=refs, regions=regions)))
    diff = (out[0] - out[1]).abs()
    half = diff.shape[-1] // 2
    return diff[..., half:].mean().item(), diff[..., :half].mean().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    rows = {}
    for seed in range(args.seeds):
        g = torch.Generator().manual_seed(1000 + seed)
        refs = ReferenceLatents.from_latents([torch.randn(1, 128, 8, 8, generator=g),
                                              torch.randn(1, 128, 8, 6, generator=g)])  # fmt: skip
        for variant in ("distilled", "kv"):
            net = model(seed, variant)
            cases = {"without references": None, "with 2 references": refs}
            for name, given in cases.items():
                rows.setdefault((variant, name), []).append(change(net, seed, given))
            if variant == "distilled":
                with mock.patch.object(RegionalMask, "with_references", reading_region_text):
                    contrast = change(net, seed, refs)
                rows.setdefault((variant, "with 2 references, if they read region text"), []).append(contrast)
    print(f"{args.seeds} seeds, {SIZE}x{SIZE}, region A = the left half; mean |change| of the final latents")
    for (variant, name), values in rows.items():
        outside = statistics.mean(v[0] for v in values)
        inside = statistics.mean(v[1] for v in values)
        worst = max(v[0] / v[1] for v in values)
        line = (f"{variant:9s} {name:46s} outside {outside:.5f}  inside {inside:.5f}  outside / inside "
                f"{outside / inside:.3f} (worst seed {worst:.3f})")  # fmt: skip
        without = rows[(variant, "without references")]
        if values is not without:  # seed by seed against the same run without references
            below = sum(v[0] <= w[0] for v, w in zip(values, without))
            line += f"; outside <= without references on {below} of {len(values)} seeds"
        print(line)


if __name__ == "__main__":
    main()
