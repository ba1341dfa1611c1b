"""Which blocks of a streamed DiT stay on the device: the residency plan, from byte counts alone.

Pure arithmetic, no tensors: ``streaming.enable_streaming`` measures the blocks and carries the plan out.
The rule: the parts outside the blocks (embedders, modulation, final layer) and the blocks' small tensors
(norms) always stay and count first against the budget; then, in run order, each block whose weights still
fit stays whole (a later, smaller block may stay after a larger one was streamed); every other block is
streamed. ``next_streamed`` chains the prefetch: before position ``p`` runs (``-1``: before the first block,
while the inputs are embedded), the copy of the next streamed block after ``p`` starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ResidencyPlan:
    """Block positions in run order, resident or streamed, and the bytes each side holds."""

    resident: tuple[int, ...]
    streamed: tuple[int, ...]
    next_streamed: dict[int, int]  # position (-1: before the first block) -> the next streamed position
    resident_bytes: int  # the weights that stay in the module (and on the device)
    streamed_bytes: int  # the weights kept in CPU memory


def plan_residency(block_bytes: Sequence[int], total_bytes: int, budget: int) -> ResidencyPlan:
    """The residency plan for blocks of ``block_bytes`` (their streamable weights, in run order) in a model of
    ``total_bytes`` (every parameter and buffer), with ``budget`` bytes of weights allowed on the device."""
    if any(n < 0 for n in block_bytes) or total_bytes < sum(block_bytes):
        raise ValueError("block sizes must be non-negative and fit in the model's total")
    left = budget - (total_bytes - sum(block_bytes))
    resident, streamed = [], []
    for position, nbytes in enumerate(block_bytes):
        if nbytes <= left:
            resident.append(position)
            left -= nbytes
        else:
            streamed.append(position)
    chain = {}
    for position in range(-1, len(block_bytes)):
        upcoming = next((p for p in streamed if p > position), None)
        if upcoming is not None:
            chain[position] = upcoming
    moved = sum(block_bytes[p] for p in streamed)
    return ResidencyPlan(tuple(resident), tuple(streamed), chain, total_bytes - moved, moved)
