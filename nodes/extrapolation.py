"""Flux2KleinPositionExtrapolation: position extrapolation (DyPE) on a native MODEL from our bridge, so
native samplers (KSampler, SamplerCustomAdvanced) render past the base size as the FLUX.2 Sampler's
``position_extrapolation`` option does. The setting travels in the MODEL's transformer options, which native
sampling hands to our DiT at every call with the current sigma."""

from __future__ import annotations

from ..flux2_core import (
    EXTRAPOLATION_BASE,
    EXTRAPOLATION_METHODS,
    MAX_SIZE,
    Flux2Error,
    position_extrapolation,
)
from .aliases import KLEIN
from .native_model import EXTRAPOLATION_OPTION, NativeDiT
from .sockets import io
from .tooltips import SAMPLER as TOOLTIPS


class Flux2KleinPositionExtrapolation(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinPositionExtrapolation",
            search_aliases=[
                *KLEIN,
                "dype",
                "high resolution",
                "hi-res",
                "4k",
                "upscale",
                "rope",
                "ntk",
                "yarn",
                "高分辨率",
            ],  # fmt: skip
            display_name="FLUX.2 Position Extrapolation",
            category="flux2_klein/native",
            description=(
                "Position extrapolation (DyPE) for native samplers: a model from FLUX.2 to native MODEL "
                "renders images past extrapolation_base per side in one pass, as the FLUX.2 Sampler's "
                "position_extrapolation option does (the same result). Within the base it changes nothing."
            ),
            inputs=[
                io.Model.Input("model", tooltip="From FLUX.2 to native MODEL (or a native patch after it)."),
                io.Combo.Input(
                    "position_extrapolation",
                    options=list(EXTRAPOLATION_METHODS),
                    default="dype",
                    tooltip=TOOLTIPS["position_extrapolation"],
                ),
                io.Int.Input(
                    "extrapolation_base",
                    default=EXTRAPOLATION_BASE,
                    min=256,
                    max=MAX_SIZE,
                    step=16,
                    tooltip=TOOLTIPS["extrapolation_base"],
                ),
            ],
            outputs=[
                io.Model.Output(
                    display_name="model",
                    tooltip="The same model with position extrapolation set, for native samplers.",
                )
            ],
        )

    @classmethod
    def execute(cls, model, position_extrapolation: str, extrapolation_base: int) -> io.NodeOutput:
        return io.NodeOutput(extrapolated_model(model, position_extrapolation, extrapolation_base))


def extrapolated_model(model, method: str, base: int):
    """A clone of the native ``model`` (made by FLUX.2 to native MODEL) with the extrapolation in its
    transformer options."""
    setting = position_extrapolation(method, base)
    diffusion_model = getattr(getattr(model, "model", None), "diffusion_model", None)
    if not isinstance(diffusion_model, NativeDiT):
        raise Flux2Error(
            "FLUX.2 Position Extrapolation needs a model from FLUX.2 to native MODEL (native FLUX.2 "
            "models have no such option here): load it with FLUX.2 Model Loader and convert it with FLUX.2 "
            "to native MODEL"
        )
    patched = model.clone()
    options = dict(patched.model_options.get("transformer_options", {}))
    options[EXTRAPOLATION_OPTION] = setting
    patched.model_options["transformer_options"] = options
    return patched
