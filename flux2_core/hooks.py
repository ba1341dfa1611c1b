"""Per-block work for the length of one call: a forward pre-hook on each block, removed on exit.

Interruption uses it: a cancel is checked before each of the DiT's blocks and each of the text encoders'
decoder layers. Streaming (``devices.streaming``) and the block split (``devices.placement``)
register their own hooks instead, because theirs stay for as long as the model is streamed or split (across
calls, not for one) and streaming also needs a hook after each block (to drop the copy it moved in);
``copies_released`` guards one run against leaving a streamed block's copy behind.

A strategy that moves a model's block weights while it runs (streaming) registers itself here on the model
(``set_weight_mover``), so the model and the samplers can ask for it (``weight_mover``) without importing
the strategy: the model knows of no particular way of placing it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import torch
from torch import nn

_MOVER = "_flux2_weight_mover"


class WeightMover(Protocol):
    def release(self) -> None:
        """Free every copy of a block's weights it moved to the device and has not dropped yet."""


def set_weight_mover(module: nn.Module, mover: WeightMover | None) -> None:
    """Register (or, with None, remove) the strategy moving ``module``'s block weights while it runs."""
    if mover is None:
        if hasattr(module, _MOVER):
            delattr(module, _MOVER)
    else:
        setattr(module, _MOVER, mover)


def weight_mover(module: nn.Module) -> WeightMover | None:
    """The strategy moving ``module``'s block weights while it runs (a block streamer), or None."""
    return getattr(module, _MOVER, None)


@contextlib.contextmanager
def before_each(modules: Iterable[nn.Module], fn: Callable[[nn.Module], None] | None) -> Iterator[None]:
    """Call ``fn(module)`` right before each of ``modules`` runs, inside the ``with`` block only."""
    if fn is None:
        yield
        return
    handles = [m.register_forward_pre_hook(lambda module, args: fn(module)) for m in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def calling(fn: Callable[[], None] | None) -> Callable[[nn.Module], None] | None:
    """A block hook that ignores which block is next (interruption checks)."""
    return None if fn is None else (lambda module: fn())


@contextlib.contextmanager
def copies_released(transformer: nn.Module) -> Iterator[None]:
    """Around one run of ``transformer``: however it ends (finished, interrupted between blocks, out of
    memory), no streamed block's copy stays on the device afterwards (a stopped block's post-hook never runs,
    so its copy and the next block's prefetch would otherwise stay allocated outside any accounting)."""
    try:
        yield
    finally:
        mover = weight_mover(transformer)
        if mover is not None:
            mover.release()


def moved(value, device: torch.device):
    """``value`` (a tensor, or tuples / lists / dicts of them) on ``device``; what is there stays."""
    mover = getattr(value, "moved_to", None)  # a record of tensors that moves itself (layers.BlockCall)
    if mover is not None:
        return mover(device)
    if isinstance(value, torch.Tensor):
        if value.device == device:
            return value
        return value.to(device, non_blocking=asynchronous(value.device, device))
    if isinstance(value, tuple):
        return tuple(moved(v, device) for v in value)
    if isinstance(value, list):
        return [moved(v, device) for v in value]
    if isinstance(value, dict):
        return {k: moved(v, device) for k, v in value.items()}
    return value


def asynchronous(source: torch.device, target: torch.device) -> bool:
    """Whether a copy between two devices may be issued without waiting: only GPU to GPU, where the copy is
    ordered on the streams like any kernel. A copy to the CPU must be finished before the CPU reads it (a
    non-blocking one returns at once, and the block on the CPU would read a half-written tensor)."""
    return source.type == "cuda" and target.type == "cuda"
