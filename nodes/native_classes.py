"""The native ComfyUI classes a FLUX.2 native ``MODEL`` of ours is made of: a ``comfy.model_base.Flux2``
whose diffusion model is ours, and the ``ModelPatcher`` that refuses native weight patches.

They subclass host classes, so this module imports the host at the top and is itself imported only when a
model is converted (``native_model.native_model``); the core and the rest of the node layer never need it.
What the classes compute with (our DiT, the memory estimate) is passed in when a model is made.
"""

from __future__ import annotations

from collections.abc import Callable

import comfy.conds
import comfy.model_base
import comfy.model_patcher
import comfy.patcher_extension as ext
import comfy.supported_models
import torch

from ..flux2_core import Flux2Error
from .types import REFERENCE_STRENGTHS, REGIONAL_PROMPT, carried_regions

NATIVE_KEY = "flux2_klein"
WEIGHT_PATCHES_REFUSED = (
    "native weight patches (LoraLoaderModelOnly, model merging) cannot change a model from FLUX.2 to native "
    "MODEL: its weights are this pack's own. Load LoRAs with FLUX.2 LoRA Loader before FLUX.2 to "
    "native MODEL"
)
# (noise shape [B, 128, h, w], reference tokens, a regional prompt's token counts or None) -> bytes
MemoryEstimate = Callable[[tuple, int, list | None], int]
REGION_TOKENS = "flux2_klein_region_tokens"  # the shape native's memory planning gets for a regional prompt


class Flux2KleinNativeModel(comfy.model_base.Flux2):
    """Native FLUX.2 (latent format, model_sampling, extra_conds) around our DiT, with our memory estimate."""

    def __init__(self, config, dit: torch.nn.Module, memory_estimate: MemoryEstimate, device: torch.device):
        super().__init__(config, device=device)
        self.diffusion_model = dit
        self.memory_estimate = memory_estimate

    def extra_conds(self, **kwargs):
        out = super().extra_conds(**kwargs)
        strengths = kwargs.get(REFERENCE_STRENGTHS)
        if strengths:  # our references' strengths reach the diffusion model's call as a keyword
            out[REFERENCE_STRENGTHS] = comfy.conds.CONDConstant(tuple(strengths))
        # and our regional prompt, on the positive pass only (negative passes stay unmasked): an entry's
        # options travel with it through native nodes, so a negative made from it may carry them too
        regions = None
        if kwargs.get("prompt_type") != "negative" and kwargs.get("cross_attn") is not None:
            regions = carried_regions(kwargs["cross_attn"], kwargs)
        if regions is not None:
            out[REGIONAL_PROMPT] = comfy.conds.CONDConstant(regions)
        return out

    def extra_conds_shapes(self, **kwargs):
        """Native's shapes for planning memory, plus a regional prompt's token counts (the global prompt's
        first): the longer text it samples with."""
        out = super().extra_conds_shapes(**kwargs)
        regions = kwargs.get(REGIONAL_PROMPT)
        if regions is not None:
            out[REGION_TOKENS] = regions.token_counts
        return out

    def memory_required(self, input_shape, cond_shapes={}):  # noqa: B006  (native's signature)
        refs = cond_shapes.get("ref_latents") or []  # native's [1, 16, tokens] per batch of references
        regions = max(cond_shapes.get(REGION_TOKENS, []), key=sum, default=None)  # the longest text
        return self.memory_estimate(tuple(input_shape), sum(int(s[-1]) for s in refs), regions)


class Flux2KleinNativePatcher(comfy.model_patcher.ModelPatcher):
    def add_patches(self, patches, strength_patch=1.0, strength_model=1.0):
        # Native LoRA loading maps a file's keys to this model's (none match: its weights are not native's),
        # then adds what matched: the call comes even when nothing did.
        raise Flux2Error(WEIGHT_PATCHES_REFUSED)


def native_flux2_model(dit, *, hidden_size: int, guidance_embed: bool, dtype: torch.dtype, patchers: list,
                       memory_estimate: MemoryEstimate, outer_sample) -> Flux2KleinNativePatcher:  # fmt: skip
    """A native FLUX.2 ``MODEL`` whose ``diffusion_model`` is ``dit``.

    ``patchers`` (the weights' own) become the MODEL's additional models, so native sampling loads and keeps
    them with it; ``outer_sample`` wraps every sampling run; ``memory_estimate`` is the activation
    estimate."""
    config = comfy.supported_models.Flux2({
        "image_model": "flux2", "hidden_size": hidden_size, "in_channels": 128, "out_channels": 128,
        "patch_size": 1, "guidance_embed": guidance_embed, "disable_unet_model_creation": True,
    })  # fmt: skip
    config.set_inference_dtype(dtype, None)
    first = patchers[0]
    model = Flux2KleinNativeModel(config, dit, memory_estimate, first.offload_device)
    patcher = Flux2KleinNativePatcher(model, first.load_device, first.offload_device)
    patcher.set_additional_models(NATIVE_KEY, list(patchers))
    patcher.add_wrapper_with_key(ext.WrappersMP.OUTER_SAMPLE, NATIVE_KEY, outer_sample)
    return patcher
