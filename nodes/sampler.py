"""Flux2KleinSampler: conditioning (+ references) -> FLUX.2 latents, with progress, previews and cancel.

The core picks the path by itself: plain Euler for distilled models, true CFG for base models with
guidance > 1, the guidance value embedded in the model for dev, and the cached reference K/V of the 9B-KV
model when references are given. A wrong text encoder for the model is refused before the model is loaded.
"""

from __future__ import annotations

import logging
from dataclasses import replace

import torch

from ..flux2_core import (
    EXTRAPOLATION_BASE,
    EXTRAPOLATION_METHODS,
    FLUX2,
    MAX_BATCH,
    MAX_GUIDANCE,
    MAX_SEED,
    MAX_SIZE,
    MAX_STEP_CACHE,
    MAX_STEPS,
    STEP_CACHE_HELP,
    AppliedControl,
    Flux2Error,
    RefKVStore,
    SampleRequest,
    SampleSettings,
    StepCache,
    check_fits,
    control_context,
    control_output_size,
    encode_reference_kv,
    estimate_memory,
    latent_mask,
    sample,
)
from ..flux2_core import position_extrapolation as extrapolation_setting
from . import convert, host, sockets, types
from .aliases import search_aliases
from .sockets import io

MIN_SIZE, SIZE_MULTIPLE = FLUX2.min_size, FLUX2.size_multiple
KV_STORE = RefKVStore()  # reference K/V of the 9B-KV model, kept across queue runs
log = logging.getLogger(__name__)

TOOLTIPS = {
    "model": "From FLUX.2 Model Loader.",
    "positive": "The prompt, from FLUX.2 Text Encode (its text encoder must be the model's).",
    "seed": "Noise seed. The noise is drawn on the CPU, so a seed gives the same image on any device.",
    "steps": "4 for distilled and KV, about 50 for base and for dev (28 is a good trade-off for dev).",
    "guidance": "base: CFG scale (about 4; above 1 it needs a negative prompt). dev: the guidance value "
    "embedded in the model (about 4; one pass per step, no negative prompt). Distilled and KV models ignore "
    "it: keep 1.",
    "width": "Output width in pixels, a multiple of 16 (at least 64). 0: the first reference's width after "
    "its pixel cap; without references the control map's at about 1 megapixel (FLUX.2 [dev] Apply "
    "ControlNet), else 1024.",
    "height": "Output height in pixels, a multiple of 16 (at least 64). 0: the first reference's height "
    "after its pixel cap; without references the control map's at about 1 megapixel, else 1024.",
    "batch_size": "Images per run (each from its own slice of one noise draw).",
    "negative": "Negative prompt for base models with guidance > 1 (an empty prompt is the usual choice). "
    "Distilled, KV and dev models do not use it.",
    "references": "Reference images to edit or combine, from FLUX.2 Reference Encode.",
    "latent": "Optional: its shape sets width, height and batch size (e.g. EmptyFlux2LatentImage). With "
    "denoise below 1 it is the image to start from (img2img, e.g. FLUX.2 Encode); with a noise_mask "
    "(FLUX.2 Inpaint Prepare, or native Set Latent Noise Mask) only the mask's area is repainted. "
    "Otherwise its content is ignored: sampling starts from pure noise.",
    "denoise": "How much of the schedule runs from the latent: 1 repaints fully (text-to-image, or inpaint "
    "from noise), lower keeps more of the latent (img2img: the first steps are skipped, as in diffusers).",
    "kv_cache": "9B-KV model only (others ignore it): reuse keeps the references' keys/values across runs, "
    "so a new prompt or seed with the same references skips the reference pass (same output as without). "
    "off: compute every run.",
    "step_cache": STEP_CACHE_HELP,
    "sigmas": "Optional: a schedule from a native node (ManualSigmas, BasicScheduler, Flux2Scheduler, ...), "
    "run as given instead of this sampler's own: steps becomes the list's steps (a final 0 is added when "
    "missing) and denoise below 1 skips the list's first steps. Values from 1 down to 0, each below the one "
    "before.",
    "position_extrapolation": "For images past extrapolation_base on a side (4 MP and beyond): dype moves "
    "the image's RoPE frequencies per axis as the noise falls (DyPE), so one pass keeps the layout of a "
    "picture larger than the model was trained on. off, or an image within the base: today's output exactly.",
    "extrapolation_base": "Pixels per side the model handles natively (klein: 2048, trained to about 4 MP); "
    "only longer sides are extrapolated.",
}


def seed_input(tooltip: str) -> io.Int.Input:
    """The noise seed every sampler node takes (the editor adds its randomize / fixed control after it)."""
    return io.Int.Input("seed", tooltip=tooltip, default=0, min=0, max=MAX_SEED, control_after_generate=True)


