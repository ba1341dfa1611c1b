"""FLUX.1 Fill [dev] nodes: encode a prompt, inpaint / outpaint an image under a mask, decode.

The sampler does what Inpaint Prepare does for klein (grow the mask, crop to it, scale to about 1 MP) and
returns, beside the latent, the stitch that FLUX.2 Composite takes to put the result back over the
original, so every pixel outside the mask stays the original's. Its LATENT is native FLUX.1's
(``{"samples": [B, 16, H/8, W/8]}``, raw), which native VAE Decode decodes with ae.safetensors as well.
"""

from __future__ import annotations

from ..flux2_core import (
    MAX_BATCH,
    MAX_FILL_GUIDANCE,
    MAX_STEP_CACHE,
    MAX_STEPS,
    STEP_CACHE_HELP,
    FillConditioning,
    FillSettings,
    fill_inputs,
    plan_fill,
    sample_fill,
)
from . import convert, host, sockets, types
from .aliases import FILL
from .inputs import seed_input, tile_inputs
from .sockets import io
from .tooltips import IMAGE_OUTPUT
from .vae_runs import decode_samples, encoding

TEXT_TOOLTIP = (
    "The prompt: describe what goes into the masked area (or the whole picture). T5 reads 512 tokens (BFL's "
    "and diffusers' length); text beyond them is cut off. There is no negative prompt."
)

TOOLTIPS = {
    "model": "From FLUX.1 Fill [dev] Model Loader.",
    "positive": "The prompt, from FLUX.1 Fill [dev] Text Encode.",
    "vae": "From FLUX.1 Fill [dev] VAE Loader: encodes the image under the mask.",
    "image": "The image to inpaint (one image), or the canvas of FLUX.2 Outpaint Pad.",
    "mask": "White / 1 = paint, black / 0 = keep (Load Image's MASK, or Outpaint Pad's). Read at 0.5: a "
    "mask value of at least 0.5 is painted, so a white PNG read as 0.996 hides every pixel under it.",
    "seed": "Noise seed. The noise is drawn on the CPU (as native ComfyUI does), so a seed gives the same "
    "image on any device.",
    "steps": "50 as BFL and diffusers run it; 20-30 give usable drafts.",
    "guidance": "The guidance FLUX.1 Fill was distilled for, embedded in the model (one pass per step, no "
    "CFG): about 30. Low values (ComfyUI's usual 3.5) give blurry, washed-out fills.",
    "denoise": "1 paints the masked area from noise (the usual). Lower starts from the image itself and "
    "keeps more of it: the first steps are skipped, as in diffusers.",
    "grow_mask": "Grow the mask by this many pixels.",
    "crop_to_mask": "Sample only the mask's box plus the context, at up to about 1 megapixel (a small mask "
    "on a big image is enlarged up to 4x for detail); off: the whole image, at most 1 MP.",
    "context": "Pixels of context around the mask's box (crop_to_mask).",
    "batch_size": "Images per run, each from its own slice of one noise draw.",
}


class Flux1FillTextEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux1FillTextEncode",
            search_aliases=[*FILL, "clip text encode", "prompt"],
            display_name="FLUX.1 Fill [dev] Text Encode",
            category="flux1_fill/conditioning",
            description=(
                "Encodes a prompt for FLUX.1 Fill [dev]: T5-XXL's 512 token states and CLIP-L's pooled "
                "vector. The text encoders leave the GPU afterwards so the diffusion model has the room."
            ),
            inputs=[
                sockets.FillTextEncoder.Input(
                    "text_encoder", tooltip="From FLUX.1 Fill [dev] Text Encoder Loader."
                ),
                io.String.Input("text", tooltip=TEXT_TOOLTIP, multiline=True, dynamic_prompts=False),
            ],
            outputs=[
                sockets.FillConditioning.Output(
                    display_name="conditioning",
                    tooltip="The encoded prompt, for the FLUX.1 Fill [dev] Sampler.",
                )
            ],
        )

    @classmethod
    def execute(cls, text_encoder: types.FillTextEncoderPair, text: str) -> io.NodeOutput:
        host.load(text_encoder.patcher)
        try:
            cond = text_encoder.encoder.encode([text], interrupt=host.check_interrupt)
        finally:
            host.unload(text_encoder.patcher)  # keep it out of VRAM while the DiT samples
        device = host.intermediate_device()
        return io.NodeOutput(FillConditioning(cond.t5.to(device), cond.pooled.to(device)))


