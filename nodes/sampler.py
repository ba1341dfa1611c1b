"""Flux2KleinSampler: conditioning (+ references) -> FLUX.2 latents, with progress, previews and cancel.

The core picks the path by itself: plain Euler for distilled models, true CFG for base models with
guidance > 1, the guidance value embedded in the model for dev, and the cached reference K/V of the 9B-KV
model when references are given. A wrong text encoder for the model is refused before the model is loaded.
"""

from __future__ import annotations

from ..flux2_core import (
    EXTRAPOLATION_BASE,
    EXTRAPOLATION_METHODS,
    FLUX2,
    MAX_BATCH,
    MAX_GUIDANCE,
    MAX_SIZE,
    MAX_STEP_CACHE,
    MAX_STEPS,
    SamplerInputs,
    plan_sampling,
)
from . import convert, host, sockets, types
from .aliases import KLEIN
from .inputs import seed_input
from .kv_store import KV_STORE
from .sockets import io
from .tooltips import SAMPLER as TOOLTIPS

MIN_SIZE, SIZE_MULTIPLE = FLUX2.min_size, FLUX2.size_multiple


class Flux2KleinSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        size = {"default": 1024, "min": 0, "max": MAX_SIZE, "step": SIZE_MULTIPLE}
        return io.Schema(
            node_id="Flux2KleinSampler",
            search_aliases=[
                *KLEIN,
                "ksampler",
                "sampler",
                "generate",
                "text to image",
                "txt2img",
                "edit",
                "img2img",
                "采样器",
            ],  # fmt: skip
            display_name="FLUX.2 Sampler",
            category="flux2_klein/sampling",
            description=(
                "Generates FLUX.2 latents (klein and dev): text-to-image, editing when references are "
                "connected, img2img with a latent and denoise below 1, inpainting with a latent that carries "
                "a noise mask. Decode the result with FLUX.2 Decode (or native VAEDecode with the FLUX.2 "
                "VAE)."
            ),
            inputs=[
                sockets.Model.Input("model", tooltip=TOOLTIPS["model"]),
                sockets.Conditioning.Input("positive", tooltip=TOOLTIPS["positive"]),
                seed_input(TOOLTIPS["seed"]),
                io.Int.Input("steps", tooltip=TOOLTIPS["steps"], default=4, min=1, max=MAX_STEPS),
                io.Float.Input(
                    "guidance", tooltip=TOOLTIPS["guidance"], default=1.0, min=0.0, max=MAX_GUIDANCE, step=0.1
                ),
                io.Int.Input("width", tooltip=TOOLTIPS["width"], **size),
                io.Int.Input("height", tooltip=TOOLTIPS["height"], **size),
                io.Int.Input("batch_size", tooltip=TOOLTIPS["batch_size"], default=1, min=1, max=MAX_BATCH),
                sockets.Conditioning.Input("negative", optional=True, tooltip=TOOLTIPS["negative"]),
                sockets.References.Input("references", optional=True, tooltip=TOOLTIPS["references"]),
                io.Latent.Input("latent", optional=True, tooltip=TOOLTIPS["latent"]),
                io.Float.Input(
                    "denoise",
                    optional=True,
                    tooltip=TOOLTIPS["denoise"],
                    default=1.0,
                    min=0.0,
                    max=1.0,
                    step=0.01,
                ),  # fmt: skip
                io.Combo.Input(
                    "kv_cache",
                    options=["reuse", "off"],
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["kv_cache"],
                    default="reuse",
                ),  # fmt: skip
                io.Float.Input(
                    "step_cache",
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["step_cache"],
                    default=0.0,
                    min=0.0,
                    max=MAX_STEP_CACHE,
                    step=0.01,
                ),  # fmt: skip
                io.Combo.Input(
                    "position_extrapolation",
                    options=list(EXTRAPOLATION_METHODS),
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["position_extrapolation"],
                    default="off",
                ),  # fmt: skip
                io.Int.Input(
                    "extrapolation_base",
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["extrapolation_base"],
                    default=EXTRAPOLATION_BASE,
                    min=256,
                    max=MAX_SIZE,
                    step=SIZE_MULTIPLE,
                ),  # fmt: skip
                io.Sigmas.Input("sigmas", optional=True, tooltip=TOOLTIPS["sigmas"]),
            ],
            outputs=[
                io.Latent.Output(
                    display_name="latent",
                    tooltip="FLUX.2 latents [batch, 128, height/16, width/16], the layout of native FLUX.2 "
                    "latents.",
                )
            ],
        )

    @classmethod
    def validate_inputs(cls, width=None, height=None):
        # Naming these arguments turns off ComfyUI's min/max check for them, so the range is checked here.
        # A linked (not widget) value arrives as None and is checked by the core at run time.
        for name, value in (("width", width), ("height", height)):
            if value is None or value == 0:
                continue
            if value < MIN_SIZE or value > MAX_SIZE or value % SIZE_MULTIPLE:
                return (
                    f"{name} {value} is not allowed: use 0 (from the first reference) or a multiple of "
                    f"{SIZE_MULTIPLE} from {MIN_SIZE} to {MAX_SIZE}"
                )
        return True

    @classmethod
    def execute(cls, model: types.KleinModel, positive: types.KleinConditioning, seed: int, steps: int,
                guidance: float, width: int, height: int, batch_size: int,
                negative: types.KleinConditioning | None = None, references=None, latent=None, denoise=1.0,
                kv_cache="reuse", step_cache=0.0, position_extrapolation="off",
                extrapolation_base=EXTRAPOLATION_BASE, sigmas=None) -> io.NodeOutput:  # fmt: skip
        numbers = SamplerInputs(seed, steps, guidance, width, height, batch_size, denoise, step_cache,
                                position_extrapolation, extrapolation_base, sigmas)  # fmt: skip
        noise_mask = convert.noise_mask(latent)
        plan = plan_sampling(
            model.core,
            positive.prompt,
            numbers,
            negative=negative.prompt if negative is not None else None,
            references=references,
            latent=convert.latent_samples(latent) if latent is not None else None,
            noise_mask=noise_mask,
            kv_store=None if kv_cache == "off" else KV_STORE,  # 9B-KV only: the references' K/V kept
        )
        control = [positive.control.patcher] if positive.control is not None else []
        with host.running([*model.patchers, *control], plan.memory, checked=model.patchers):
            samples = plan.run(host.step_reporter(plan.steps), host.check_interrupt)
        out = {"samples": samples.to(host.intermediate_device())}
        if noise_mask is not None:  # kept, as native samplers keep it, for a second (refining) pass
            out["noise_mask"] = noise_mask
        return sockets.output(out, text=plan.step_cache.describe())
