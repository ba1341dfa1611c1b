"""Scratch buffers a DiT call's blocks share for their largest temporaries, on a CPU below float32."""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager

import torch
from torch import nn

from . import pointwise


class Scratch:
    """Buffers the blocks of one DiT call reuse for their largest temporaries, on a CPU below float32: the
    single blocks' fused input projection (which also holds their MLP activation, normalised queries and
    the input of ``linear2``), and the double blocks' image q/k/v projection and MLP input (one buffer: they
    are not alive at once).

    A tensor above the C allocator's reuse threshold (32 MB with glibc) is fresh memory from the system each
    time it is made: its pages fault and are zeroed on first touch, in every block (a 1024² klein 4B step
    at real widths brought in 2.4 GB of such pages, 6% of its time). Held from the first block of a call to
    its end, one buffer serves every block of a kind, and nothing stays after the call. A single block
    holds no more than before (its buffer replaces the projection, the activation and the concatenation);
    a double block holds its buffer through attention, below the single blocks' peak. A buffer's contents
    are dead once the block that filled it returns.
    """

    def __init__(self):
        self.buffers: dict[str, torch.Tensor] = {}

    def drop(self, name: str) -> None:
        """Free the ``name`` buffer (its blocks are done)."""
        self.buffers.pop(name, None)

    def take(self, name: str, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A contiguous [shape] tensor of ``like``'s dtype and device, in the ``name`` buffer (grown when
        too small): overwritten by the next ``take`` of that name."""
        numel = math.prod(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != like.dtype or buf.device != like.device:
            self.buffers[name] = buf = None  # the old buffer goes before its successor is made
            buf = self.buffers[name] = torch.empty(numel, dtype=like.dtype, device=like.device)
        return buf[:numel].view(shape)


_SCOPE = threading.local()


@contextmanager
def scratch_scope(device: torch.device, dtype: torch.dtype):
    """Blocks called inside reuse one ``Scratch`` when the call computes on a CPU below float32 without
    gradients; elsewhere (a GPU's caching allocator already reuses memory; float32) they allocate as
    usual."""
    if (
        torch.device(device).type != "cpu"
        or dtype not in pointwise.FUSED_DTYPES
        or torch.is_grad_enabled()  # writing into buffers is for inference only
        or getattr(_SCOPE, "scratch", None)
    ):
        yield
        return
    _SCOPE.scratch = Scratch()
    try:
        yield
    finally:
        _SCOPE.scratch = None


def scratch() -> Scratch | None:
    """The open ``scratch_scope``'s buffers, or None."""
    return getattr(_SCOPE, "scratch", None)


def run_mlp(mlp: nn.Sequential, x: torch.Tensor, name: str | None) -> torch.Tensor:
    """``mlp(x)`` (``{0: in, 1: act, 2: out}``), its input projection into the ``name`` scratch buffer when
    one is open."""
    buffers = scratch() if name else None
    if buffers is None:
        return mlp(x)
    first = mlp[0]
    hidden = first(x, out=buffers.take(name, (*x.shape[:-1], first.out_features), x))
    return mlp[2](mlp[1](hidden))
