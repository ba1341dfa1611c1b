"""LoRAs for FLUX.2 [klein]: read a LoRA file, match it to the loaded DiT (and text encoder), apply it.

::

    lora = prepare_lora(read_lora("style.safetensors"), model.transformer, encoder.model, strength=0.8)
    print(lora.report.text())                      # what matched, what did not, which model it is for
    with applied(model.transformer, encoder.model, [lora, other]):
        ...                                        # sample; the LoRAs are removed again on exit

Every common trainer layout is understood (ai-toolkit/BFL, fal, kohya/musubi, diffusers/PEFT, DiffSynth,
OneTrainer, SimpleTuner; see ``lora_keys``), with plain LoRA, LoKr, LoHa, DoRA and full ``.diff`` deltas.
A change is ``strength * scale * delta`` on the layer's weight (or on its rows of a fused q/k/v or final
layer), with scale = alpha/rank from the file's ``.alpha`` tensors, else from a diffusers/PEFT header
(``lora_adapter_metadata``: ``lora_alpha / r``, per-module patterns and rsLoRA honoured, since that is the
scale the LoRA was trained with; ComfyUI ignores the header and uses 1), else 1. Per-block strengths
multiply it further (``lora_report``). Changes are applied when a layer computes, never written into the
stored weights, so quantised models stay quantised and removing a LoRA restores the model exactly; several
LoRAs add up in the order given.

A LoRA for another model is refused with a message saying which model it is for: klein 4B vs 9B (from its
shapes), FLUX.1, FLUX.2 [dev], or a file that is not a LoRA. Modules that match nothing are reported, not
refused.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..errors import Flux2Error
from ..ops import WeightPatch, linears
from ..weights.checkpoint import LazyTensors, check_suffix
from .keys import Alias, block_of, dit_aliases, group_tensors, text_encoder_aliases
from .patches import (
    adapter_kind,
    adapter_scale,
    as_matrix,
    build_patch,
    delta_shape,
    header_config,
    is_dora,
)
from .report import (
    BlockStrengths,
    LoraReport,
    describe_multipliers,
    group_names,
    model_name,
    not_a_lora,
    parse_block_strengths,
    text_encoder_status,
    too_deep,
    wrong_size,
    wrong_text_encoder,
)

log = logging.getLogger(__name__)

DIT, TE = "diffusion_model", "text_encoder"
_HEADER_COMPONENT = {DIT: "transformer", TE: "text_encoder"}
_ADAPTER_PARTS = {"up", "down", "mid", "diff"} | {
    f"lokr_{p}" for p in ("w1", "w2", "w1_a", "w1_b", "w2_a", "w2_b")
}
_ADAPTER_PARTS |= {f"hada_{p}" for p in ("w1_a", "w1_b", "w2_a", "w2_b")}
_CONV_PARTS = {"mid", "lokr_t2", "hada_t1", "hada_t2"}
_IGNORED_PARTS = {"diff_b", "set_weight", "up_bias"}


@dataclass
class LoraFile:
    """The tensors of a LoRA file and its safetensors header metadata."""

    name: str
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str] = field(default_factory=dict)
    path: Path | None = None


def read_lora(path: str | Path) -> LoraFile:
    """Read a ``.safetensors`` LoRA. Pickle files (.ckpt/.pt/.bin) are refused: loading them can run code."""
    path = Path(path)
    if not path.is_file():
        raise Flux2Error(f"{path} does not exist: check the path of the LoRA file")
    check_suffix(path, "LoRA", "a .safetensors file")
    lazy = LazyTensors([path])  # a truncated or corrupt file raises a Flux2Error naming it
    tensors = {key: lazy[key] for key in lazy}
    return LoraFile(path.name, tensors, dict(lazy.metadata), path)


@dataclass(frozen=True)
class Lora:
    """A LoRA matched to one model: patches per component ("diffusion_model", "text_encoder") and layer."""

    name: str
    strength: float
    patches: dict[str, dict[str, list[WeightPatch]]]
    report: LoraReport


@dataclass
class _Fit:
    key: str
    alias: Alias
    kind: str
    target: str
    rows: tuple[int, int] | None  # our rows, None: all
    take: tuple[tuple[int, int], ...] | None  # rows of the file's delta, None: all


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
    transformer, text_encoder = _unwrap(transformer), _unwrap(text_encoder)
    name = name or lora.name
    strengths = (
        block_strengths
        if isinstance(block_strengths, BlockStrengths)
        else parse_block_strengths(block_strengths)
    )
    modules, unknown = group_tensors(lora.tensors)
    adapters = {k: p for k, p in modules.items() if _ADAPTER_PARTS & p.keys()}
    if not adapters:
        raise not_a_lora(name, lora.tensors)
    tensors = {k: as_matrix(v) for k, v in lora.tensors.items()}
    aliases = {**dit_aliases(transformer), **text_encoder_aliases(text_encoder)}
    layers = {
        DIT: dict(linears(transformer)),
        TE: dict(linears(text_encoder)) if text_encoder is not None else {},
    }

    found: dict[str, list[str]] = {s: [] for s in ("unmatched", "flux1", "dev", "absent", "unused", "te_off")}
    incomplete, ignored, fits, mismatched = [], [f for f in unknown], [], []
    for key, parts in sorted(adapters.items()):
        alias, kind = aliases.get(key), adapter_kind(parts)
        ignored += [parts[p] for p in sorted(_IGNORED_PARTS & parts.keys())]
        if alias is None or alias.status != "ok":
            found["unmatched" if alias is None else alias.status].append(key)
            continue
        if kind is None:
            incomplete.append(key)
        elif alias.domain == TE and text_encoder is None:
            found["te_off"].append(key)
        elif _CONV_PARTS & parts.keys():
            ignored.append(f"{key} (convolution LoRA parts)")
        else:
            placed, mismatch = _place(
                key, alias, kind, delta_shape(kind, parts, tensors), layers[alias.domain]
            )
            fits += placed
            if mismatch:
                mismatched.append((alias.domain, *mismatch))

    if found["flux1"]:
        raise Flux2Error(
            f"{name} is a FLUX.1 LoRA (it has FLUX.1-only layers such as {found['flux1'][0]}): FLUX.1 LoRAs "
            "do not work on FLUX.2 [klein]; use a LoRA trained for FLUX.2 [klein]"
        )
    if found["dev"]:
        raise Flux2Error(
            f"{name} is a FLUX.2 [dev] LoRA (it has the guidance embedder, {found['dev'][0]}, which klein "
            "lacks): use a LoRA trained for FLUX.2 [klein]"
        )
    if mismatched:
        te_mismatched = [m[1:] for m in mismatched if m[0] == TE]
        if len(te_mismatched) < len(mismatched):
            raise wrong_size(name, [m[1:] for m in mismatched if m[0] == DIT], transformer)
        raise wrong_text_encoder(name, te_mismatched, text_encoder)
    if found["absent"]:
        raise too_deep(name, found["absent"], aliases, transformer)
    if not fits and not found["te_off"] and not found["unused"]:
        if incomplete:
            raise Flux2Error(
                f"{name} is incomplete: every LoRA module lacks one of its halves (e.g. {incomplete[0]} has "
                "no up/B or no down/A matrix); the file is damaged, download it again"
            )
        raise Flux2Error(
            f"none of the {len(adapters)} LoRA modules of {name} (e.g. {sorted(adapters)[0]}) matches a "
            "FLUX.2 [klein] layer: it is a LoRA for another model; use a LoRA trained for FLUX.2 [klein]"
        )

    header = {d: header_config(lora.metadata, c) for d, c in _HEADER_COMPONENT.items()}
    patches: dict[str, dict[str, list[WeightPatch]]] = {}
    alpha_sources: Counter = Counter()
    for fit in fits:
        group = block_of(fit.target) if fit.alias.domain == DIT else ("text encoder", None, None)
        s = strength * (strengths.multiplier(*group) if fit.alias.domain == DIT else 1.0)
        parts = {
            p: tensors[k] if device is None else tensors[k].to(device) for p, k in adapters[fit.key].items()
        }
        scale, source = adapter_scale(fit.kind, fit.alias.local, parts, header[fit.alias.domain])
        alpha_sources[source] += 1
        if s != 0:
            patch = build_patch(fit.kind, parts, scale, s, fit.rows, fit.take)
            patches.setdefault(fit.alias.domain, {}).setdefault(fit.target, []).append(patch)

    dit_fits = [f for f in fits if f.alias.domain == DIT]
    te_keys = {f.key for f in fits if f.alias.domain == TE}
    kinds = sorted(
        {f.kind for f in fits} | ({"DoRA"} if any(is_dora(adapters[f.key]) for f in fits) else set())
    )
    families = Counter(f.alias.family for f in (dit_fits or fits))
    report = LoraReport(
        name=name,
        family=" + ".join(f for f, _ in families.most_common(2)) or "unknown layout",
        kinds=kinds,
        model=model_name(transformer),
        total=len(adapters),
        matched=len({f.key for f in dit_fits}),
        layers=len({f.target for f in dit_fits}),
        text_encoder=text_encoder_status(te_keys, found),
        text_encoder_matched=len(te_keys),
        alpha=", ".join(f"{src} ({n})" for src, n in alpha_sources.most_common()),
        unmatched=group_names(found["unmatched"]),
        unused_layers=group_names(found["unused"]),
        incomplete=group_names(incomplete),
        ignored_tensors=ignored,
        multipliers=describe_multipliers(
            strengths,
            len(getattr(transformer, "double_blocks", ())),
            len(getattr(transformer, "single_blocks", ())),
        ),
    )
    log.info("%s", report.text())
    return Lora(name, strength, patches, report)


def attach(module: nn.Module, patches: dict[str, list[WeightPatch]], owner: str) -> None:
    """Add ``patches`` (layer name -> patches) to ``module``'s layers under ``owner`` (all or none)."""
    module = _unwrap(module)
    layers = dict(linears(module))
    try:
        for target, items in patches.items():
            if target not in layers:
                raise Flux2Error(
                    f"the LoRA patches {target}, which this model does not have: prepare the LoRA for the "
                    "model it is applied to"
                )
            for i, patch in enumerate(items):
                try:
                    layers[target].add_patch(f"{owner}/{i}", patch)
                except ValueError as e:
                    raise Flux2Error(
                        f"{e}: the LoRA was prepared for another model; prepare it again"
                    ) from None
    except BaseException:
        detach(module, owner)
        raise


