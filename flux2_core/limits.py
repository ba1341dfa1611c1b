"""What a request may ask for, checked before any model is loaded, and whether it fits in memory.

The ranges are the sampler node's widget ranges (ComfyUI validates widget values against them; linked values
and the command line skip that, so the core checks them again here): sides 64..8192 in steps of 16, 1..200
steps, batches of 1..64, guidance 0..30, seeds 0..2^64 - 1 (ComfyUI's seed range). Memory is checked the way
ComfyUI's model manager thinks of it: the bytes a step needs against what the device has free, refusing
only a request that cannot fit rather than failing in the middle of it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from .configs import FLUX2
from .errors import Flux2Error

MAX_SIZE = 8192
MAX_STEPS = 200
MAX_BATCH = 64
MAX_GUIDANCE = 30.0
MAX_FILL_GUIDANCE = 100.0  # FLUX.1 Fill's embedded guidance (30 by default); native FluxGuidance's range
MAX_SEED = 2**64 - 1
GB = 1024**3


def check_size(width: int, height: int) -> None:
    low, multiple = FLUX2.min_size, FLUX2.size_multiple
    for name, value in (("width", width), ("height", height)):
        if not isinstance(value, int) or value < low or value > MAX_SIZE or value % multiple:
            nearest = (
                min(MAX_SIZE, max(low, int(value) // multiple * multiple)) if _is_number(value) else 1024
            )
            raise Flux2Error(
                f"{name} {value} is not allowed: use a multiple of {multiple} of at least {low} and at most "
                f"{MAX_SIZE} (e.g. {nearest})"
            )


def check_request(
    width: int,
    height: int,
    steps: int,
    guidance: float,
    seed: int,
    batch_size: int,
    max_guidance: float = MAX_GUIDANCE,
) -> None:
    """Every number of a sampling request, with the limit and what to change in the message."""
    check_size(width, height)
    if not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise Flux2Error(
            f"steps is {steps}: use 1 to {MAX_STEPS} steps (4 for distilled klein models, ~50 for base, "
            "dev and FLUX.1 Fill)"
        )
    if not isinstance(batch_size, int) or not 1 <= batch_size <= MAX_BATCH:
        raise Flux2Error(f"batch size is {batch_size}: use 1 to {MAX_BATCH} images per run")
    if not _is_number(guidance) or not math.isfinite(guidance) or not 0.0 <= guidance <= max_guidance:
        raise Flux2Error(
            f"guidance is {guidance}: use a number from 0 to {max_guidance:g} (about 4 for base and dev "
            "models, 1 for distilled and KV models, 30 for FLUX.1 Fill)"
        )
    check_seed(seed)


def check_seed(seed: int) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise Flux2Error(f"seed {seed} is out of range: use a whole number from 0 to {MAX_SEED} (2^64 - 1)")


def available_memory(device: torch.device) -> int | None:
    """Bytes free on ``device`` now (CUDA: the driver's free memory; CPU: the OS's available memory), or None
    when it cannot be told."""
    if device.type == "cuda":
        try:
            return torch.cuda.mem_get_info(device)[0]
        except (RuntimeError, AssertionError):
            return None
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    return None


def check_fits(required: int, device: torch.device, what: str, advice: str, free: int | None = None) -> None:
    """Refuse ``what`` when it needs more than the free memory of ``device`` (unknown free memory passes)."""
    free = available_memory(device) if free is None else free
    if free is not None and required > free:
        raise Flux2Error(
            f"{what} needs about {required / GB:.1f} GB but {device.type.upper()} memory has "
            f"{free / GB:.1f} GB free: {advice}"
        )


@dataclass(frozen=True)
class MemoryNeed:
    """What a run needs beyond its weights, in bytes, and how a refusal names it: ``what`` runs and the
    ``advice`` on what to change (``check_fits``'s words; a host's out-of-memory message uses them too)."""

    bytes: int
    what: str
    advice: str

    def check(self, device: torch.device, free: int | None = None) -> None:
        """Refuse the run when it cannot fit in ``device``'s free memory (``free``: bytes, else measured)."""
        check_fits(self.bytes, device, self.what, self.advice, free=free)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