class Flux2KleinSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        size = {"default": 1024, "min": 0, "max": MAX_SIZE, "step": SIZE_MULTIPLE}
        return io.Schema(
            node_id="Flux2KleinSampler",
            search_aliases=search_aliases("Flux2KleinSampler"),
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
    def execute(
        cls,
        model: types.KleinModel,
        positive: types.KleinConditioning,
        seed: int,
        steps: int,
        guidance: float,
        width: int,
        height: int,
        batch_size: int,
        negative: types.KleinConditioning | None = None,
        references=None,
        latent=None,
        denoise: float = 1.0,
        kv_cache: str = "reuse",
        step_cache: float = 0.0,
        position_extrapolation: str = "off",
        extrapolation_base: int = EXTRAPOLATION_BASE,
        sigmas=None,
    ) -> io.NodeOutput:
        pending = positive.control
        by_control = None if pending is None else control_output_size(pending.control, pending.image)
        width, height, batch_size = convert.output_size(
            width, height, batch_size, references, latent, by_control
        )
        settings = SampleSettings(width, height, steps, guidance, seed, batch_size)
        if sigmas is not None:  # a native schedule, as given: its length sets the steps
            settings = settings.with_sigmas(sigmas)
        cache_rule = StepCache(step_cache)  # checked before anything is loaded
        grid = (height // SIZE_MULTIPLE, width // SIZE_MULTIPLE)
        noise_mask = latent.get("noise_mask") if isinstance(latent, dict) else None
        editing = latent is not None and (denoise < 1.0 or noise_mask is not None)
        start = convert.latent_samples(latent) if editing else None  # else the core says what is missing
        mask = latent_mask(noise_mask, grid, batch_size) if noise_mask is not None else None
        # every number (linked values skip the widget ranges), the text encoder (the model's: dev: Mistral,
        # klein: its Qwen3) and the edit inputs are checked here, before the model is loaded
        if negative is not None and negative.regions is not None:
            raise Flux2Error("the negative prompt cannot be regional: connect one FLUX.2 Text Encode to it")
        if negative is not None and negative.control is not None:
            raise Flux2Error("connect FLUX.2 [dev] Apply ControlNet to the positive prompt (it steers both)")
        control = applied_control(positive.control, height, width)
        request = SampleRequest(
            model.core,
            positive.embeds,
            settings,
            regions=positive.regions,
            negative=negative.embeds if negative is not None else None,
            references=references,
            interrupt=host.check_interrupt,
            start=start,
            strength=denoise,
            mask=mask,
            step_cache=cache_rule,
            control=control,
            extrapolation=extrapolation_setting(position_extrapolation, extrapolation_base),
        )
        net = control.net if control is not None else None
        required = estimate_memory(model.core, settings, references, positive.regions, net)
        patchers = [*model.patchers, *([pending.control_net.patcher] if control is not None else [])]
        host.load_all(patchers, required)  # every device of a block split: each needs the activations
        tokens = references.num_tokens if references is not None else 0
        what = f"sampling {width}x{height}" + (
            f" with {len(references)} references ({tokens} tokens)" if tokens else ""
        )
        advice = "lower width/height, the batch size, the number of references or their max_megapixels"
        for device in dict.fromkeys(p.load_device for p in model.patchers):
            check_fits(required, device, what, advice, free=host.free_memory(device))
        with host.out_of_memory(what, advice):
            reference_kv = cls._reference_kv(model.core, references, kv_cache)
            report = host.step_reporter(settings.steps)
            samples = sample(replace(request, kv_cache=reference_kv, callback=report))
        out = {"samples": samples.to(host.intermediate_device())}
        if noise_mask is not None:  # kept, as native samplers keep it, for a second (refining) pass
            out["noise_mask"] = noise_mask
        return sockets.output(out, text=cache_rule.describe())

    @staticmethod
    def _reference_kv(model, references, mode: str):
        """The KV model's reference K/V: from the store when these references ran before on this model."""
        if not model.variant.kv_cache or references is None or not len(references):
            return None
        compute = lambda: encode_reference_kv(model, references)  # noqa: E731
        if mode == "off":
            return compute()
        cache, reused = KV_STORE.get(model, references, compute)
        log.info("reference K/V %s (%d entries, %.2f GB kept)", "reused from the cache" if reused else
                 "computed", len(KV_STORE), KV_STORE.nbytes / 2**30)  # fmt: skip
        return cache


def applied_control(pending: types.PendingControl | None, height: int, width: int):
    """The ``AppliedControl`` of a conditioning's pending control at the sampler's output size."""
    if pending is None:
        return None
    host.load(pending.vae.patcher)
    with torch.inference_mode():
        context = control_context(
            pending.vae.vae, height, width, pending.control, pending.mask, pending.image
        )
    return AppliedControl(pending.control_net.net, context, pending.strength, pending.start, pending.end)
