"""Flux2KleinTiledRefine: an enlarged image refined by klein in tiles blended at every step (no seams, any
tile order the same result; see ``flux2_core.upscale.tiled``). The image is encoded once (tiled when it does
not fit, as FLUX.2 Encode does); the result is a LATENT for FLUX.2 Decode (tiled decode)."""

from __future__ import annotations

from ..flux2_core import (
    FLUX2,
    MAX_GUIDANCE,
    MAX_SIZE,
    MAX_STEPS,
    TILE_OVERLAP,
    TILE_SIZE,
    TiledRefine,
    encode_image,
    refine_image,
    refine_memory,
    tiled_refine,
)
from . import convert, host, sockets, types
from .aliases import KLEIN
from .inputs import seed_input
from .sockets import io
from .tooltips import SAMPLER as SAMPLER_TOOLTIPS
from .vae_runs import encoding

TOOLTIPS = {
    "model": "From FLUX.2 Model Loader (klein 4B / 9B, base, or the LoRA loader).",
    "positive": "The prompt for every tile, from FLUX.2 Text Encode: describe the picture's look (a "
    "description of one object may appear in every tile).",
    "vae": "From FLUX.2 VAE Loader: encodes the image once; its windows are the tiles' references.",
    "image": "The picture already enlarged (Upscale Image (using Model), Upscale Image By with lanczos, "
    "...). Sides are cropped to multiples of 16.",
    "seed": "Seed of the one noise field of the whole canvas.",
    "steps": "Steps of the full schedule (4 for distilled klein); denoise runs its last part.",
    "denoise": "How much of the schedule runs: 0 returns the image, 0.2-0.4 adds detail and keeps the "
    "picture, higher repaints more.",
    "tile_size": "Tile side in pixels, a multiple of 16 (1024: klein's native size). Each step denoises "
    "every tile with its window of the image as reference.",
    "tile_overlap": "Pixels neighbouring tiles share, a multiple of 16 (at most half the tile); their "
    "velocities are blended smoothly there.",
    "negative": SAMPLER_TOOLTIPS["negative"],
    "guidance": SAMPLER_TOOLTIPS["guidance"],
}


class Flux2KleinTiledRefine(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        tile = {"min": 256, "max": MAX_SIZE, "step": FLUX2.size_multiple}
        return io.Schema(
            node_id="Flux2KleinTiledRefine",
            search_aliases=[
                *KLEIN,
                "upscale",
                "tiled upscale",
                "ultimate sd upscale",
                "tiled diffusion",
                "refine",
                "hi-res fix",
                "4k",
                "放大",
                "高清修复",
            ],  # fmt: skip
            display_name="FLUX.2 Tiled Refine",
            category="flux2_klein/sampling",
            description=(
                "Refines an enlarged image with klein in tiles, without seams: one canvas and one noise "
                "field; at every step each tile is denoised with its window of the image as reference and "
                "the tiles' velocities are blended where they overlap before the step. One tile covering the "
                "image is plain img2img. Decode the result with FLUX.2 Decode."
            ),
            inputs=[
                sockets.Model.Input("model", tooltip=TOOLTIPS["model"]),
                sockets.Conditioning.Input("positive", tooltip=TOOLTIPS["positive"]),
                sockets.Vae.Input("vae", tooltip=TOOLTIPS["vae"]),
                io.Image.Input("image", tooltip=TOOLTIPS["image"]),
                seed_input(TOOLTIPS["seed"]),
                io.Int.Input("steps", tooltip=TOOLTIPS["steps"], default=4, min=1, max=MAX_STEPS),
                io.Float.Input(
                    "denoise", tooltip=TOOLTIPS["denoise"], default=0.35, min=0.0, max=1.0, step=0.01
                ),
                io.Int.Input("tile_size", tooltip=TOOLTIPS["tile_size"], default=TILE_SIZE, **tile),
                io.Int.Input(
                    "tile_overlap",
                    tooltip=TOOLTIPS["tile_overlap"],
                    default=TILE_OVERLAP,
                    min=0,
                    max=MAX_SIZE // 2,
                    step=FLUX2.size_multiple,
                ),  # fmt: skip
                sockets.Conditioning.Input("negative", optional=True, tooltip=TOOLTIPS["negative"]),
                io.Float.Input(
                    "guidance",
                    optional=True,
                    tooltip=TOOLTIPS["guidance"],
                    default=1.0,
                    min=0.0,
                    max=MAX_GUIDANCE,
                    step=0.1,
                ),  # fmt: skip
            ],
            outputs=[
                io.Latent.Output(
                    display_name="latent",
                    tooltip="The refined FLUX.2 latent of the whole image, for FLUX.2 Decode.",
                )
            ],
        )

    @classmethod
    def execute(cls, model: types.KleinModel, positive: types.KleinConditioning, vae: types.KleinVAE, image,
                seed: int, steps: int, denoise: float, tile_size: int, tile_overlap: int,
                negative: types.KleinConditioning | None = None, guidance=1.0) -> io.NodeOutput:  # fmt: skip
        negative_prompt = negative.prompt if negative is not None else None
        picture = refine_image(model.core, positive.prompt, negative_prompt, convert.image_to_list(image))
        with encoding(vae, picture.shape[:2]):
            source = encode_image(vae.vae, picture)
        request = TiledRefine(
            model.core, positive.embeds, source, steps, denoise, seed, tile_size, tile_overlap,
            negative=negative.embeds if negative is not None else None, guidance=guidance,
            callback=host.step_reporter(steps), interrupt=host.check_interrupt,
        )  # fmt: skip
        with host.running(model.patchers, refine_memory(request)):
            samples = tiled_refine(request)
        return io.NodeOutput({"samples": samples.to(host.intermediate_device())})
