"""The pieces of the fused block ops (``block_ops.FusedOps``): the elementwise steps fused below float32,
the q/k norms fused with RoPE, and the buffer a DiT call's blocks reuse for their largest temporaries.

Each fused step computes the reference formula (``pointwise``) in float32 inside one PyTorch op and rounds
once, where the reference form rounds after every op: the same values within the dtype's rounding, fewer
passes over memory. Measured figures: ``docs/benchmarks.md`` (*bfloat16 on CPUs*).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .pointwise import NORM_EPS, RMSNorm, layer_norm
from .rope import rotated, rotation_table

# Tokens normalised and rotated at a time: bounds the float32 temporaries of a long sequence and keeps them
# in cache (and below the C allocator's reuse threshold) for the steps that follow on them.
NORM_ROPE_CHUNK = 256


def modulate(x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``(1 + scale) * layer_norm(x) + shift`` in one pass: the layer norm's own affine step for one batch
    item, else one ``addcmul``."""
    if x.shape[0] == 1 and shift.shape[0] == 1:
        w, b = (1 + scale).reshape(-1), shift.reshape(-1)
        return F.layer_norm(x, (x.shape[-1],), w, b, eps=NORM_EPS)
    return torch.addcmul(shift, layer_norm(x), 1 + scale)


def gated(x: torch.Tensor, gate: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``x + gate * out`` as one op."""
    return torch.addcmul(x, gate, out)


def norm_rope(x: torch.Tensor, norm: RMSNorm, table: torch.Tensor, out=None) -> torch.Tensor:
    """``rope(norm(x))`` for [B, heads, L, D] ``x``, ``NORM_ROPE_CHUNK`` tokens at a time: the norm's
    statistics, its scale and the rotation in float32, rounded to ``x``'s dtype once. ``out`` may be
    ``x``."""
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    table = rotation_table(table) if table.ndim == 3 else table
    weight = norm.scale.to(x.device, torch.float32)
    for start in range(0, x.shape[-2], NORM_ROPE_CHUNK):
        rows = slice(start, start + NORM_ROPE_CHUNK)
        normed = F.rms_norm(x[..., rows, :].float(), (x.shape[-1],), weight, NORM_EPS)
        out[..., rows, :].copy_(rotated(normed, table[rows], fused=True))
    return out


def rope_in_chunks(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``x`` [B, heads, L, D] rotated by ``table`` in place, ``NORM_ROPE_CHUNK`` tokens at a time: the
    reference rotation's arithmetic (float32, then ``x``'s dtype) without its float32 temporaries for every
    token at once. Returns ``x`` (a norm's own output: nothing else holds it)."""
    table = rotation_table(table) if table.ndim == 3 else table
    for start in range(0, x.shape[-2], NORM_ROPE_CHUNK):
        part = x[..., start : start + NORM_ROPE_CHUNK, :]
        part.copy_(rotated(part, table[start : start + NORM_ROPE_CHUNK]))  # the cast back is the copy
    return x


class Scratch:
    """One buffer the blocks of a DiT call reuse for their largest temporary: a double block's image q/k/v
    projection and then its MLP input, a single block's fused input projection (which also holds its MLP
    activation, its normalised queries and the input of ``linear2``). No two of these are alive at once, and
    the double blocks all run before the single ones, so one buffer serves them all, grown to the largest.

    A tensor above the C allocator's reuse threshold (32 MB with glibc) is fresh memory from the system each
    time it is made: its pages fault and are zeroed on first touch, in every block. Held for one call, the
    buffer serves every block, and nothing stays after the call. Its contents are dead once the block that
    filled it returns.
    """

    def __init__(self):
        self.buffer: torch.Tensor | None = None

    def take(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A contiguous [shape] tensor of ``like``'s dtype and device in the buffer (grown when too small),
        overwritten by the next ``take``."""
        numel = math.prod(shape)
        buf = self.buffer
        if buf is None or buf.numel() < numel or buf.dtype != like.dtype or buf.device != like.device:
            self.buffer = buf = None  # the old buffer goes before its successor is made
            buf = self.buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buf[:numel].view(shape)
