"""Bridges to native ComfyUI graphs: our FLUX.2 model as a native MODEL, our conditioning as native
CONDITIONING, and native CONDITIONING back into ours.

With them a model loaded here (kept quantised, streamed, split across GPUs, with our LoRAs) is sampled by
native nodes: KSampler, SamplerCustomAdvanced with CFGGuider / BasicGuider, KSamplerSelect, Flux2Scheduler,
ReferenceLatent, EasyCache, LazyCache. The reverse direction is a node of its own
(``Flux2KleinFromNativeConditioning``) rather than a second type on our sampler's inputs, so the sampler's
sockets keep one meaning and a native text encoding is checked (one prompt, no references) where it enters.
"""

from __future__ import annotations

import torch

from ..flux2_core import TEXT_ENCODER_FOR_CONTEXT, Flux2Error
from . import host, sockets, types
from .aliases import KLEIN
from .kv_store import KV_STORE
from .native_model import native_model
from .sockets import io

CATEGORY = "flux2_klein/native"


class Flux2KleinToNativeModel(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinToNativeModel",
            search_aliases=[*KLEIN, "native", "model", "bridge", "ksampler"],
            display_name="FLUX.2 to native MODEL",
            category=CATEGORY,
            description=(
                "Our FLUX.2 model (klein, base, 9B-KV or dev, with its LoRAs, quantised weights, streaming "
                "or block split) as a native MODEL, for native samplers, guiders, schedulers and model "
                "patches such as EasyCache. Native weight patches (LoraLoaderModelOnly) are refused: load "
                "LoRAs with FLUX.2 LoRA Loader first."
            ),
            inputs=[sockets.Model.Input("model", tooltip="From FLUX.2 Model Loader (or the LoRA loader).")],
            outputs=[
                io.Model.Output(
                    display_name="model",
                    tooltip="A native MODEL that follows native FLUX.2's conventions and runs this pack's "
                    "DiT.",
                )
            ],
        )

    @classmethod
    def execute(cls, model: types.KleinModel) -> io.NodeOutput:
        return io.NodeOutput(native_model(model, KV_STORE))


class Flux2KleinToNativeConditioning(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinToNativeConditioning",
            search_aliases=[*KLEIN, "native", "conditioning", "bridge", "reference latent"],
            display_name="FLUX.2 to native CONDITIONING",
            category=CATEGORY,
            description=(
                "Our FLUX.2 conditioning as native CONDITIONING (the same embedding), for CFGGuider, "
                "ReferenceLatent, ConditioningZeroOut, FluxGuidance and the other native conditioning nodes. "
                "With references (FLUX.2 Reference Encode) they travel along, with their strengths, for a "
                "model from FLUX.2 to native MODEL."
            ),
            inputs=[
                sockets.Conditioning.Input("conditioning", tooltip="From FLUX.2 Text Encode."),
                sockets.References.Input(
                    "references",
                    optional=True,
                    tooltip="From FLUX.2 Reference Encode: added as native reference latents (as "
                    "ReferenceLatent does), with each one's strength and step range, which FLUX.2 to native "
                    "MODEL applies (native UNETLoader models ignore the strengths).",
                ),
            ],
            outputs=[
                io.Conditioning.Output(
                    display_name="conditioning",
                    tooltip="Native FLUX.2 CONDITIONING: [[embedding [1, 512, width], {pooled_output: "
                    "None}]].",
                )
            ],
        )

    @classmethod
    def execute(cls, conditioning: types.KleinConditioning, references=None) -> io.NodeOutput:
        return io.NodeOutput(conditioning.to_native(references))  # refuses a ControlNet: native cannot run it


class Flux2KleinFromNativeConditioning(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinFromNativeConditioning",
            search_aliases=[*KLEIN, "native", "conditioning", "bridge", "clip text encode"],
            display_name="FLUX.2 from native CONDITIONING",
            category=CATEGORY,
            description=(
                "Native FLUX.2 CONDITIONING (native CLIPTextEncode with a FLUX.2 text encoder) as our "
                "conditioning, for the FLUX.2 Sampler. One prompt; references go through FLUX.2 Reference "
                "Encode."
            ),
            inputs=[
                io.Conditioning.Input(
                    "conditioning",
                    tooltip="Native FLUX.2 conditioning (CLIPTextEncode with a FLUX.2 text encoder).",
                )
            ],
            outputs=[
                sockets.Conditioning.Output(
                    display_name="conditioning",
                    tooltip="The same embedding, for the FLUX.2 Sampler's positive or negative input.",
                )
            ],
        )

    @classmethod
    def execute(cls, conditioning) -> io.NodeOutput:
        return io.NodeOutput(from_native(conditioning))


def from_native(conditioning) -> types.KleinConditioning:
    """One native conditioning entry ``[embedding [B, L, width], options]`` -> ours, or a clear refusal."""
    if not isinstance(conditioning, list) or len(conditioning) != 1:
        count = len(conditioning) if isinstance(conditioning, list) else type(conditioning).__name__
        raise Flux2Error(
            f"the native conditioning holds {count} entries: connect one prompt's encoding (combined, "
            "concatenated or area conditionings have no FLUX.2 Sampler equivalent)"
        )
    embeds, options = conditioning[0][0], conditioning[0][1] if len(conditioning[0]) > 1 else {}
    if not isinstance(embeds, torch.Tensor) or embeds.ndim != 3:
        shape = list(embeds.shape) if isinstance(embeds, torch.Tensor) else type(embeds).__name__
        raise Flux2Error(f"the native conditioning's embedding has shape {shape}, not [batch, tokens, width]")
    if options.get("reference_latents"):
        raise Flux2Error(
            "the native conditioning carries reference latents (ReferenceLatent): connect the references to "
            "the FLUX.2 Sampler through FLUX.2 Reference Encode instead"
        )
    width = embeds.shape[-1]
    name = TEXT_ENCODER_FOR_CONTEXT.get(width, f"a {width // 3}-wide text encoder (native)")
    regions = types.carried_regions(embeds, options)
    if regions is not None:  # ours, on its way back: the regions travel with it
        return types.KleinConditioning(regions.global_embeds, name, width, regions=regions)
    return types.KleinConditioning(embeds.to(host.intermediate_device(), torch.float32), name, width)
