"""Per-block work without patching attributes: a forward pre-hook on each block, removed on exit.

The DiT's blocks and the text encoder's decoder layers take the same hooks; interruption uses them today,
and any work that must happen right before a block runs (moving its weights in, for streaming) fits the same
place.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

from torch import nn


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
