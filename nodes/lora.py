"""Flux2KleinLoraLoader: a LoRA on a FLUX.2 model, klein or dev (and its text encoder), at compute time.

The base weights are never changed: the LoRA travels with the returned model and is added on top while it
samples (on quantised bases too: fp8, nvfp4, int8 and GGUF stay quantised). The input model keeps working
without it, and both share one copy of the weights in memory. Chain loaders for several LoRAs. A LoRA made
for another FLUX.2 model (klein 4B, klein 9B, dev) is refused by name before anything is patched.
"""

from __future__ import annotations

import dataclasses

from ..flux2_core import Flux2Error, parse_block_strengths, prepare_lora, read_lora
from . import sockets
from .aliases import KLEIN
from .inputs import file_choices, file_path
from .sockets import io

MAX_STRENGTH = 10.0

TOOLTIPS = {
    "model": "A FLUX.2 model (klein or dev) from FLUX.2 Model Loader (or another LoRA loader, to chain "
    "LoRAs).",
    "lora_name": "A LoRA .safetensors from models/loras, in any common layout (ai-toolkit, kohya / musubi, "
    "diffusers / PEFT, fal, OneTrainer, DiffSynth, LyCORIS LoKr / LoHa, DoRA). It must be made for this "
    "model: a 9B LoRA does not fit klein 4B, a klein LoRA does not fit dev.",
    "strength": "How strongly the LoRA applies: 1 = as trained, 0 = off, negative values invert it.",
    "block_strengths": "Optional multipliers per block group on top of strength, comma separated: double, "
    "double.img, double.txt, single, other, each optionally with a block number or range, e.g. "
    "'double=1.0, single.0-11=0.5, other=0'. Later entries win. Empty: 1 everywhere.",
    "text_encoder": "Optional: connect the text encoder to apply the LoRA's text-encoder part, if any.",
}


class Flux2KleinLoraLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinLoraLoader",
            search_aliases=[*KLEIN, "lora", "load lora", "lycoris", "lokr", "refcontrol"],
            display_name="FLUX.2 LoRA Loader",
            category="flux2_klein/loaders",
            description=(
                "Applies a LoRA to a FLUX.2 model, klein or dev (and, for LoRAs that carry one, to its text "
                "encoder). The report says which keys matched, which did not and which layers were touched."
            ),
            inputs=[
                sockets.Model.Input("model", tooltip=TOOLTIPS["model"]),
                io.Combo.Input("lora_name", options=file_choices("loras"), tooltip=TOOLTIPS["lora_name"]),
                io.Float.Input(
                    "strength",
                    tooltip=TOOLTIPS["strength"],
                    default=1.0,
                    min=-MAX_STRENGTH,
                    max=MAX_STRENGTH,
                    step=0.01,
                ),  # fmt: skip
                io.String.Input(
                    "block_strengths",
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["block_strengths"],
                    default="",
                    multiline=False,
                ),  # fmt: skip
                sockets.TextEncoder.Input("text_encoder", optional=True, tooltip=TOOLTIPS["text_encoder"]),
            ],
            outputs=[
                sockets.Model.Output(
                    display_name="model",
                    tooltip="The model with the LoRA, for the sampler or another LoRA loader.",
                ),
                io.String.Output(
                    display_name="report",
                    tooltip="What matched: connect it to a Preview Any node to read it.",
                ),
                sockets.TextEncoder.Output(
                    display_name="text_encoder",
                    tooltip="The text encoder with the LoRA's text-encoder part (the input one when none is "
                    "connected).",
                ),
            ],
        )

    @classmethod
    def validate_inputs(cls, block_strengths=None):
        if block_strengths:  # linked values arrive as None and are checked at run time
            try:
                parse_block_strengths(block_strengths)
            except Flux2Error as e:
                return str(e)
        return True

    @classmethod
    def execute(
        cls, model, lora_name: str, strength: float, block_strengths: str = "", text_encoder=None
    ) -> io.NodeOutput:
        if not -MAX_STRENGTH <= strength <= MAX_STRENGTH:
            raise Flux2Error(
                f"strength {strength} is out of range: use -{MAX_STRENGTH:g} to {MAX_STRENGTH:g}"
            )
        lora_file = read_lora(file_path("loras", lora_name))
        encoder = text_encoder.encoder.model if text_encoder is not None else None
        lora = prepare_lora(
            lora_file, model.core.transformer, encoder, strength, block_strengths or None, name=lora_name
        )
        report = lora.report.text()  # also in the log, from prepare_lora
        patched = dataclasses.replace(model, core=model.core.with_lora(lora))  # the same weights, shared
        if text_encoder is not None:
            text_encoder = dataclasses.replace(text_encoder, encoder=text_encoder.encoder.with_lora(lora))
        return sockets.output(patched, report, text_encoder, text=report)
