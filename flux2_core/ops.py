"""The weight seam: every linear layer computes through ``Linear``, whose weight comes from a source.

A *source* turns what a layer stores into the weight one forward uses, on the input's device and in the
input's dtype. What it stores are the layer's own parameters and buffers, so ``.to()``, state dicts and
ComfyUI's model patcher see them like any module's. ``PlainWeight`` hands the stored weight back untouched
when it already sits on the right device in the right dtype, so a model of plain sources computes exactly
what ``nn.Linear`` computes; a weight kept on another device (streaming) is copied over for the one call.
Quantised storages are further sources: they dequantise per call and never write back.

*Patches* (LoRA and its relatives, any ``WeightPatch``) are added on top at compute time, on the whole weight
or on a row range of a fused one (one of q/k/v in ``qkv``, a part of a single block's ``linear1``). They are
applied in float32 on a copy of the weight, never into the stored tensor, so a quantised weight is never
re-quantised and removing a patch (by the key it was added under) restores the layer exactly. A source that
multiplies in its own format (``linear``: fp8, nvfp4, mxfp8, int4 through comfy-kitchen, int8 W8A8) keeps
doing so under patches that can say their own output (``output(x) = x delta^T``: LoRA, LoKr, LoHa, full
deltas), added beside its matmul; one that cannot (DoRA, which renormalises the whole weight) makes the layer
dequantise, patch and multiply as above.

``adopt_linears`` swaps the ``nn.Linear`` modules of a model built elsewhere (transformers' Qwen3) for this
type after the meta build, keeping their parameters, so blocks never know which kind they hold.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn


class WeightSource(Protocol):
    """How a layer's stored tensors become the weight of one forward: [out_features, in_features]."""

    def weight(self, layer: Linear, dtype: torch.dtype, device: torch.device) -> torch.Tensor: ...

    # Optionally ``linear(layer, x) -> Tensor | None``: the layer's output without bias by the source's own
    # matmul in its stored format; ``None`` falls back to ``F.linear`` with ``weight(...)``.


