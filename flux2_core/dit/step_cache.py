"""First-Block Cache: a step whose first block changes the image stream as the last full step's did skips
the remaining blocks and reuses what they added then.

The rule is diffusers' ``FirstBlockCacheConfig`` (``diffusers/hooks/first_block_cache.py``, after
ParaAttention's First-Block Cache): every step runs the first block; its residual on the image stream
(output minus input: noisy tokens, and the references of the plain klein models) is compared with the one of
the last step that ran every block, as mean |r - r_prev| / mean |r_prev|. At or below the threshold the
remaining blocks are skipped and the image stream becomes the first block's output plus the residual the
remaining blocks added at that last full step; above it every block runs and both references are renewed.
The first step always runs in full. Each pass keeps its own state (with CFG: the conditional and the
unconditional one), for one run.

Only the image stream leaves the blocks (the final layer reads it alone), so only its residuals are kept:
two tensors of the image stream's size per pass. The statistic is summed in float32 over every real image
token of every process (``comm.sum_image_tokens``), so the processes of a parallel run take the same decision.
"""

from __future__ import annotations

import torch

from ..errors import Flux2Error

MAX_STEP_CACHE = 10.0  # a threshold past any step's change: only the first step would run every block
STEP_CACHE_HELP = (
    "First-Block Cache threshold: 0 (the default) runs every block of every step. Above 0, a step whose "
    "first block changes the image about as the last full step's did reuses what the other blocks added "
    "then, for fewer block runs: worth it with many steps (base models, dev, FLUX.1 Fill: try 0.05-0.2), "
    "little to gain at 4 steps. The higher, the more steps are skipped and the more the image changes."
)


def check_threshold(threshold: float) -> float:
    """``threshold`` as a float, or a Flux2Error naming the range."""
    if not 0.0 <= threshold <= MAX_STEP_CACHE:
        raise Flux2Error(
            f"step cache {threshold}: give 0 (off) or a threshold up to {MAX_STEP_CACHE:g}, e.g. 0.1"
        )
    return float(threshold)


class FirstBlockCache:
    """The state of one pass over one run. ``threshold`` 0 is no cache: every step runs every block."""

    def __init__(self, threshold: float):
        self.threshold = check_threshold(threshold)
        self.reference: torch.Tensor | None = None  # the first block's residual at the last full step
        self.head: torch.Tensor | None = None  # the first block's output of the step now running
        self.tail: torch.Tensor | None = None  # what the remaining blocks added at the last full step
        self.steps = 0  # forwards seen
        self.full_steps = 0  # forwards that ran every block

    def skip(self, before: torch.Tensor, after: torch.Tensor, comm) -> torch.Tensor | None:
        """After the first block (image stream ``before`` -> ``after``): the image stream at the end of the
        blocks when the rest may be skipped, else None (and the step will run in full)."""
        self.steps += 1
        residual = after - before
        if self.reference is not None and self.tail is not None:
            change = (residual.float() - self.reference.float()).abs().sum(-1)
            scale = self.reference.float().abs().sum(-1)
            change, scale = comm.sum_image_tokens(torch.stack([change, scale]))
            if change <= self.threshold * scale:  # mean over the same tokens on both sides
                return after + self.tail.to(after.device)
        self.reference, self.head = residual, after
        return None

    def ran_all(self, out: torch.Tensor) -> None:
        """After the last block of a full step: keep what the remaining blocks added to the image stream."""
        self.tail = out - self.head.to(out.device)
        self.head = None
        self.full_steps += 1


class StepCache:
    """The First-Block Cache of one run: a ``FirstBlockCache`` per pass of a step (2 with CFG), and what
    they did. ``threshold`` 0 is no cache (``pass_cache`` gives None: the blocks run as without it)."""

    def __init__(self, threshold: float = 0.0):
        self.threshold = check_threshold(threshold)
        self.passes: list[FirstBlockCache] = []

    @classmethod
    def of(cls, value: float | StepCache) -> StepCache:
        return value if isinstance(value, StepCache) else cls(value)

    def start(self, passes: int) -> None:
        """A new run of ``passes`` passes per step: every state starts empty."""
        self.passes = [FirstBlockCache(self.threshold) for _ in range(passes)] if self.threshold > 0 else []

    def pass_cache(self, index: int) -> FirstBlockCache | None:
        return self.passes[index] if self.passes else None

    def describe(self) -> str:
        """``"step cache 0.1: 7 of 20 steps ran every block"`` (with CFG, per pass: ``"7 and 9 of 20"``);
        ``""`` when off."""
        if not self.passes:
            return ""
        full = " and ".join(str(c.full_steps) for c in self.passes)
        return f"step cache {self.threshold:g}: {full} of {self.passes[0].steps} steps ran every block"
