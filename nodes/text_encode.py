"""Flux2KleinTextEncode: a prompt -> [1, 512, 3E] conditioning (Qwen3 for klein, Mistral for dev) for the
FLUX.2 Sampler."""

from __future__ import annotations

import torch

from . import host, sockets, types
from .aliases import KLEIN
from .sockets import io

TEXT_TOOLTIP = (
    "The prompt. As in BFL's and diffusers' FLUX.2, text beyond 512 tokens (chat template included) is cut "
    "off. For a negative prompt (klein base models) an empty text is the usual choice."
)


class Flux2KleinTextEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinTextEncode",
            search_aliases=[*KLEIN, "clip text encode", "prompt", "positive", "negative", "提示词"],
            display_name="FLUX.2 Text Encode",
            category="flux2_klein/conditioning",
            description=(
                "Encodes a prompt with the loaded text encoder: Qwen3 for klein (chat template, hidden "
                "states 9/18/27), Mistral Small 3.x for FLUX.2 [dev] (its system prompt, hidden states "
                "10/20/30); 512 tokens. The text encoder then leaves the GPU so the diffusion model has the "
                "room (unless it was loaded on a device of its own)."
            ),
            inputs=[
                sockets.TextEncoder.Input("text_encoder", tooltip="From FLUX.2 Text Encoder Loader."),
                io.String.Input("text", tooltip=TEXT_TOOLTIP, multiline=True, dynamic_prompts=False),
            ],
            outputs=[
                sockets.Conditioning.Output(
                    display_name="conditioning",
                    tooltip="The encoded prompt, for the sampler's positive or negative input.",
                )
            ],
        )

    @classmethod
    def execute(cls, text_encoder: types.KleinTextEncoder, text: str) -> io.NodeOutput:
        host.load(text_encoder.patcher)
        try:
            embeds = text_encoder.encoder.encode([text], interrupt=host.check_interrupt)  # [1, 512, 3E]
        finally:
            if not text_encoder.keep_loaded:  # keep it out of VRAM while the DiT samples
                host.unload(text_encoder.patcher)
        embeds = embeds.to(host.intermediate_device(), torch.float32)
        return io.NodeOutput(types.KleinConditioning(embeds, text_encoder.encoder.name, embeds.shape[-1]))
