"""How the DiT's blocks compute their steps: one seam, chosen once per call by device and dtype.

A block (``layers``) writes its math once: modulate, project, q/k norm + RoPE, attend, activate, project
back, gated residual. Each step it names goes through the call's ops:

- ``PlainOps``, the reference form: PyTorch ops, op for op BFL's and diffusers' arithmetic, and
  ``scaled_dot_product_attention``. What every device but a CPU runs;
- ``CpuOps``, a CPU in float32: the same arithmetic and the same values, with RoPE rotated a chunk of tokens
  at a time (its float32 temporaries stay in cache and below the C allocator's reuse threshold), the largest
  temporaries in one buffer reused by every block of the call (no fresh pages per block), and modulation and
  the gated residual in place on their own temporaries;
- ``FusedOps``, for a CPU computing below float32 without gradients: the CPU ops' buffer, the
  elementwise steps fused (one rounding), q/k norm and RoPE in one pass over chunks of tokens, and the
  attention kernel measured per shape class (``attention.KernelChoice``). The same values within the
  dtype's rounding.

``ops_for(device, dtype)`` chooses; ``FLUX2_BLOCK_OPS=plain`` or ``fused`` overrides the choice anywhere
(the GPU device check times both). Under ``torch.compile`` the plain ops run (the compiler fuses their steps
itself), so a compiled DiT is one graph. Measured figures: ``docs/benchmarks.md``.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from . import fused, pointwise
from .attention import KernelChoice, attend
from .rope import apply_rope

FUSED_DTYPES = (torch.bfloat16, torch.float16)
OPS_ENV = "FLUX2_BLOCK_OPS"


class PlainOps:
    """The reference form of every step (see the module docstring)."""

    name = "plain"

    def modulate(self, x: torch.Tensor, shift: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return pointwise.modulate(x, shift, scale)

    def gated(self, x: torch.Tensor, gate: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return pointwise.gated(x, gate, out)

    def qk_norm_rope(self, q, k, norm: pointwise.QKNorm, table: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The normalised queries and keys [B, heads, L, D], rotated by ``table`` (their tokens' rows)."""
        q, k = norm.query_norm(q).to(q.dtype), norm.key_norm(k).to(k.dtype)
        return apply_rope(q, table), apply_rope(k, table)

    def project(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A long stream's input projection (an ``ops.Linear``)."""
        return layer(x)

    def mlp(self, mlp: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        """A long stream's MLP (``{0: in, 1: act, 2: out}``)."""
        return mlp(x)

    def activate(self, act: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """A single block's MLP activation of the MLP rows of its fused projection."""
        return act(x)

    def join(self, attn: torch.Tensor, mlp: torch.Tensor) -> torch.Tensor:
        """A single block's ``linear2`` input: ``[attention | activation]`` per token."""
        return torch.cat([attn, mlp], dim=-1)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias=None) -> torch.Tensor:
        return attend(q, k, v, bias)


PLAIN = PlainOps()
KERNELS = KernelChoice()  # the process's measured attention kernels (FusedOps)


class CpuOps(PlainOps):
    """The reference arithmetic on a CPU, without gradients: the very same values, with fewer fresh pages and
    passes over memory. One per DiT call: it holds the call's buffer.

    - RoPE in chunks of tokens, in place on the norms' outputs;
    - the largest temporaries in one buffer the call's blocks reuse (``fused.Scratch``): a stream's input
      projection and MLP input, a single block's fused projection (its MLP activation written over its
      start, attention's output over v's rows, so ``linear2``'s input needs no concatenation). Above the C
      allocator's reuse threshold every fresh tensor is pages the kernel faults in and zeroes, in every block;
    - modulation and the gated residual computed in place on their own temporaries (a product and a sum are
      the same whichever operand comes first).
    """

    name = "cpu"

    def __init__(self):
        self.scratch = fused.Scratch()
        self.projected: torch.Tensor | None = None  # the last ``project`` output (a single block's rows)

    def modulate(self, x, shift, scale):
        normed = pointwise.layer_norm(x)
        if normed.shape != torch.broadcast_shapes(normed.shape, shift.shape, scale.shape):
            return super().modulate(x, shift, scale)
        return normed.mul_(1 + scale).add_(shift)

    def gated(self, x, gate, out):
        """``out`` (a layer's fresh output, nothing else holds it) scaled and summed in place."""
        if (
            out.shape != x.shape
            or out.dtype != x.dtype
            or gate.dtype != x.dtype
            or out.shape != torch.broadcast_shapes(out.shape, gate.shape)
        ):
            return super().gated(x, gate, out)
        return out.mul_(gate).add_(x)

    def qk_norm_rope(self, q, k, norm, table):
        q, k = norm.query_norm(q).to(q.dtype), norm.key_norm(k).to(k.dtype)
        return fused.rope_in_chunks(q, table), fused.rope_in_chunks(k, table)

    def project(self, layer, x):
        rows = self.scratch.take((*x.shape[:-1], layer.out_features), x)
        self.projected = layer(x, out=rows)
        return self.projected

    def mlp(self, mlp, x):
        first = mlp[0]
        hidden = first(x, out=self.scratch.take((*x.shape[:-1], first.out_features), x))
        return mlp[2](mlp[1](hidden))

    def activate(self, act, x):
        """Written over the start of the MLP rows (``join`` then finds ``[attention | activation]`` in the
        projection's rows)."""
        return act(x, out=x[..., : x.shape[-1] // act.inputs_per_output])

    def join(self, attn, mlp):
        """Attention's output written over v's rows of the projection (v was copied out), so ``[attention |
        activation]`` lies in the buffer already: no concatenation."""
        rows, h = self.projected, attn.shape[-1]
        self.projected = None
        if rows is None or rows.shape[-1] < 3 * h or mlp.data_ptr() != rows[..., 3 * h :].data_ptr():
            return super().join(attn, mlp)
        rows[..., 2 * h : 3 * h].copy_(attn)
        return rows[..., 2 * h : 3 * h + mlp.shape[-1]]


class FusedOps(CpuOps):
    """The fused forms and the measured attention kernel on the CPU ops' buffer (module docstring)."""

    name = "fused"

    def __init__(self, kernels: KernelChoice | None = None):
        super().__init__()
        self.kernels = kernels or KERNELS

    def modulate(self, x, shift, scale):
        return fused.modulate(x, shift, scale)

    def gated(self, x, gate, out):
        return fused.gated(x, gate, out)

    def qk_norm_rope(self, q, k, norm, table):
        # the queries are this block's own (a projection's rows): overwritten in place
        return fused.norm_rope(q, norm.query_norm, table, out=q), fused.norm_rope(k, norm.key_norm, table)

    def attention(self, q, k, v, bias=None):
        return attend(q, k, v, bias, self.kernels)


def ops_for(device: torch.device | str, dtype: torch.dtype) -> PlainOps:
    """The ops of one DiT call computing in ``dtype`` on ``device`` (see the module docstring)."""
    forced = os.environ.get(OPS_ENV, "auto")
    if forced == "plain":
        return PLAIN
    if forced == "fused" and not torch.is_grad_enabled():  # it writes into its buffers: inference only
        return FusedOps()
    if torch.compiler.is_compiling():  # the compiler fuses the reference form's steps itself
        return PLAIN
    if torch.device(device).type != "cpu" or torch.is_grad_enabled():
        return PLAIN
    return FusedOps() if dtype in FUSED_DTYPES else CpuOps()
