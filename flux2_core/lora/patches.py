"""The weight changes a LoRA file can hold, as patches one layer applies at compute time.

``ops.LowRankPatch`` is the plain LoRA (``up @ down``). This module adds LyCORIS' LoKr (a Kronecker product
of two small, optionally low-rank, factors) and LoHa (a Hadamard product of two low-rank products), full
weight deltas (``.diff``) and DoRA (a LoRA whose result is renormalised to learned magnitudes). Each keeps
only the small tensors of the file and computes its delta inside ``apply``, in float32 on the compute device,
so no full-size delta lives in memory between calls (a ``.diff`` is full size by nature: it is the file's).

``take`` picks rows of a patch's own delta, in order: the rows of a diffusers tensor that go into one of our
fused layers, or its two halves swapped (diffusers' final layer stores (scale, shift), ours (shift, scale)).

The scale of each kind follows ComfyUI: LoRA alpha/rank (rank = the down matrix's rows), LoKr alpha/dim only
when a factor is stored low-rank (else 1, whatever alpha says), LoHa alpha/rank, ``.diff`` 1; without an
``.alpha`` tensor a LoRA takes diffusers/PEFT's header (``lora_alpha / r``, rsLoRA ``lora_alpha / sqrt(r)``,
with ``alpha_pattern``/``rank_pattern`` per module), else 1.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass

import torch

from ..ops import LowRankPatch

log = logging.getLogger(__name__)

Rows = tuple[int, int]  # (offset, size)


def take_rows(delta: torch.Tensor, take: tuple[Rows, ...] | None) -> torch.Tensor:
    if take is None:
        return delta
    pieces = [delta.narrow(0, offset, size) for offset, size in take]
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces)


def _rows_taken(rows: int, take: tuple[Rows, ...] | None) -> int:
    return rows if take is None else sum(size for _, size in take)


def _f32(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    return t.to(device=device, dtype=torch.float32)


def _factor(
    full: torch.Tensor | None, a: torch.Tensor | None, b: torch.Tensor | None, device
) -> torch.Tensor:
    return _f32(full, device) if full is not None else _f32(a, device) @ _f32(b, device)


def factor_shape(full, a, b) -> tuple[int, int]:
    return tuple(full.shape) if full is not None else (a.shape[0], b.shape[1])


class _DeltaPatch:
    """A patch that adds ``strength * delta`` (rows ``take`` of it) to its rows of the weight."""

    rows: Rows | None
    strength: float
    take: tuple[Rows, ...] | None

    def full_shape(self) -> tuple[int, int]:  # the whole delta, before ``take``
        raise NotImplementedError

    def raw_delta(self, device: torch.device) -> torch.Tensor:
        raise NotImplementedError

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.full_shape()
        return _rows_taken(rows, self.take), cols

    def delta(self, device: torch.device) -> torch.Tensor:
        return self.strength * take_rows(self.raw_delta(device), self.take)

    def apply(self, w: torch.Tensor) -> None:
        w.add_(self.delta(w.device))

    def output(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.delta(x.device).T


@dataclass(frozen=True, eq=False)
class LoKrPatch(_DeltaPatch):
    """LyCORIS LoKr: ``kron(w1, w2)``, each factor stored whole or as a low-rank pair ``a @ b``."""

    w1: torch.Tensor | None
    w1_a: torch.Tensor | None
    w1_b: torch.Tensor | None
    w2: torch.Tensor | None
    w2_a: torch.Tensor | None
    w2_b: torch.Tensor | None
    strength: float = 1.0
    rows: Rows | None = None
    take: tuple[Rows, ...] | None = None

    def full_shape(self) -> tuple[int, int]:
        (r1, c1), (r2, c2) = (
            factor_shape(self.w1, self.w1_a, self.w1_b),
            factor_shape(self.w2, self.w2_a, self.w2_b),
        )
        return r1 * r2, c1 * c2

    def raw_delta(self, device: torch.device) -> torch.Tensor:
        w1 = _factor(self.w1, self.w1_a, self.w1_b, device)
        return torch.kron(w1, _factor(self.w2, self.w2_a, self.w2_b, device))


@dataclass(frozen=True, eq=False)
class LoHaPatch(_DeltaPatch):
    """LyCORIS LoHa: ``(w1_a @ w1_b) * (w2_a @ w2_b)``, element-wise."""

    w1_a: torch.Tensor
    w1_b: torch.Tensor
    w2_a: torch.Tensor
    w2_b: torch.Tensor
    strength: float = 1.0
    rows: Rows | None = None
    take: tuple[Rows, ...] | None = None

    def full_shape(self) -> tuple[int, int]:
        return self.w1_a.shape[0], self.w1_b.shape[1]

    def raw_delta(self, device: torch.device) -> torch.Tensor:
        return (_f32(self.w1_a, device) @ _f32(self.w1_b, device)) * (
            _f32(self.w2_a, device) @ _f32(self.w2_b, device)
        )


@dataclass(frozen=True, eq=False)
class FullDeltaPatch(_DeltaPatch):
    """A full weight delta stored in the file (``.diff``)."""

    diff: torch.Tensor
    strength: float = 1.0
    rows: Rows | None = None
    take: tuple[Rows, ...] | None = None

    def full_shape(self) -> tuple[int, int]:
        return tuple(self.diff.shape)

    def raw_delta(self, device: torch.device) -> torch.Tensor:
        return _f32(self.diff, device)


@dataclass(frozen=True, eq=False)
class DoRAPatch:
    """DoRA: the weight with its low-rank change, renormalised to learned magnitudes, blended in by strength.

    ``inner`` is the change at the LoRA's own scale (alpha/rank, strength 1). With W the weight so far:

    1. W_c = W + inner (LyCORIS' and PEFT's definition: the norm is taken of the changed weight W_c. ComfyUI
       takes the per-row norm of the original W instead, which is not DoRA and drifts from what the trainer
       optimised; for magnitudes of shape [1, in] both agree);
    2. W_d = W_c * magnitude / (‖W_c‖ + eps), the norm over inputs per output row when ``magnitude`` is
       [rows, 1] (kohya/LyCORIS ``dora_scale`` [out, 1], PEFT ``lora_magnitude_vector`` [out]), else over
       rows per input column ([1, in]);
    3. W' = W + strength * (W_d - W): ComfyUI's strength blend, linear in the slider, so strength 0 is the
       base, 1 is the trained DoRA weight and several LoRAs' slider semantics stay the same.
    """

    inner: object  # a patch with .delta(device) and .shape
    magnitude: torch.Tensor  # [rows, 1] or [1, in]
    strength: float = 1.0
    rows: Rows | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.inner.shape

    def apply(self, w: torch.Tensor) -> None:
        merged = w + self.inner.delta(w.device)
        magnitude = _f32(self.magnitude, w.device)
        per_row = magnitude.shape[0] == w.shape[0] and magnitude.shape[-1] == 1
        norm = merged.norm(dim=1, keepdim=True) if per_row else merged.norm(dim=0, keepdim=True)
        decomposed = merged * (magnitude / (norm + torch.finfo(torch.float32).eps))
        w.add_(self.strength * (decomposed - w))


def as_matrix(t: torch.Tensor) -> torch.Tensor:
    """[out, in, 1, 1] (saved from 1x1 convolutions) -> [out, in]; PEFT's [out] magnitude -> [out, 1]."""
    if t.ndim > 2 and all(d == 1 for d in t.shape[2:]):
        return t.reshape(t.shape[0], t.shape[1])
    return t.reshape(-1, 1) if t.ndim == 1 and t.numel() > 1 else t


