"""Flux2KleinTextEncode: a prompt -> [1, 512, 3E] Qwen3 conditioning for the FLUX.2 [klein] Sampler."""

from __future__ import annotations

import torch

from . import host, types
from .types import socket

TEXT_TOOLTIP = (
    "The prompt. As in BFL's and diffusers' FLUX.2 [klein], text beyond 512 tokens (chat template included) "
    "is cut off. For a negative prompt an empty text is the usual choice."
)


class Flux2KleinTextEncode:
    DESCRIPTION = (
        "Encodes a prompt with the Qwen3 text encoder (chat template, 512 tokens, hidden states 9/18/27). "
        "The text encoder leaves the GPU afterwards so the diffusion model has the room."
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
                "text_encoder": socket(types.TEXT_ENCODER, "From FLUX.2 [klein] Text Encoder Loader."),
                "text": socket("STRING", TEXT_TOOLTIP, multiline=True, dynamicPrompts=False),
            },
        }

    def encode(self, text_encoder: types.KleinTextEncoder, text: str):
        host.load(text_encoder.patcher)
        try:
            embeds = text_encoder.encoder.encode([text], interrupt=host.check_interrupt)  # [1, 512, 3E]
        finally:
            host.unload(text_encoder.patcher)  # keep it out of VRAM while the DiT samples
        embeds = embeds.to(host.intermediate_device(), torch.float32)
        return (types.KleinConditioning(embeds, text_encoder.encoder.name, embeds.shape[-1]),)
