"""Per-block LoRA strengths and the report of what a LoRA file matched.

Block strengths scale a LoRA's change per part of the DiT. The text is a comma-separated list of
``GROUP[.N|.N-M]=VALUE`` entries, later entries overriding earlier ones, e.g.
``double=1.0, single.0-11=0.5, double.img.3=0, other=0``. Groups: ``double`` (both sides of the double
blocks), ``double.img``, ``double.txt``, ``single``, ``other`` (input layers, time embedding, modulation,
final layer) and ``all``. A block without an entry keeps 1. The text encoder takes the LoRA strength only.

The report says which trainer layout the file has, which model its shapes are for, how many of its modules
were applied, and which were not (grouped by block kind, not listed per tensor), so a LoRA that silently does
nothing is visible in the node output and on the command line.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

from ..configs import describe
from ..errors import Flux2Error
from ..ops import linears
from .keys import HIDDEN_NAMES, KLEIN_4B_BLOCKS, TEXT_WIDTH_NAMES

GROUPS = ("double", "double.img", "double.txt", "single", "other", "all")
GRAMMAR = (
    "GROUP[.N|.N-M]=VALUE, ... with GROUP one of double, double.img, double.txt, single, other, all "
    "(e.g. 'double=1.0, single.0-11=0.5, double.img.3=0, other=0')"
)
_ENTRY = re.compile(
    r"(double(?:\.(?:img|txt))?|single|other|all)(?:\.(\d+)(?:-(\d+))?)?\s*=\s*([-+]?[\d.]+(?:[eE][-+]?\d+)?)"
)


@dataclass(frozen=True)
class Rule:
    group: str
    first: int | None
    last: int | None
    value: float

    def matches(self, kind: str, side: str | None, index: int | None) -> bool:
        if self.group == "all":
            return True
        group, _, want_side = self.group.partition(".")
        if group != kind or (want_side and want_side != side):
            return False
        return self.first is None or (index is not None and self.first <= index <= self.last)


@dataclass(frozen=True)
class BlockStrengths:
    """Multipliers per DiT block; ``rules`` in the order given, the last match wins, 1 when none does."""

    rules: tuple[Rule, ...] = ()

    def multiplier(self, kind: str, side: str | None = None, index: int | None = None) -> float:
        value = 1.0
        for rule in self.rules:
            if rule.matches(kind, side, index):
                value = rule.value
        return value

    def __bool__(self) -> bool:
        return bool(self.rules)


def parse_block_strengths(text: str | None) -> BlockStrengths:
    """Parse per-block strengths (see the module docstring); empty or None gives 1 everywhere."""
    rules = []
    for entry in re.split(r"[,;\n]", text or ""):
        entry = entry.strip()
        if not entry:
            continue
        m = _ENTRY.fullmatch(entry)
        try:
            value = float(m[4]) if m else math.nan
        except ValueError:
            value = math.nan
        if m is None or not math.isfinite(value):
            raise Flux2Error(f"block strength {entry!r} is not valid: write {GRAMMAR}")
        group, first, last = m[1], m[2], m[3]
        if first is not None and group in ("other", "all"):
            raise Flux2Error(f"block strength {entry!r}: {group!r} takes no block number; write {GRAMMAR}")
        lo = int(first) if first is not None else None
        hi = int(last) if last is not None else lo
        if lo is not None and hi < lo:
            raise Flux2Error(f"block strength {entry!r}: the range {lo}-{hi} runs backwards; write {lo}-{hi}")
        rules.append(Rule(group, lo, hi, value))
    return BlockStrengths(tuple(rules))


def describe_multipliers(strengths: BlockStrengths, double: int, single: int) -> dict[str, str]:
    """{group: "0-1 x1, 2 x0.5"} over this model's blocks (runs of equal values joined)."""
    if not strengths:
        return {"all": "x1"}
    out = {}
    for label, kind, side, count in (
        ("double.img", "double", "img", double),
        ("double.txt", "double", "txt", double),
        ("single", "single", None, single),
    ):
        out[label] = _runs([strengths.multiplier(kind, side, i) for i in range(count)])
    out["other"] = f"x{strengths.multiplier('other'):g}"
    return out


def _runs(values: list[float]) -> str:
    parts, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            span = f"{start}" if i - 1 == start else f"{start}-{i - 1}"
            parts.append(f"{span} x{values[start]:g}")
            start = i
    return ", ".join(parts) or "none"


def group_names(names) -> list[str]:
    """'name pattern (x count)' lines for module names, numbers folded to N (one line per block kind)."""
    from .keys import pattern_key

    counts: dict[str, int] = {}
    for name in names:
        key = pattern_key(name)
        counts[key] = counts.get(key, 0) + 1
    return [f"{key} (x{n})" if n > 1 else key for key, n in sorted(counts.items())]