def detach(module: nn.Module, owner: str) -> None:
    """Remove every patch ``owner`` added to ``module``; the layers compute exactly as before."""
    for _, layer in linears(_unwrap(module)):
        layer.remove_patches(owner)


_OWNERS = itertools.count()


@contextlib.contextmanager
def applied(transformer: nn.Module, text_encoder: nn.Module | None, loras: Sequence[Lora]) -> Iterator[None]:
    """Apply ``loras`` in order for the body of the ``with``, then remove them, whatever the body raises."""
    if text_encoder is None:
        for lora in loras:
            if lora.patches.get(TE):
                log.warning("%s: text encoder patches not applied (no text encoder given)", lora.name)
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(transformer, DIT, loras))
        if text_encoder is not None:
            stack.enter_context(patched(text_encoder, TE, loras))
        yield


@contextlib.contextmanager
def patched(module: nn.Module, domain: str, loras: Sequence[Lora]) -> Iterator[None]:
    """Apply only the ``domain`` part ("diffusion_model" or "text_encoder") of ``loras`` to ``module`` for the
    body of the ``with``; nothing to apply costs nothing."""
    parts = [lora for lora in loras if lora.patches.get(domain)]
    if not parts:
        yield
        return
    module = _unwrap(module)
    owners = []
    try:
        for lora in parts:
            owners.append(f"lora{next(_OWNERS)}")
            attach(module, lora.patches[domain], owners[-1])
        yield
    finally:
        for owner in reversed(owners):
            detach(module, owner)


