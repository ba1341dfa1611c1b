"""The FLUX.1 Fill [dev] Sampler's inputs -> a checked fill run, before any model is loaded.

The sampler does what FLUX.2 Inpaint Prepare does for klein (grow the mask, crop to it, scale to about 1 MP),
checks every number at the size it samples, and says what the run needs beyond the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..dit.step_cache import StepCache
from ..editing import Stitch
from ..flux1 import FillSettings, Flux1FillModel, fill_memory
from ..limits import MAX_FILL_GUIDANCE, MemoryNeed, check_request
from .images import inpaint_crop

ADVICE = "use crop_to_mask, a smaller image or a smaller batch"


@dataclass(frozen=True, eq=False)
class FillPlan:
    """A checked fill run: the area to sample (``crop`` [h, w, 3] in 0..1 and its ``mask`` [h, w]), the
    stitch that puts the result back, the settings, the step cache and the memory the run needs."""

    crop: torch.Tensor
    mask: torch.Tensor
    stitch: Stitch
    settings: FillSettings
    step_cache: StepCache
    memory: MemoryNeed


def plan_fill(
    model: Flux1FillModel,
    image: torch.Tensor,
    mask: torch.Tensor,
    settings: FillSettings,
    grow_mask: int = 0,
    crop_to_mask: bool = False,
    context: int = 64,
    step_cache: float = 0.0,
) -> FillPlan:
    """The run of ``model`` that fills ``mask`` (1 = paint) on the one image of ``image`` [1, H, W, C]."""
    crop, crop_mask, stitch = inpaint_crop(image, mask, grow_mask, crop_to_mask, context)
    height, width = crop_mask.shape
    s = settings  # linked values skip the widget ranges: every number is checked at the sampled size
    check_request(width, height, s.steps, s.guidance, s.seed, s.batch_size, MAX_FILL_GUIDANCE)
    need = MemoryNeed(fill_memory(model, width, height, s.batch_size), f"sampling {width}x{height}", ADVICE)
    return FillPlan(crop, crop_mask, stitch, settings, StepCache(step_cache), need)