class PlainWeight:
    """The stored ``weight`` parameter as it is, moved or cast only when it must be."""

    def weight(self, layer: Linear, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        w = layer.weight
        if w.device != device or w.dtype != dtype:
            w = w.to(device=device, dtype=dtype, non_blocking=True)
        return w


PLAIN = PlainWeight()


class WeightPatch(Protocol):
    """A change to a layer's weight applied at compute time (a LoRA, LoKr, LoHa, DoRA or full delta).

    ``rows`` names the (offset, size) row range of a fused weight it applies to (``None``: all rows);
    ``shape`` is the [rows, in_features] it expects; ``apply`` adds it, in place, to ``w``: a float32 copy of
    those rows of the weight on the compute device (never the stored tensor).
    """

    rows: tuple[int, int] | None

    @property
    def shape(self) -> tuple[int, int]: ...

    def apply(self, w: torch.Tensor) -> None: ...

    # Optionally ``output(x) -> Tensor``: ``x delta^T`` for a float32 ``x`` [..., in_features], the patch's
    # share of the layer's output ([..., rows]), so a layer computing in its stored format keeps doing so.


@dataclass(frozen=True)
class LowRankPatch:
    """``strength * up @ down`` added to the weight, or to its rows ``offset .. offset + size`` if given."""

    up: torch.Tensor  # [rows, rank]
    down: torch.Tensor  # [rank, in_features]
    strength: float = 1.0
    rows: tuple[int, int] | None = None  # (offset, size) in a fused weight

    @property
    def shape(self) -> tuple[int, int]:
        if self.up.ndim != 2 or self.down.ndim != 2 or self.up.shape[1] != self.down.shape[0]:
            return (-1, -1)  # halves that do not multiply: fits no weight
        return (self.up.shape[0], self.down.shape[1])

    def delta(self, device: torch.device) -> torch.Tensor:
        up, down = self.up.to(device, torch.float32), self.down.to(device, torch.float32)
        return self.strength * (up @ down)

    def apply(self, w: torch.Tensor) -> None:
        w.add_(self.delta(w.device))

    def output(self, x: torch.Tensor) -> torch.Tensor:
        up, down = self.up.to(x.device, torch.float32), self.down.to(x.device, torch.float32)
        return self.strength * ((x @ down.T) @ up.T)


class Linear(nn.Module):
    """``y = x W^T (+ b)`` with ``W`` from ``source`` plus any patches; state dict keys as ``nn.Linear``."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        source: WeightSource = PLAIN,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        b = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.register_parameter("bias", b)
        self.source = source
        self.patches: dict[str, WeightPatch] = {}

    def extra_repr(self) -> str:
        extra = f", patches={len(self.patches)}" if self.patches else ""
        return f"{self.in_features}, {self.out_features}, bias={self.bias is not None}{extra}"

    def add_patch(self, key: str, patch: WeightPatch) -> None:
        offset, size = patch.rows or (0, self.out_features)
        if offset < 0 or offset + size > self.out_features or tuple(patch.shape) != (size, self.in_features):
            raise ValueError(
                f"patch {key!r} of shape {list(patch.shape)} at rows {offset}..{offset + size} does not "
                f"fit a {self.out_features}x{self.in_features} weight"
            )
        self.patches[key] = patch

    def remove_patch(self, key: str) -> None:
        self.patches.pop(key, None)

    def remove_patches(self, owner: str) -> None:
        """Remove every patch added under ``owner`` or ``owner/<anything>`` (one LoRA's pieces)."""
        for key in [k for k in self.patches if k == owner or k.startswith(owner + "/")]:
            del self.patches[key]

    def compute_weight(self, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        w = self.source.weight(self, dtype, device)
        if not self.patches:
            return w
        w = w.to(torch.float32, copy=True)  # never into the stored tensor
        for patch in self.patches.values():
            offset, size = patch.rows or (0, self.out_features)
            patch.apply(w.narrow(0, offset, size))
        return w.to(dtype)

    def forward(self, x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """``out`` (optional, [..., out_features] in ``x``'s dtype and device, contiguous): a buffer the
        output may be written to instead of a new tensor, where the plain weight multiplies (the same
        values: one matrix product either way); the result is what is returned."""
        bias = self.bias
        if bias is not None and (bias.device != x.device or bias.dtype != x.dtype):
            bias = bias.to(device=x.device, dtype=x.dtype)
        if out is not None and self.source is PLAIN and not self.patches and x.is_contiguous():
            w, rows = self.source.weight(self, x.dtype, x.device), out.view(-1, self.out_features)
            flat = x.view(-1, self.in_features)
            if bias is None:
                torch.mm(flat, w.t(), out=rows)
            else:
                torch.addmm(bias, flat, w.t(), out=rows)
            return out
        own = getattr(self.source, "linear", None)  # a source with its own matmul in its stored format
        if own is not None and all(hasattr(p, "output") for p in self.patches.values()):
            y = own(self, x)
            if y is not None:
                if self.patches:
                    y = y + self.patch_output(x)
                return y if bias is None else y + bias
        w = self.compute_weight(x.dtype, x.device)
        if x.ndim > 2 and not x.is_contiguous() and x.stride(-1) == 1:
            # rows at a regular stride (a slice of a wider buffer): multiplied where they lie, as the 2-D
            # product F.linear runs on a contiguous input (bias in the same op), without a copy
            try:
                flat = x.view(-1, x.shape[-1])
            except RuntimeError:
                flat = None
            if flat is not None:
                return F.linear(flat, w, bias).view(*x.shape[:-1], self.out_features)
        return F.linear(x, w, bias)

    def patch_output(self, x: torch.Tensor) -> torch.Tensor:
        """The patches' share of the output, ``x (sum of deltas)^T`` in float32, in ``x``'s dtype."""
        xf = x.float()
        out = xf.new_zeros(*x.shape[:-1], self.out_features)
        for patch in self.patches.values():
            offset, size = patch.rows or (0, self.out_features)
            out[..., offset : offset + size] += patch.output(xf)
        return out.to(x.dtype)


def adopt_linears(module: nn.Module) -> nn.Module:
    """Replace every ``nn.Linear`` inside ``module`` by ``Linear`` holding the same parameters."""
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                layer = Linear(child.in_features, child.out_features, bias=False, device="meta")
                layer.weight = child.weight
                layer.register_parameter("bias", child.bias)
                setattr(parent, name, layer)
    return module


def linears(module: nn.Module) -> Iterator[tuple[str, Linear]]:
    """Every ``Linear`` of ``module`` with its qualified name (the checkpoint key without ``.weight``)."""
    return ((name, m) for name, m in module.named_modules() if isinstance(m, Linear))


def set_sources(module: nn.Module, source: Callable[[str, Linear], WeightSource]) -> None:
    """Give every linear layer of ``module`` the source ``source(name, layer)`` returns."""
    for name, layer in linears(module):
        layer.source = source(name, layer)
