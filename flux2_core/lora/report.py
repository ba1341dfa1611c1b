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
from dataclasses import dataclass, field

from ..configs import describe
from ..errors import Flux2Error
from .keys import pattern_key

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
    unmatched_count: int = 0  # modules of the file that match no layer of any model we know
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
            (f"not matched ({self.unmatched_count} modules)", self.unmatched),
            ("unused layers (never run)", self.unused_layers),
            ("incomplete (one half missing)", self.incomplete),
            ("ignored tensors", self.ignored_tensors),
        ):
            if items:
                shown = ", ".join(items[:8]) + (f", ... ({len(items) - 8} more)" if len(items) > 8 else "")
                lines.append(f"  {label}: {shown}")
        return "\n".join(lines)


def model_hidden(transformer) -> int:
    return transformer.img_in.out_features if hasattr(transformer, "img_in") else -1


def model_name(transformer) -> str:
    config = getattr(transformer, "config", None)
    return describe(config) if config is not None else "this model"


def text_encoder_status(te_keys: set, unused_keys: list, te_off: list) -> str:
    unused = f" ({len(unused_keys)} for layers that never run)" if unused_keys else ""
    if te_off:
        return f"{len(te_off)} text encoder keys not applied (no text encoder connected){unused}"
    if te_keys:
        return f"{len(te_keys)} modules applied{unused}"
    return "no text-encoder keys" + unused
