"""Host memory for streamed blocks: the buffers the weights live in between copies, and giving page-locked
memory back to the system once streaming ends (PyTorch's host allocator keeps freed pinned buffers cached
for reuse, so dropping them alone does not return them)."""

from __future__ import annotations

import logging

import torch

log = logging.getLogger(__name__)


def host_buffer(nbytes: int, pin: bool) -> tuple[torch.Tensor, bool]:
    """A ``nbytes`` uint8 buffer, page-locked when ``pin`` (and the system grants it); (buffer, pinned)."""
    if pin:
        try:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True), True
        except RuntimeError as e:  # page-locked memory exhausted or refused: ordinary memory still works
            log.warning("could not pin %d MiB for streaming (%s): using ordinary memory", nbytes >> 20, e)
    return torch.empty(nbytes, dtype=torch.uint8), False


def give_back_pinned() -> None:
    """Return the freed page-locked buffers to the system (PyTorch's host allocator keeps them cached)."""
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)  # torch 2.9+
    empty = empty or getattr(torch._C, "_host_emptyCache", None)  # earlier releases
    if empty is None or not torch.cuda.is_available():
        return
    empty()
    stats = torch.cuda.host_memory_stats() if hasattr(torch.cuda, "host_memory_stats") else {}
    held = next((stats[k] for k in ("reserved_bytes.current", "allocated_bytes.current") if k in stats), None)
    log.info("streaming off: the pinned host buffers went back to the system%s",
             "" if held is None else f" ({held / 2**20:.0f} MiB pinned still held)")  # fmt: skip
