"""The DiT's elementwise steps in their reference form: layer and RMS norms, modulation, the gated residual,
the MLP activations. These are the formulas of BFL's ``model.py`` and diffusers' ``transformer_flux2.py``,
op for op; a CPU computing below float32 runs fused forms of some of them (``fused``, through
``block_ops.FusedOps``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

NORM_EPS = 1e-6


def layer_norm(x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), eps=NORM_EPS)


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(1 + scale) * layer_norm(x) + shift``; shift and scale [B, 1, H]."""
    return (1 + scale) * layer_norm(x) + shift


def gated(x: torch.Tensor, gate: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The residual update ``x + gate * out``."""
    return x + gate * out


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


class RMSNorm(nn.Module):
    """RMSNorm over head_dim; the weight is named ``scale`` as in the checkpoints. Statistics in float32,
    the weight applied after the cast back (BFL's order); in float32 that is one fused op with the very
    same values."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32 and self.scale.dtype == torch.float32:
            return F.rms_norm(x, (x.shape[-1],), weight=self.scale, eps=NORM_EPS)
        return F.rms_norm(x.float(), (x.shape[-1],), eps=NORM_EPS).to(x.dtype) * self.scale


class QKNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.query_norm = RMSNorm(dim)
        self.key_norm = RMSNorm(dim)