def _unwrap(obj):
    """Our module inside a Flux2Model (``.transformer``) or a TextEncoder (``.model``), or ``obj`` itself."""
    if obj is None or isinstance(obj, nn.Module):
        return obj
    for attr in ("transformer", "model"):
        if isinstance(inner := getattr(obj, attr, None), nn.Module):
            return inner
    raise TypeError(f"expected a torch module, a Flux2Model or a TextEncoder, got {type(obj).__name__}")


def _place(key: str, alias: Alias, kind: str, shape, layers) -> tuple[list[_Fit], tuple | None]:
    """The patches' row spans on our layers, and (key, target, expected, got) if the shapes do not fit."""
    rows, cols = shape
    by_target: dict[str, list] = {}
    for target, into, take in alias.placements:
        by_target.setdefault(target, []).append((into, take))
    fits = []
    for target, places in by_target.items():
        layer = layers[target]
        spans = []
        for into, take in places:
            dst = into.rows(layer.out_features) if into else (0, layer.out_features)
            src = take.rows(rows) if take else (0, rows)
            if src[1] != dst[1] or cols != layer.in_features:
                return [], (key, target, (dst[1], layer.in_features), (src[1] if rows > 0 else rows, cols))
            spans.append((dst, src))
        spans.sort()
        start, size = spans[0][0][0], sum(d[1] for d, _ in spans)
        if any(a[0] + a[1] != b[0] for (a, _), (b, _) in zip(spans, spans[1:])):
            raise AssertionError(f"non-contiguous placement for {key}")  # the key map never makes one
        takes = tuple(s for _, s in spans)
        fits.append(
            _Fit(
                key, alias, kind, target,
                None if (start, size) == (0, layer.out_features) else (start, size),
                None if takes == ((0, rows),) else takes,
            )
        )  # fmt: skip
    return fits, None
