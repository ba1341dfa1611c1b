"""Scratch buffers a DiT call's blocks share for their largest temporaries, on a CPU below float32."""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager

import torch
from torch import nn

from . import pointwise


class Scratch:
    """The buffer the blocks of one DiT call reuse for their largest temporary, on a CPU below float32: a
    double block's image q/k/v projection and then its MLP input, a single block's fused input projection
    (which also holds its MLP activation, normalised queries and the input of ``linear2``). No two of these
    are alive at once, and the double blocks all run before the single ones, so one buffer serves them all,
    grown to the largest (a single block's, over every token).

    A tensor above the C allocator's reuse threshold (32 MB with glibc) is fresh memory from the system each
    time it is made: its pages fault and are zeroed on first touch, in every block (a 1024² klein 4B step
    at real widths brought in 2.4 GB of such pages, 6% of its time). Held from the first block of a call to
    its end, the buffer serves every block, and nothing stays after the call. A single block holds no more
    than before (the buffer replaces the projection, the activation and the concatenation); a double block
    holds it through attention, below the single blocks' peak. Its contents are dead once the block that
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


def run_mlp(mlp: nn.Sequential, x: torch.Tensor, buffered: bool) -> torch.Tensor:
    """``mlp(x)`` (``{0: in, 1: act, 2: out}``), its input projection in the scratch buffer when
    ``buffered`` and one is open."""
    buffers = scratch() if buffered else None
    if buffers is None:
        return mlp(x)
    first = mlp[0]
    hidden = first(x, out=buffers.take((*x.shape[:-1], first.out_features), x))
    return mlp[2](mlp[1](hidden))
