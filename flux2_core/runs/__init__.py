"""A run as a host asks for it: what its user set (sides left at 0, a latent with a noise mask, a prompt that
carries regions or a ControlNet, an image batch, a cache choice) turned into a checked run with the memory it
needs, before any model is loaded. The ComfyUI nodes call these and add only what the host does: load the
models, check the free memory of their devices, report progress.

``prompts`` (a prompt with its regions and ControlNet), ``images`` (images to crop and encode), ``sampler``
(the FLUX.2 sampler's run), ``refine`` (tiled refinement), ``fill`` (FLUX.1 Fill).
"""

from .fill import FillPlan, plan_fill
from .images import check_image_size, encode_image, encode_images, inpaint_crop, reference_encode_memory
from .prompts import ControlSource, Prompt
from .refine import refine_image, refine_memory
from .sampler import SamplerInputs, SamplingPlan, plan_sampling, reference_kv

__all__ = [
    "ControlSource",
    "FillPlan",
    "Prompt",
    "SamplerInputs",
    "SamplingPlan",
    "check_image_size",
    "encode_image",
    "encode_images",
    "inpaint_crop",
    "plan_fill",
    "plan_sampling",
    "reference_encode_memory",
    "reference_kv",
    "refine_image",
    "refine_memory",
]