def adapter_kind(parts: dict) -> str | None:
    has = parts.keys()
    if {"up", "down"} <= has:
        return "LoRA"
    w1, w2 = (
        ("lokr_w1" in has or {"lokr_w1_a", "lokr_w1_b"} <= has),
        ("lokr_w2" in has or {"lokr_w2_a", "lokr_w2_b"} <= has),
    )
    if w1 and w2:
        return "LoKr"
    if {"hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"} <= has:
        return "LoHa"
    return "full delta" if "diff" in has else None


def is_dora(parts: dict) -> bool:
    return "dora_scale" in parts or "magnitude" in parts


def delta_shape(kind: str, parts: dict, tensors) -> tuple[int, int]:
    t = {p: tensors[k] for p, k in parts.items()}
    if kind == "LoRA":
        up, down = t["up"], t["down"]
        if up.ndim != 2 or down.ndim != 2 or up.shape[1] != down.shape[0]:
            return (-1, -1)
        return up.shape[0], down.shape[1]
    if kind == "LoKr":
        (r1, c1), (r2, c2) = (
            factor_shape(t.get(f"lokr_w{i}"), t.get(f"lokr_w{i}_a"), t.get(f"lokr_w{i}_b")) for i in (1, 2)
        )
        return r1 * r2, c1 * c2
    if kind == "LoHa":
        return t["hada_w1_a"].shape[0], t["hada_w1_b"].shape[1]
    return tuple(t["diff"].shape) if t["diff"].ndim == 2 else (-1, -1)


