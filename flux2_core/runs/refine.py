"""FLUX.2 Tiled Refine's inputs -> a checked tiled refinement (``upscale.tiled``), before any model is loaded.

The prompts must be plain (regional prompts and the ControlNet run on the sampler), their text encoder the
model's, and the picture one image whose size, cropped to multiples of 16, the sampler takes.
"""

from __future__ import annotations

import torch

from ..dit.transformer import Flux2Model
from ..errors import Flux2Error
from ..limits import MemoryNeed
from ..sampling import check_conditioning
from ..upscale.tiled import TiledRefine, tiled_memory
from .images import check_image_size
from .prompts import Prompt

WHAT = "FLUX.2 Tiled Refine"


def refine_image(
    model: Flux2Model, positive: Prompt, negative: Prompt | None, images: list[torch.Tensor]
) -> torch.Tensor:
    """The one image [H, W, 3] of ``images`` to refine, with the prompts checked for ``model``."""
    for prompt, name in ((positive, "positive"), (negative, "negative")):
        if prompt is not None:
            prompt.check_plain(WHAT, name)
    check_conditioning(model, positive.embeds)
    if len(images) != 1:
        raise Flux2Error(f"{WHAT} refines one image, got a batch of {len(images)}")
    height, width = images[0].shape[:2]
    check_image_size(width, height)
    return images[0]


def refine_memory(request: TiledRefine) -> MemoryNeed:
    """What the refinement needs beyond the weights (``tiled_memory``), and the words of a refusal."""
    what = f"tiled refine of {request.width}x{request.height} in {request.tile_size} px tiles"
    return MemoryNeed(tiled_memory(request), what, "use a smaller tile_size or a smaller image")