@dataclass
class LoraReport:
    """What one LoRA file matched on the loaded models (``text()`` is the compact form)."""

    name: str
    family: str  # the trainer layout of the DiT (or text-encoder) keys
    kinds: list[str]  # LoRA, LoKr, LoHa, DoRA, full delta
    model: str  # the model the LoRA's shapes are for, as far as they tell
    total: int  # adapter modules in the file
    matched: int  # DiT modules applied
    layers: int  # DiT layers patched (split q/k/v pieces land on one)
    text_encoder: str  # text-encoder status line
    text_encoder_matched: int = 0
    alpha: str = ""
    unmatched: list[str] = field(default_factory=list)  # grouped module names
    unused_layers: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    ignored_tensors: list[str] = field(default_factory=list)  # tensors of no known kind, or unsupported parts
    multipliers: dict[str, str] = field(default_factory=dict)

    def text(self) -> str:
        lines = [
            f"LoRA {self.name}: {self.family}, {' + '.join(self.kinds) or 'no adapters'}, for {self.model}",
            f"  diffusion model: {self.matched} of the file's {self.total} modules applied here "
            f"({self.layers} layers)" + (f"; scale {self.alpha}" if self.alpha else ""),
            f"  text encoder: {self.text_encoder}",
        ]
        if self.multipliers and self.multipliers != {"all": "x1"}:
            lines.append("  block strengths: " + "; ".join(f"{k} {v}" for k, v in self.multipliers.items()))
        for label, items in (
            ("not matched", self.unmatched),
            ("unused layers (never run)", self.unused_layers),
            ("incomplete (one half missing)", self.incomplete),
            ("ignored tensors", self.ignored_tensors),
        ):
            if items:
                shown = ", ".join(items[:8]) + (f", ... ({len(items) - 8} more)" if len(items) > 8 else "")
                lines.append(f"  {label}: {shown}")
        return "\n".join(lines)


def not_a_lora(name: str, tensors: dict) -> Flux2Error:
    what = (
        "it looks like a model checkpoint" if any(k.endswith(".weight") for k in tensors) else "it is empty"
    )
    if tensors and not any(k.endswith(".weight") for k in tensors):
        what = f"it holds other tensors (e.g. {sorted(tensors)[0]})"
    return Flux2Error(
        f"{name} is not a LoRA: it has no LoRA weights (lora_up/lora_down, lora_A/lora_B, LoKr, LoHa or "
        f".diff tensors); {what}. Load a LoRA file here, and model checkpoints with the model loaders"
    )


def model_hidden(transformer) -> int:
    return transformer.img_in.out_features if hasattr(transformer, "img_in") else -1


def model_name(transformer) -> str:
    config = getattr(transformer, "config", None)
    return describe(config) if config is not None else "this model"


def wrong_size(name: str, mismatched: list, transformer) -> Flux2Error:
    """Which model a LoRA whose shapes do not fit was made for, from the width its layers read."""
    hidden = model_hidden(transformer)
    layers = dict(linears(transformer))
    widths = Counter(
        got[1]
        for _, target, _, got in mismatched
        if target in layers and layers[target].in_features == hidden
    )
    key, target, expected, got = mismatched[0]
    width = widths.most_common(1)[0][0] if widths else hidden
    flux1 = any(
        (t.endswith("linear1") and g[0] == 7 * width) or (t.endswith("mlp.0") and g[0] == 4 * width)
        for _, t, _, g in mismatched
    )
    model = HIDDEN_NAMES.get(hidden) or model_name(transformer)
    if flux1:
        return Flux2Error(
            f"{name} is a FLUX.1 LoRA (its {target} shapes are FLUX.1's): FLUX.1 LoRAs do not work on FLUX.2 "
            f"[klein]; use a LoRA trained for {model}"
        )
    if width == hidden:
        return Flux2Error(
            f"{name} does not fit this model: its change to {target} ({key}) is {list(got)} but the layer is "
            f"{list(expected)}; use a LoRA trained for {model_name(transformer)}"
        )
    made_for = HIDDEN_NAMES.get(width, f"a {width}-wide model")
    return Flux2Error(
        f"{name} is a LoRA for {made_for} (its layers are {width} wide), but the loaded model is {model} "
        f"({hidden} wide): use a LoRA trained for {model}, or load the {made_for} model"
    )


def wrong_text_encoder(name: str, mismatched: list, text_encoder) -> Flux2Error:
    key, target, expected, got = mismatched[0]
    width = next((g[1] for _, t, _, g in mismatched if t.endswith("q_proj")), got[1])
    ours = next(layer.in_features for n, layer in linears(text_encoder) if n.endswith("q_proj"))
    made_for = TEXT_WIDTH_NAMES.get(width, f"a {width}-wide text encoder")
    connected = TEXT_WIDTH_NAMES.get(ours, f"{ours} wide")
    return Flux2Error(
        f"{name} has text-encoder weights for {made_for}, but the connected text encoder is {connected} "
        f"({target}: {list(got)} vs {list(expected)}): use a LoRA trained for the model you loaded"
    )


def too_deep(name: str, keys: list[str], aliases: dict, transformer) -> Flux2Error:
    target = aliases[keys[0]].placements[0][0]
    double, single = len(transformer.double_blocks), len(transformer.single_blocks)
    deeper = (  # the block's own shapes were never compared: klein 9B (4096) and FLUX.1 (3072) both fit
        "a model with more blocks (klein 9B, FLUX.1 or FLUX.2 [dev])"
        if model_hidden(transformer) == 3072 and (double, single) == KLEIN_4B_BLOCKS
        else "a deeper model"
    )
    return Flux2Error(
        f"{name} changes {target} ({keys[0]}), but {model_name(transformer)} has only {double} double and "
        f"{single} single blocks: it is a LoRA for {deeper}; use a LoRA trained for this model"
    )


def text_encoder_status(te_keys: set, found: dict) -> str:
    unused = f" ({len(found['unused'])} for layers that never run)" if found["unused"] else ""
    if found["te_off"]:
        return f"{len(found['te_off'])} text encoder keys not applied (no text encoder connected){unused}"
    if te_keys:
        return f"{len(te_keys)} modules applied{unused}"
    return "no text-encoder keys" + unused
