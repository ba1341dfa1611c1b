"""Flux2KleinTextEncode: a prompt -> [1, 512, 3E] conditioning (Qwen3 for klein, Mistral for dev) for the
FLUX.2 Sampler."""

from __future__ import annotations

import torch

from . import host, types
from .types import socket

TEXT_TOOLTIP = (
    "The prompt. As in BFL's and diffusers' FLUX.2, text beyond 512 tokens (chat template included) is cut "
    "off. For a negative prompt (klein base models) an empty text is the usual choice."
)


class Flux2KleinTextEncode:
    DESCRIPTION = (
        "Encodes a prompt with the loaded text encoder: Qwen3 for klein (chat template, hidden states "
        "9/18/27), Mistral Small 3.x for FLUX.2 [dev] (its system prompt, hidden states 10/20/30); 512 "
        "tokens. The text encoder then leaves the GPU so the diffusion model has the room (unless it was "
        "loaded on a device of its own)."
    )
    CATEGORY = "flux2_klein/conditioning"
    RETURN_TYPES = (types.CONDITIONING,)
    RETURN_NAMES = ("conditioning",)
    OUTPUT_TOOLTIPS = ("The encoded prompt, for the sampler's positive or negative input.",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "text_encoder": socket(types.TEXT_ENCODER, "From FLUX.2 Text Encoder Loader."),
                "text": socket("STRING", TEXT_TOOLTIP, multiline=True, dynamicPrompts=False),
            },
        }

    def encode(self, text_encoder: types.KleinTextEncoder, text: str):
        host.load(text_encoder.patcher)
        try:
            embeds = text_encoder.encoder.encode([text], interrupt=host.check_interrupt)  # [1, 512, 3E]
        finally:
            if not text_encoder.keep_loaded:  # keep it out of VRAM while the DiT samples
                host.unload(text_encoder.patcher)
        embeds = embeds.to(host.intermediate_device(), torch.float32)
        return (types.KleinConditioning(embeds, text_encoder.encoder.name, embeds.shape[-1]),)
