"""Host memory for streamed blocks: one arena per streamed model.

The arena is one ordinary CPU allocation holding every streamed block at a page-aligned offset. On a CUDA
machine each block's range is page-locked in place with ``cudaHostRegister``, so its copies to the GPU are
asynchronous DMA. Each range is locked at its exact size: PyTorch's pinned allocator rounds every buffer up
to a power of two, which costs about 23% more page-locked memory for klein 9B's blocks (832 and 416 MiB
become 1 and 0.5 GiB), and it keeps freed buffers cached instead of returning them to the system.

When streaming ends the ranges are unlocked and the weights stay where they are, in ordinary memory, so
turning streaming off copies nothing. When a streamed model is dropped its arena is unlocked and freed with
it. A range the system refuses to lock stays ordinary memory: its block is still streamed, with synchronous
copies, and the log says so.
"""

from __future__ import annotations

import logging
import mmap
import weakref

import torch

log = logging.getLogger(__name__)

PAGE = mmap.PAGESIZE
_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every CUDA device, not just the current one
_LOCKED = {"bytes": 0}  # page-locked by every arena alive in this process


class CudaRegistrar:
    """Page-locks and unlocks ranges of ordinary host memory through the CUDA runtime."""

    def register(self, ptr: int, nbytes: int) -> bool:
        return torch.cuda.cudart().cudaHostRegister(ptr, nbytes, _PORTABLE) == 0

    def unregister(self, ptr: int) -> bool:
        return torch.cuda.cudart().cudaHostUnregister(ptr) == 0


def registrar() -> CudaRegistrar | None:
    """What page-locks memory on this machine, or None where nothing can (no CUDA device)."""
    if not torch.cuda.is_available():
        return None
    runtime = torch.cuda.cudart()
    if not hasattr(runtime, "cudaHostRegister"):
        return None
    return CudaRegistrar()


def locked_bytes() -> int:
    """Host memory page-locked by the streamed models alive in this process."""
    return _LOCKED["bytes"]


class HostArena:
    """The CPU memory of one model's streamed blocks: ``block(i)`` is block i's uint8 buffer, ``pinned(i)``
    whether it is page-locked (by ``lock``, a ``registrar()``; None: never). ``nbytes``: the whole
    allocation (the blocks, each rounded up to a page)."""

    def __init__(self, sizes: list[int], lock: CudaRegistrar | None):
        spans, offset = [], 0
        for size in sizes:
            spans.append((offset, size))
            offset += -(-max(size, 1) // PAGE) * PAGE
        self.nbytes = offset
        self._buffer = torch.empty(offset + PAGE, dtype=torch.uint8)
        base = -self._buffer.data_ptr() % PAGE  # the first page boundary inside the allocation
        self._blocks = [self._buffer[base + start : base + start + size] for start, size in spans]
        self._locked: list[tuple[int, int]] = []  # (pointer, bytes) of each page-locked block
        self._pinned: set[int] = set()  # the indices of the page-locked blocks
        self._lock = lock
        self._finalizer = weakref.finalize(self, _unlock, self._lock, self._locked)

    def block(self, index: int) -> torch.Tensor:
        return self._blocks[index]

    def pin(self) -> None:
        """Page-lock every block (once their weights are in): the ones the system refuses stay ordinary."""
        if self._lock is None:
            return
        refused = 0
        for index, view in enumerate(self._blocks):
            ptr, nbytes = view.data_ptr(), -(-max(view.numel(), 1) // PAGE) * PAGE
            if self._lock.register(ptr, nbytes):
                self._locked.append((ptr, nbytes))
                self._pinned.add(index)
                _LOCKED["bytes"] += nbytes
            else:
                refused += nbytes
        if refused:
            log.warning(
                "could not page-lock %d MiB for streaming: those blocks stream from ordinary memory, with "
                "slower copies (free host memory, or lower the resident part's size)", refused >> 20
            )  # fmt: skip

    def pinned(self, index: int) -> bool:
        return index in self._pinned

    def unpin(self) -> None:
        """Unlock every block now; the buffers stay, in ordinary memory."""
        self._finalizer()
        self._pinned.clear()


def _unlock(lock: CudaRegistrar | None, locked: list[tuple[int, int]]) -> None:
    """Unlock ``locked`` (an arena's ranges) before its memory can go back to the allocator (streaming
    turned off, or the streamed model dropped); the log says how much, and what streamed models still hold."""
    given = sum(n for _, n in locked)
    while locked:
        ptr, nbytes = locked.pop()
        _LOCKED["bytes"] -= nbytes
        try:
            ok = lock.unregister(ptr)
        except Exception:  # the CUDA runtime is already gone at interpreter exit: nothing left to unlock
            ok = True
        if not ok:
            log.warning("could not unlock %d MiB of streamed host memory", nbytes >> 20)
    if given:
        log.info(
            "streamed blocks: %d MiB of page-locked host memory unlocked (%d MiB still locked by other "
            "streamed models)", given >> 20, _LOCKED["bytes"] >> 20
        )  # fmt: skip
