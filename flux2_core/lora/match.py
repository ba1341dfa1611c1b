"""Matching a LoRA file's modules to a model's layers.

Each adapter module of the file is named in ours by ``keys`` (any trainer layout) and placed on the rows of
the layer it changes (one of q/k/v in a fused ``qkv``, a half of the final layer). What does not fit is kept
by kind, for ``refusals`` (a LoRA for another model) and for the report (what was left out, and why).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import nn

from ..ops import linears
from .keys import DIT, TE, Alias, dit_aliases, group_tensors, text_encoder_aliases
from .patches import adapter_kind, as_matrix, delta_shape
from .shard import whole_layers

ADAPTER_PARTS = {"up", "down", "mid", "diff"} | {
    f"lokr_{p}" for p in ("w1", "w2", "w1_a", "w1_b", "w2_a", "w2_b")
}
ADAPTER_PARTS |= {f"hada_{p}" for p in ("w1_a", "w1_b", "w2_a", "w2_b")}
CONV_PARTS = {"mid", "lokr_t2", "hada_t1", "hada_t2"}
IGNORED_PARTS = {"diff_b", "set_weight", "up_bias"}


@dataclass
class Fit:
    """One adapter module placed on one of our layers."""

    key: str
    alias: Alias
    kind: str
    target: str
    rows: tuple[int, int] | None  # our rows, None: all
    take: tuple[tuple[int, int], ...] | None  # rows of the file's delta, None: all


@dataclass
class Matches:
    """Where every adapter module of a file went. The lists other than ``fits`` hold module keys; their
    names are the ``Alias.status`` values of ``keys`` (``absent``, ``unused``, ``flux1``, ``dev``) and the
    reasons found here."""

    adapters: dict[str, dict[str, str]]  # module key -> part -> tensor key
    tensors: dict[str, object]  # tensor key -> matrix
    aliases: dict[str, Alias]
    fits: list[Fit] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)  # no layer of ours has this name
    flux1: list[str] = field(default_factory=list)  # a layer only FLUX.1 has
    dev: list[str] = field(default_factory=list)  # a layer only FLUX.2 [dev] has
    absent: list[str] = field(default_factory=list)  # a block this model lacks
    unused: list[str] = field(default_factory=list)  # a text-encoder layer that never runs
    te_off: list[str] = field(default_factory=list)  # text-encoder keys, no text encoder connected
    incomplete: list[str] = field(default_factory=list)  # one half (up/down) missing
    ignored: list[str] = field(default_factory=list)  # tensors of no known kind, unsupported parts
    mismatched: list[tuple] = field(default_factory=list)  # (domain, key, target, expected, got)


def match_lora(tensors: dict, transformer: nn.Module, text_encoder: nn.Module | None) -> Matches:
    """Place every adapter module of ``tensors`` on ``transformer`` (and ``text_encoder``)."""
    modules, unknown = group_tensors(tensors)
    adapters = {k: p for k, p in modules.items() if ADAPTER_PARTS & p.keys()}
    if not adapters:  # not a LoRA: nothing to place
        return Matches(adapters, {}, {}, ignored=list(unknown))
    found = Matches(
        adapters,
        {k: as_matrix(v) for k, v in tensors.items()},
        {**dit_aliases(transformer), **text_encoder_aliases(text_encoder)},
        ignored=list(unknown),
    )
    layers = {
        DIT: whole_layers(transformer),  # a tensor-parallel process's slices matched as the whole model
        TE: dict(linears(text_encoder)) if text_encoder is not None else {},
    }
    for key, parts in sorted(adapters.items()):
        alias, kind = found.aliases.get(key), adapter_kind(parts)
        found.ignored += [parts[p] for p in sorted(IGNORED_PARTS & parts.keys())]
        if alias is None:
            found.unmatched.append(key)
        elif alias.status != "ok":
            getattr(found, alias.status).append(key)
        elif kind is None:
            found.incomplete.append(key)
        elif alias.domain == TE and text_encoder is None:
            found.te_off.append(key)
        elif CONV_PARTS & parts.keys():
            found.ignored.append(f"{key} (convolution LoRA parts)")
        else:
            shape = delta_shape(kind, parts, found.tensors)
            placed, mismatch = _place(key, alias, kind, shape, layers[alias.domain])
            found.fits += placed
            if mismatch:
                found.mismatched.append((alias.domain, *mismatch))
    return found


def _place(key: str, alias: Alias, kind: str, shape, layers) -> tuple[list[Fit], tuple | None]:
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
            Fit(
                key, alias, kind, target,
                None if (start, size) == (0, layer.out_features) else (start, size),
                None if takes == ((0, rows),) else takes,
            )
        )  # fmt: skip
    return fits, None
