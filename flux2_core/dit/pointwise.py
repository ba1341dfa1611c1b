"""The DiT's elementwise steps: layer and RMS norms, modulation, gated residuals, the MLP activations, and the
q/k norms fused with RoPE.

Below float32 the steps are fused where one PyTorch op computes the same formula in float32 and rounds once
(the plain form rounds after every op): the same values within the dtype's rounding, fewer passes over
memory (``docs/benchmarks.md``, *bfloat16 on CPUs*). float32 keeps the plain form, op for op the
references' arithmetic.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .rope import ROPE_CHUNK, rotated, rotation_table

NORM_EPS = 1e-6

# the dtypes whose elementwise steps run fused
FUSED_DTYPES = (torch.bfloat16, torch.float16)


def layer_norm(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=NORM_EPS)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(1 + scale) * layer_norm(x) + shift``; shift and scale [B, 1, H]. Below float32, one batch item: the
    layer norm's own affine step does the modulation (one pass)."""
    if x.dtype in FUSED_DTYPES:
        if x.shape[0] == 1 and shift.shape[0] == 1:
            w, b = (1 + scale).reshape(-1), shift.reshape(-1)
            return F.layer_norm(x, (x.shape[-1],), w, b, eps=NORM_EPS)
        return torch.addcmul(shift, layer_norm(x), 1 + scale)
    return (1 + scale) * layer_norm(x) + shift


def gated(x: torch.Tensor, gate: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The residual update ``x + gate * out`` (one op below float32)."""
    return torch.addcmul(x, gate, out) if x.dtype in FUSED_DTYPES else x + gate * out


def swiglu(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The gate is the first half: silu(gate) * up (into ``out`` when given; ``x`` then holds its own
    scratch copy, whose gate half is overwritten)."""
    half = x.shape[-1] // 2
    gate, up = x[..., :half], x[..., half:]
    if out is not None:  # may be ``gate`` itself
        return torch.mul(F.silu(gate, inplace=True), up, out=out)
    return F.silu(gate).mul_(up)


class SwiGLU(nn.Module):
    """FLUX.2's gated MLP activation: two input rows per output (gate, up)."""

    inputs_per_output = 2

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """silu(gate) * up (into ``out`` when given; it may be the gate half of ``x``)."""
        return swiglu(x, out)


class TanhGELU(nn.GELU):
    """FLUX.1's MLP activation: GELU with the tanh approximation, one input row per output."""

    inputs_per_output = 1

    def __init__(self):
        super().__init__(approximate="tanh")

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """GELU of ``x`` (into ``out`` when given; it may be ``x``)."""
        y = super().forward(x)
        return y if out is None else out.copy_(y)


NORM_CHUNK = 256  # tokens normalised at a time below float32 (as ROPE_CHUNK)


def in_token_chunks(fn, x: torch.Tensor, size: int) -> torch.Tensor:
    """``fn(x[..., rows, :])`` for ``size`` tokens (rows of dim -2) at a time, written into one tensor of
    ``fn``'s output dtype: the values of one call on every token when ``fn`` works token by token, without
    its temporaries for every token at once."""
    length = x.shape[-2]
    if length <= size:
        return fn(x)
    first = fn(x[..., :size, :])
    out = first.new_empty(x.shape)
    out[..., :size, :] = first
    for start in range(size, length, size):
        out[..., start : start + size, :] = fn(x[..., start : start + size, :])
    return out


class RMSNorm(nn.Module):
    """RMSNorm over head_dim; the weight is named ``scale`` as in the checkpoints."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in float32, weight applied after the cast back (BFL order); in float32 that is one fused
        # op giving the very same values. Below float32 the float32 copies are formed for NORM_CHUNK tokens
        # (rows of dim -2) at a time: the same values, without holding them for a whole long sequence.
        if x.dtype == torch.float32 and self.scale.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), weight=self.scale, eps=NORM_EPS)
        if x.ndim < 2:
            return self._low_precision(x)
        return in_token_chunks(self._low_precision, x, NORM_CHUNK)

    def _low_precision(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), eps=NORM_EPS).to(x.dtype) * self.scale


class QKNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.query_norm = RMSNorm(dim)
        self.key_norm = RMSNorm(dim)


def rope_table_if_fused(x: torch.Tensor, pe: torch.Tensor) -> torch.Tensor | None:
    """``pe`` where a block normalises and rotates its queries and keys in one pass (below float32), else
    None (float32: the norm, then the rotation in ``joint_attention``, op for op the references')."""
    return pe if x.dtype in FUSED_DTYPES else None


def norm_rope(x: torch.Tensor, norm: RMSNorm, table: torch.Tensor, out=None) -> torch.Tensor:
    """``apply_rope_(norm(x), table)`` for [B, heads, L, D] ``x``, a chunk of ``ROPE_CHUNK`` tokens at a
    time: the norm's statistics, its scale and the rotation in float32, rounded to ``x``'s dtype once (the
    plain form rounds after the norm, after the scale and after the rotation). ``out`` may be ``x``."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    table = rotation_table(table) if table.ndim == 3 else table
    weight = norm.scale.to(x.device, torch.float32)
    for start in range(0, x.shape[-2], ROPE_CHUNK):
        rows = slice(start, start + ROPE_CHUNK)
        normed = F.rms_norm(x[..., rows, :].float(), (x.shape[-1],), weight, NORM_EPS)
        out[..., rows, :].copy_(rotated(normed, table[rows], fused=True))
    return out