def header_config(metadata: dict[str, str], component: str) -> dict | None:
    """diffusers' ``lora_adapter_metadata`` for one component ({"r": .., "lora_alpha": .., ...}), if any."""
    raw = metadata.get("lora_adapter_metadata")
    try:
        data = json.loads(raw) if raw else None
    except (TypeError, ValueError):
        log.warning("the LoRA header's lora_adapter_metadata is not valid JSON: ignored")
        return None
    if not isinstance(data, dict):
        return None
    prefix = component + "."
    config = {k[len(prefix) :]: v for k, v in data.items() if k.startswith(prefix)}
    return config if "lora_alpha" in config or "r" in config else None


def _pattern(patterns, name: str, default):
    """PEFT's rank/alpha patterns: a key matches a module whose name ends in it (at a dot boundary)."""
    for pattern, value in (patterns or {}).items():
        try:
            if re.fullmatch(rf"(?:.*\.)?(?:{pattern})", name):
                return value
        except re.error:
            if name == pattern or name.endswith("." + pattern):
                return value
    return default


def adapter_scale(kind: str, local: str, t: dict, header: dict | None) -> tuple[float, str]:
    """(alpha/rank, where alpha came from) with ComfyUI's per-kind rules, plus the PEFT header for LoRA."""
    alpha = float(t["alpha"].float().reshape(-1)[0]) if "alpha" in t else None
    if kind == "LoRA":
        rank = t["down"].shape[0]
        if alpha is not None:
            return alpha / rank, "alpha/rank from .alpha"
        if header is not None:
            r = _pattern(header.get("rank_pattern"), local, header.get("r", 8))
            lora_alpha = _pattern(header.get("alpha_pattern"), local, header.get("lora_alpha", 8))
            r = math.sqrt(r) if header.get("use_rslora") else r
            return lora_alpha / r, "lora_alpha/r from the header"
        return 1.0, "1 (no alpha)"
    if kind == "LoKr":
        dim = None  # the rank of a factored half (w2's when both are), as LyCORIS and ComfyUI take it
        if "lokr_w1" not in t:
            dim = t["lokr_w1_b"].shape[0]
        if "lokr_w2" not in t:
            dim = t["lokr_w2_b"].shape[0]
        if alpha is not None and dim is not None:
            return alpha / dim, "alpha/dim from .alpha"
        return 1.0, "1 (LoKr without a factored half)" if dim is None else "1 (no alpha)"
    if kind == "LoHa" and alpha is not None:
        return alpha / t["hada_w1_b"].shape[0], "alpha/rank from .alpha"
    return 1.0, "1 (no alpha)"


def build_patch(kind: str, t: dict, scale: float, s: float, rows: Rows | None, take: tuple[Rows, ...] | None):
    """The patch for one module's tensors ``t`` (by part): ``s * scale * delta``, or DoRA blended by ``s``."""
    dora = is_dora(t)
    inner_strength = scale if dora else s * scale
    if kind == "LoRA":
        inner = LowRankPatch(take_rows(t["up"], take), t["down"], inner_strength, rows)
    elif kind == "LoKr":
        factors = {p: t.get(f"lokr_{p}") for p in ("w1", "w1_a", "w1_b", "w2", "w2_a", "w2_b")}
        inner = LoKrPatch(**factors, strength=inner_strength, rows=rows, take=take)
    elif kind == "LoHa":
        halves = {p: t[f"hada_{p}"] for p in ("w1_a", "w1_b", "w2_a", "w2_b")}
        inner = LoHaPatch(**halves, strength=inner_strength, rows=rows, take=take)
    else:
        inner = FullDeltaPatch(t["diff"], inner_strength, rows, take)
    if not dora:
        return inner
    magnitude = t.get("dora_scale", t.get("magnitude"))
    if magnitude.shape[-1] == 1:  # per output row: the rows this patch covers
        magnitude = take_rows(magnitude, take)
    return DoRAPatch(inner, magnitude, s, rows)
