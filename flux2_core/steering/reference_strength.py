"""How much each reference counts: a strength s >= 0 per reference, optionally for a part of the steps only.

The rule, in every joint-attention call of every block: the logits of every query against the keys of
reference k get ``+ log(s_k)``. That scales reference k's share of each softmax by s_k before the
renormalisation: s = 1 is today's attention, s = 0 gives its keys no weight at all, so the reference then
reaches no other token in any block (tokens only reach each other through attention) and the result is the
run without it. Outside its step range (``start`` / ``end``, fractions of the schedule's steps: step i of n
is in it when ``start <= i / n < end``) a reference counts as s = 0.

Exact by construction:

- every reference at s = 1 for a step: the call is today's, with no bias (bit for bit);
- every reference at s = 0 for a step: the call is the text-to-image one, without the references (bit for
  bit); with some at 0 and others not, the keys at 0 are masked (``-inf``);
- otherwise the bias is one value per reference key, the same for every query, head and block.

The KV model's cache is computed from the references alone and depends on no strength: the bias applies to
the cached keys, so one cache serves every strength and step range. Both CFG passes of a base model see the
same strengths (the reference is part of what the model is conditioned on in both).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..errors import Flux2Error

MAX_STRENGTH = 10.0  # far beyond any useful weight: log(10) already outweighs most logit gaps


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_strength(s, what: str, zero: str) -> None:
    """A strength from 0 (``zero``: what 0 does) to ``MAX_STRENGTH``, 1 being plain; else a named error."""
    if not _number(s) or not 0.0 <= s <= MAX_STRENGTH:
        raise Flux2Error(
            f"{what} {s} is not allowed: use a number from 0 ({zero}) to {MAX_STRENGTH:g}, 1 being plain"
        )


@dataclass(frozen=True)
class ReferenceStrength:
    """One reference's strength ``strength`` over the steps ``start <= i / n < end``, 0 outside them."""

    strength: float = 1.0
    start: float = 0.0
    end: float = 1.0

    def __post_init__(self) -> None:
        start, end = self.start, self.end
        check_strength(self.strength, "reference strength", "ignore the reference")
        if not (_number(start) and _number(end) and 0.0 <= start <= end <= 1.0):
            raise Flux2Error(
                f"reference step range start {start}, end {end} is not allowed: use fractions of the steps "
                "with 0 <= start <= end <= 1 (0 and 1: every step)"
            )

    @property
    def plain(self) -> bool:
        """Strength 1 at every step: today's edit."""
        return self.strength == 1.0 and self.start == 0.0 and self.end == 1.0

    def at(self, step: int, steps: int) -> float:
        """The strength at step ``step`` (0-based) of a schedule of ``steps``."""
        return self.strength if in_step_range(self.start, self.end, step, steps) else 0.0


PLAIN = ReferenceStrength()


def in_step_range(start: float, end: float, step: int, steps: int) -> bool:
    """Whether step ``step`` (0-based) of ``steps`` lies in the range: ``start <= step / steps < end``, as
    written (``start * steps <= step`` rounds differently: 0.28 * 25 is 7.000000000000001)."""
    return start <= step / steps < end


def check_steps_reached(what: str, start: float, end: float, run: range, steps: int) -> None:
    """Refuses a step range that holds none of the steps that run (``run``, of a schedule of ``steps``):
    what it steers would count at no step, the run being the one without it."""
    if not any(in_step_range(start, end, i, steps) for i in run):
        skipped = f", the first {run.start} skipped by denoise" if run.start else ""
        raise Flux2Error(
            f"{what} counts at none of the {steps} steps{skipped}: step i counts when start <= i / {steps} < "
            f"end, and start {start:g}, end {end:g} holds none of the steps that run (i / {steps} from "
            f"{run.start / steps:g} to {(run.stop - 1) / steps:g}); widen the range or use more steps"
        )


def strengths_at(strengths, step: int, steps: int) -> list[float]:
    return [s.at(step, steps) for s in strengths]


SCHEDULE_TOLERANCE = 1e-4  # relative: a call's sigma arrives in the model's dtype (float32 in native graphs)


def step_of(schedule, sigma: float) -> int:
    """The step of a schedule (its sigmas, from 1 down to 0) that runs at noise level ``sigma``: the one that
    starts at it, or, for a sampler's call between two sigmas (midpoint and second-order samplers), the step
    that runs from the sigma above it down to the next."""
    values, sigma = [float(s) for s in schedule], float(sigma)
    nearest = min(range(len(values)), key=lambda i: abs(values[i] - sigma))
    if abs(values[nearest] - sigma) <= SCHEDULE_TOLERANCE * max(abs(sigma), 1e-3):
        return nearest
    return max((i for i, v in enumerate(values[:-1]) if v > sigma), default=0)


def at_step(
    strengths, token_counts, step: int, steps: int, dtype, device
) -> tuple[bool, torch.Tensor | None]:
    """(whether the references take part in step ``step`` of ``steps``, the bias of their keys or None)."""
    values = strengths_at(strengths, step, steps)
    if all(v == 0.0 for v in values):
        return False, None
    return True, key_bias(values, token_counts, dtype, device)


def key_bias(values: list[float], token_counts: list[int], dtype, device) -> torch.Tensor | None:
    """The bias of every reference key [R] for per-reference strengths ``values`` (``log s``; ``-inf`` at
    0), or None when every value is 1 (no bias: the plain call). Callers drop the references themselves when
    every value is 0."""
    if all(v == 1.0 for v in values):
        return None
    logs = [math.log(v) if v > 0 else -math.inf for v in values]
    parts = [torch.full((n,), b, dtype=torch.float32) for b, n in zip(logs, token_counts)]
    return torch.cat(parts).to(device, dtype)


def check_strengths(strengths, count: int) -> None:
    if len(strengths) != count:
        raise Flux2Error(
            f"{len(strengths)} reference strengths for {count} references: give one per reference, in order, "
            "or one for all"
        )
