"""Per-block work for the length of one call: a forward pre-hook on each block, removed on exit.

Interruption uses it: a cancel is checked before each of the DiT's blocks and each of the text encoders'
decoder layers. Streaming (``devices.streaming``) and the block split (``devices.placement``)
register their own hooks instead, because theirs stay for as long as the model is streamed or split (across
calls, not for one) and streaming also needs a hook after each block (to drop the copy it moved in);
``copies_released`` guards one run against leaving a streamed block's copy behind.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

from torch import nn

from .devices.streaming import streamer_of


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
        streamer = streamer_of(transformer)
        if streamer is not None:
            streamer.release()
