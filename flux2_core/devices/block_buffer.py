"""One streamed block's stored tensors packed in a flat byte buffer: where each tensor sits, and its views.

Streaming copies a block to the device as one buffer (one copy, one allocation); each layer's weight and
scales are views into it. Every tensor starts at a multiple of ``ALIGN`` bytes, so each view is aligned for
any dtype.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

ALIGN = 64  # bytes: every tensor of a block's buffer starts at a multiple of this


@dataclass(frozen=True)
class Slot:
    """Where one stored tensor of a layer sits in its block's flat byte buffer."""

    role: str  # "weight" or a buffer name (weight_scale, weight_scale_2)
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    home: torch.device  # where the module kept it


def layout(layers: Iterable[tuple[object, dict[str, torch.Tensor]]]) -> tuple[list, int]:
    """(layer, its stored tensors, their slots) for each (layer, stored tensors) of a block, in order, and
    the size of the block's buffer."""
    offset, plans = 0, []
    for layer, stored in layers:
        slots = []
        for role, tensor in stored.items():
            slots.append(Slot(role, offset, tensor.nbytes, tensor.dtype, tuple(tensor.shape), tensor.device))
            offset += -(-tensor.nbytes // ALIGN) * ALIGN
        plans.append((layer, stored, slots))
    return plans, offset


def slot_views(buffer: torch.Tensor, slots: list[Slot], base: int) -> dict[str, torch.Tensor]:
    """The tensors ``slots`` describe inside ``buffer`` (which starts at byte ``base`` of the block)."""
    return {
        s.role: buffer[s.offset - base : s.offset - base + s.nbytes].view(s.dtype).view(s.shape)
        for s in slots
    }
