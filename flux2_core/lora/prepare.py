"""Preparing a LoRA for one model: match its modules, refuse one made for another model, build the weight
patches, report what matched.

::

    lora = prepare_lora(read_lora("style.safetensors"), model.transformer, encoder.model, strength=0.8)
    print(lora.report.text())                      # what matched, what did not, which model it is for
    with applied(model.transformer, encoder.model, [lora, other]):
        ...                                        # sample; the LoRAs are removed again on exit

Every common trainer layout is understood (ai-toolkit/BFL, fal, kohya/musubi, diffusers/PEFT, DiffSynth,
OneTrainer, SimpleTuner; see ``keys``), with plain LoRA, LoKr, LoHa, DoRA and full ``.diff`` deltas.
A change is ``strength * scale * delta`` on the layer's weight (or on its rows of a fused q/k/v or final
layer), with scale = alpha/rank from the file's ``.alpha`` tensors, else from a diffusers/PEFT header
(``lora_adapter_metadata``: ``lora_alpha / r``, per-module patterns and rsLoRA honoured, since that is the
scale the LoRA was trained with; ComfyUI ignores the header and uses 1), else 1. Per-block strengths
multiply it further (``report``). Changes are applied when a layer computes, never written into the
stored weights (``apply``), so quantised models stay quantised and removing a LoRA restores the model
exactly; several LoRAs add up in the order given.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

from ..ops import WeightPatch
from .apply import unwrap
from .keys import DIT, TE, block_of
from .match import Matches, match_lora
from .patches import adapter_scale, build_patch, header_config, is_dora
from .read import LoraFile
from .refusals import not_a_lora, refuse
from .report import (
    BlockStrengths,
    LoraReport,
    describe_multipliers,
    group_names,
    model_name,
    parse_block_strengths,
    text_encoder_status,
)
from .shard import shard_patches

log = logging.getLogger(__name__)

_HEADER_COMPONENT = {DIT: "transformer", TE: "text_encoder"}


@dataclass(frozen=True)
class Lora:
    """A LoRA matched to one model: patches per component ("diffusion_model", "text_encoder") and layer."""

    name: str
    strength: float
    patches: dict[str, dict[str, list[WeightPatch]]]
    report: LoraReport


def prepare_lora(
    lora: LoraFile,
    transformer: nn.Module,
    text_encoder: nn.Module | None = None,
    strength: float = 1.0,
    block_strengths: BlockStrengths | str | None = None,
    name: str | None = None,
    device: torch.device | str | None = None,
) -> Lora:
    """Match ``lora`` to ``transformer`` (and ``text_encoder``) and build its patches (``device``: where its
    tensors are kept, default where they are). Raises Flux2Error for a LoRA made for another model."""
    transformer, text_encoder = unwrap(transformer), unwrap(text_encoder)
    name = name or lora.name
    if not isinstance(block_strengths, BlockStrengths):
        block_strengths = parse_block_strengths(block_strengths)
    found = match_lora(lora.tensors, transformer, text_encoder)
    if not found.adapters:
        raise not_a_lora(name, lora.tensors)
    refuse(name, found, transformer, text_encoder)
    patches, alpha_sources = _build_patches(found, lora.metadata, strength, block_strengths, device)
    if DIT in patches:  # on a tensor-parallel DiT: this process's slice of each change
        patches[DIT] = shard_patches(patches[DIT], transformer, name)
    report = _report(name, found, alpha_sources, block_strengths, transformer)
    log.info("%s", report.text())
    return Lora(name, strength, patches, report)


def _build_patches(found: Matches, metadata: dict, strength: float, strengths: BlockStrengths, device):
    """{component: {layer: [patch, ...]}} for every fit, and how often each alpha source gave the scale."""
    header = {d: header_config(metadata, c) for d, c in _HEADER_COMPONENT.items()}
    patches: dict[str, dict[str, list[WeightPatch]]] = {}
    alpha_sources: Counter = Counter()
    for fit in found.fits:
        dit = fit.alias.domain == DIT
        s = strength * (strengths.multiplier(*block_of(fit.target)) if dit else 1.0)
        parts = {
            p: found.tensors[k] if device is None else found.tensors[k].to(device)
            for p, k in found.adapters[fit.key].items()
        }
        scale, source = adapter_scale(fit.kind, fit.alias.local, parts, header[fit.alias.domain])
        alpha_sources[source] += 1
        if s != 0:
            patch = build_patch(fit.kind, parts, scale, s, fit.rows, fit.take)
            patches.setdefault(fit.alias.domain, {}).setdefault(fit.target, []).append(patch)
    return patches, alpha_sources


def _report(name: str, found: Matches, alpha_sources: Counter, strengths, transformer) -> LoraReport:
    fits = found.fits
    dit_fits = [f for f in fits if f.alias.domain == DIT]
    te_keys = {f.key for f in fits if f.alias.domain == TE}
    dora = {"DoRA"} if any(is_dora(found.adapters[f.key]) for f in fits) else set()
    families = Counter(f.alias.family for f in (dit_fits or fits))
    return LoraReport(
        name=name,
        family=" + ".join(f for f, _ in families.most_common(2)) or "unknown layout",
        kinds=sorted({f.kind for f in fits} | dora),
        model=model_name(transformer),
        total=len(found.adapters),
        matched=len({f.key for f in dit_fits}),
        layers=len({f.target for f in dit_fits}),
        text_encoder=text_encoder_status(te_keys, found.unused, found.te_off),
        text_encoder_matched=len(te_keys),
        alpha=", ".join(f"{src} ({n})" for src, n in alpha_sources.most_common()),
        unmatched=group_names(found.unmatched),
        unmatched_count=len(found.unmatched),
        unused_layers=group_names(found.unused),
        incomplete=group_names(found.incomplete),
        ignored_tensors=found.ignored,
        multipliers=describe_multipliers(
            strengths,
            len(getattr(transformer, "double_blocks", ())),
            len(getattr(transformer, "single_blocks", ())),
        ),
    )
