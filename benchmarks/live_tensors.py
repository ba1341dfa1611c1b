"""The peak of live tensor memory during a call, counted op by op: the memory a step's tensors need, apart
from what the allocator keeps (RSS on a CPU also counts freed blocks the C allocator has not returned, and
depends on what ran before).

Every tensor an op returns is counted once per storage, from when it is made until its storage is freed;
tensors that existed before the call (weights, inputs, caches) are not counted. A view of an existing tensor
returned by an op (``weight.t()`` called outside a composite op) would look new: ``ignore`` names the storages
(a model's parameters) that are never counted. On a GPU,
``torch.cuda.max_memory_allocated`` measures the same thing without this slowdown.
"""

from __future__ import annotations

import weakref

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

_IGNORED: set[int] = set()  # storage addresses that existed before every call (``ignore``)


def ignore(tensors) -> None:
    """Never count the storages of ``tensors`` (a model's parameters: views of them are not new memory)."""
    _IGNORED.update(t.untyped_storage().data_ptr() for t in tensors)


class LiveTensors(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}  # storage address -> bytes
        self.current = self.peak = 0

    def _freed(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.live and key not in _IGNORED:
                    self.live[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    weakref.finalize(storage, self._freed, key)
        self.peak = max(self.peak, self.current)
        return out


def peak_tensor_bytes(fn) -> int:
    """Run ``fn`` once; the most bytes its new tensors held at once."""
    with LiveTensors() as live:
        fn()
    return live.peak