class Flux1FillSampler(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux1FillSampler",
            search_aliases=[*FILL, "inpaint", "outpaint", "ksampler", "局部重绘", "扩图"],
            display_name="FLUX.1 Fill [dev] Sampler",
            category="flux1_fill/sampling",
            description=(
                "Inpaints (or, after FLUX.2 Outpaint Pad, outpaints) with FLUX.1 Fill [dev]: the model sees "
                "the image with the masked area blanked and the mask, and paints that area. Decode the "
                "latent with FLUX.1 Fill [dev] Decode, then put it back over the original with FLUX.2 "
                "Composite (stitch)."
            ),
            inputs=[
                sockets.FillModel.Input("model", tooltip=TOOLTIPS["model"]),
                sockets.FillConditioning.Input("positive", tooltip=TOOLTIPS["positive"]),
                sockets.FillVae.Input("vae", tooltip=TOOLTIPS["vae"]),
                io.Image.Input("image", tooltip=TOOLTIPS["image"]),
                io.Mask.Input("mask", tooltip=TOOLTIPS["mask"]),
                seed_input(TOOLTIPS["seed"]),
                io.Int.Input("steps", tooltip=TOOLTIPS["steps"], default=50, min=1, max=MAX_STEPS),
                io.Float.Input(
                    "guidance",
                    tooltip=TOOLTIPS["guidance"],
                    default=30.0,
                    min=0.0,
                    max=MAX_FILL_GUIDANCE,
                    step=0.1,
                ),  # fmt: skip
                io.Float.Input(
                    "denoise",
                    optional=True,
                    tooltip=TOOLTIPS["denoise"],
                    default=1.0,
                    min=0.0,
                    max=1.0,
                    step=0.01,
                ),  # fmt: skip
                io.Int.Input(
                    "grow_mask", optional=True, tooltip=TOOLTIPS["grow_mask"], default=0, min=0, max=256
                ),
                io.Boolean.Input(
                    "crop_to_mask", optional=True, tooltip=TOOLTIPS["crop_to_mask"], default=False
                ),
                io.Int.Input(
                    "context",
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["context"],
                    default=64,
                    min=0,
                    max=2048,
                ),
                io.Int.Input(
                    "batch_size",
                    optional=True,
                    tooltip=TOOLTIPS["batch_size"],
                    default=1,
                    min=1,
                    max=MAX_BATCH,
                ),
                io.Float.Input(
                    "step_cache",
                    optional=True,
                    advanced=True,
                    tooltip=STEP_CACHE_HELP,
                    default=0.0,
                    min=0.0,
                    max=MAX_STEP_CACHE,
                    step=0.01,
                ),  # fmt: skip
            ],
            outputs=[
                io.Latent.Output(
                    display_name="latent",
                    tooltip="FLUX.1 latents [batch, 16, height/8, width/8] of the sampled area (native "
                    "FLUX.1 layout).",
                ),
                sockets.Stitch.Output(
                    display_name="stitch",
                    tooltip="For FLUX.2 Composite: the original image, the sampled box and the mask.",
                ),
            ],
        )

    @classmethod
    def execute(cls, model: types.FillModel, positive: FillConditioning, vae: types.FillVAE, image, mask,
               seed, steps, guidance, denoise=1.0, grow_mask=0, crop_to_mask=False, context=64,
               batch_size=1, step_cache=0.0):  # fmt: skip
        settings = FillSettings(seed, steps, guidance, batch_size, denoise)
        plan = plan_fill(model.core, image, mask, settings, grow_mask, crop_to_mask, context, step_cache)
        with encoding(vae, plan.mask.shape, "use crop_to_mask or a smaller image"):
            fill = fill_inputs(
                vae.vae, convert.image_to_pixels(plan.crop), plan.mask, with_source=denoise < 1.0
            )
        with host.running([model.patcher], plan.memory):
            report, interrupt = host.step_reporter(steps, latent_format="Flux"), host.check_interrupt
            samples = sample_fill(model.core, positive, fill, settings, report, interrupt, plan.step_cache)
        latent = {"samples": samples.to(host.intermediate_device())}
        return sockets.output(latent, plan.stitch, text=plan.step_cache.describe())


class Flux1FillDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux1FillDecode",
            search_aliases=[*FILL, "vae decode", "decode"],
            display_name="FLUX.1 Fill [dev] Decode",
            category="flux1_fill/latent",
            description=(
                "Decodes FLUX.1 latents (the Fill sampler's, or native FLUX.1 ones) to images with the "
                "FLUX.1 VAE: the raw decode of the sampled area; FLUX.2 Composite puts it back over the "
                "original."
            ),
            inputs=[
                sockets.FillVae.Input("vae", tooltip="From FLUX.1 Fill [dev] VAE Loader."),
                io.Latent.Input("latent", tooltip="FLUX.1 latents, e.g. from FLUX.1 Fill [dev] Sampler."),
                *tile_inputs(),
            ],
            outputs=[io.Image.Output(display_name="image", tooltip=IMAGE_OUTPUT)],
        )

    @classmethod
    def execute(cls, vae: types.FillVAE, latent: dict, tile_size: int = 0, tile_overlap: int = 64):
        samples = convert.fill_latent_samples(latent)
        return io.NodeOutput(decode_samples(vae, samples, vae.vae.downscale, tile_size, tile_overlap))
