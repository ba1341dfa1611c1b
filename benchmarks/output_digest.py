"""Every sampling path's output on fixed random weights, saved or compared bit for bit.

A refactor of the model code must leave the float32 outputs unchanged: run this before the change with
``--save before.pt`` and after it with ``--compare before.pt`` (it uses only the sampling API, so both trees
run it). Cases: text-to-image, edit with references, per-reference strengths, the 9B-KV model, regional
prompts, base CFG with a negative prompt, FLUX.2 [dev] with its embedded guidance and the Fun ControlNet,
position extrapolation, the step cache, img2img and inpaint, batches, and one FLUX.1 Fill run; at the suite's
medium width (8 heads of 128) and 2 + 8 blocks unless ``--heads`` / ``--depth`` say otherwise.

    python benchmarks/output_digest.py --save /tmp/before.pt
    python benchmarks/output_digest.py --compare /tmp/before.pt      # exits 1 on any difference
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

import torch

from flux2_core import (
    VARIANTS,
    AppliedControl,
    Flux2Model,
    PositionExtrapolation,
    ReferenceLatents,
    ReferenceStrength,
    Region,
    RegionalPrompt,
    SampleRequest,
    SampleSettings,
    sample,
)
from flux2_core.configs import Flux2Config
from flux2_core.dit.control import ControlConfig, Flux2ControlNet
from flux2_core.dit.rope import reference_ids
from flux2_core.dit.transformer import Flux2Transformer
from flux2_core.flux1.config import Flux1Config
from flux2_core.flux1.encoders import FillConditioning
from flux2_core.flux1.fill import FillInputs
from flux2_core.flux1.sampling import FillSettings, sample_fill
from flux2_core.flux1.transformer import Flux1FillModel, Flux1Transformer

DTYPE = torch.float32


def random_(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Random weights of about unit gain (norm scales near 1), in ``DTYPE``."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            scale = 0.5 / p.shape[-1] ** 0.5 if p.ndim > 1 else 0.1
            p.copy_(torch.randn(p.shape, generator=g) * scale + (p.ndim == 1))
    return module.to(DTYPE).eval()


def cases(heads: int, depth: int, single: int) -> dict:
    hidden, text = heads * 128, 3 * 64
    g = torch.Generator().manual_seed(1)
    rnd = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    klein = random_(Flux2Transformer(Flux2Config(hidden, heads, depth, single, text)), 2)
    dev = random_(Flux2Transformer(Flux2Config(hidden, heads, depth, single, text, guidance_embed=True)), 3)
    models = {v: Flux2Model(klein, VARIANTS[v], "digest") for v in ("distilled", "base", "kv")}
    dev_model = Flux2Model(dev, VARIANTS["dev"], "digest dev")
    pos, neg = rnd(1, 12, text), rnd(1, 12, text)
    refs = ReferenceLatents(rnd(1, 24, 128), reference_ids([(4, 4), (2, 4)]), [(4, 4), (2, 4)])
    strong = replace(refs, strengths=(ReferenceStrength(0.5), ReferenceStrength(1.0, 0.0, 0.5)))
    s = SampleSettings(96, 64, 3, 1.0, 7, 1)
    mask = torch.zeros(64, 96)
    mask[:, :48] = 1
    regions = RegionalPrompt(pos, (Region(rnd(1, 5, text), mask), Region(rnd(1, 7, text), 1 - mask, 0.7)))
    control_net = random_(Flux2ControlNet(ControlConfig(hidden, heads, int(hidden * 3), 1)), 4)
    control = AppliedControl(control_net, rnd(1, 24, 260), 0.8, 0.0, 0.7)
    start = rnd(1, 128, 4, 6)
    inpaint = torch.zeros(1, 24, 1)
    inpaint[:, :12] = 1
    out = {
        "t2i": SampleRequest(models["distilled"], pos, s),
        "t2i batch 2": SampleRequest(models["distilled"], pos, replace(s, batch_size=2)),
        "edit": SampleRequest(models["distilled"], pos, s, references=refs),
        "edit strengths": SampleRequest(models["distilled"], pos, s, references=strong),
        "kv": SampleRequest(models["kv"], pos, s, references=refs),
        "kv strengths": SampleRequest(models["kv"], pos, s, references=strong),
        "base cfg": SampleRequest(
            models["base"], pos, replace(s, guidance=4.0), negative=neg, references=refs
        ),
        "regions": SampleRequest(models["distilled"], pos, s, regions=regions),
        "regions cfg": SampleRequest(
            models["base"], pos, replace(s, guidance=3.0), negative=neg, regions=regions
        ),
        "step cache": SampleRequest(models["distilled"], pos, replace(s, steps=6), step_cache=5.0),
        "img2img": SampleRequest(models["distilled"], pos, s, start=start, strength=0.6),
        "inpaint": SampleRequest(models["distilled"], pos, s, start=start, mask=inpaint),
        "dype": SampleRequest(
            models["distilled"], pos, s, references=refs, extrapolation=PositionExtrapolation(256)
        ),
        "dev": SampleRequest(dev_model, pos, replace(s, guidance=3.5), references=refs),
        "dev control": SampleRequest(dev_model, pos, replace(s, guidance=3.5), control=control),
    }
    return out


def fill_case():
    g = torch.Generator().manual_seed(5)
    config = Flux1Config(256, 2, 1, 2, context_in_dim=64, vec_in_dim=32)
    model = Flux1FillModel(random_(Flux1Transformer(config), 6), "digest fill")
    cond = FillConditioning(torch.randn(1, 9, 64, generator=g), torch.randn(1, 32, generator=g))
    fill = FillInputs(torch.randn(1, 24, 320, generator=g), (4, 6))
    return lambda: sample_fill(model, cond, fill, FillSettings(3, steps=3), step_cache=0.0)


def run(args) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    outs = {}
    for name, request in cases(args.heads, args.depth, args.single).items():
        outs[name] = sample(request)
    outs["flux1 fill"] = fill_case()()
    return outs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--save")
    p.add_argument("--compare")
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--single", type=int, default=4)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = p.parse_args()
    global DTYPE
    DTYPE = getattr(torch, args.dtype)
    outs = run(args)
    if args.save:
        torch.save(outs, args.save)
        print(f"saved {len(outs)} outputs to {args.save}")
    if args.compare:
        before = torch.load(args.compare)
        bad = 0
        for name, out in outs.items():
            same = torch.equal(out, before[name])
            diff = (
                (out - before[name]).abs().max().item() if out.shape == before[name].shape else float("nan")
            )
            print(f"{name:16s} {'identical' if same else f'DIFFERS (max abs {diff:.3g})'}")
            bad += not same
        print(f"{len(outs) - bad} identical, {bad} different")
        return 1 if bad else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
