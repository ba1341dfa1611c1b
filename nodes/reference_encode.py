"""Flux2KleinReferenceEncode: images -> reference latents for editing (chainable, order kept)."""

from __future__ import annotations

from ..flux2_core import (
    FIT_MODES,
    MAX_REFERENCE_PIXELS,
    MAX_REFERENCE_STRENGTH,
    ReferenceStrength,
    encode_references,
    reference_encode_memory,
)
from . import convert, host, sockets, types
from .aliases import KLEIN
from .inputs import tile_inputs
from .sockets import io

MEGAPIXEL = 1024 * 1024  # BFL's and diffusers' "1 MP" is 1024 x 1024
MAX_MEGAPIXELS_TOOLTIP = (
    "Pixel cap per reference, in units of 1024x1024. Larger images are scaled down to it (aspect kept). "
    "1.0 is the diffusers default and BFL's cap with several references (BFL allows about 4 for one). "
    "Raising it keeps the fine detail of a large reference, at the cost of more tokens: slower steps and "
    "more VRAM."
)


RESIZE_TOOLTIP = (
    "How the image is brought to multiples of 16: crop (centre crop of at most 15 px, the BFL and "
    "diffusers default) or resize (scaled to the nearest multiples of 16: nothing cut off, the aspect "
    "changes slightly)."
)

TILE_SIZE_TOOLTIP = (
    "Encode in square tiles of this many pixels, for large references on small cards (memory then grows "
    "with the tile, not the image). 0 = automatic: the whole image at once when it fits in free memory, else "
    "the largest tile that fits. Tiles differ slightly from a whole-image encode; larger tiles are closer."
)

STRENGTH_TOOLTIP = (
    "How much these references count: their keys' attention logits get + log(strength) in every block. 1 "
    "is the plain edit, 0 ignores them (the text-to-image result), above 1 follows them more closely. "
    "Applies to the references this node adds, not to earlier ones."
)
START_TOOLTIP = "The fraction of the steps from which these references count (before it they count as 0)."
END_TOOLTIP = (
    "The fraction of the steps up to which these references count (after it they count as 0): e.g. 0.5 "
    "lets them set the composition and leaves the detail to the prompt."
)


class Flux2KleinReferenceEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinReferenceEncode",
            search_aliases=[
                *KLEIN,
                "reference latent",
                "reference image",
                "edit",
                "multi reference",
                "image edit",
                "参考图",
                "编辑",
            ],  # fmt: skip
            display_name="FLUX.2 Reference Encode",
            category="flux2_klein/conditioning",
            description=(
                "Encodes reference images for editing with the FLUX.2 VAE. An image over the pixel cap is "
                "scaled down to it; each is centre-cropped to multiples of 16. Chain several nodes to "
                "combine references."
            ),
            inputs=[
                sockets.Vae.Input("vae", tooltip="From FLUX.2 VAE Loader."),
                io.Image.Input(
                    "image", tooltip="One or more images: a batch of n gives n references, in order."
                ),
                sockets.References.Input(
                    "references",
                    optional=True,
                    tooltip="Earlier references: they come first, these after them.",
                ),
                io.Float.Input(
                    "max_megapixels",
                    optional=True,
                    advanced=True,
                    tooltip=MAX_MEGAPIXELS_TOOLTIP,
                    default=MAX_REFERENCE_PIXELS / MEGAPIXEL,
                    min=0.1,
                    max=16.0,
                    step=0.1,
                ),  # fmt: skip
                io.Combo.Input(
                    "resize",
                    options=list(FIT_MODES),
                    optional=True,
                    advanced=True,
                    tooltip=RESIZE_TOOLTIP,
                    default="crop",
                ),
                *tile_inputs(TILE_SIZE_TOOLTIP),
                io.Float.Input(
                    "strength",
                    optional=True,
                    default=1.0,
                    min=0.0,
                    max=MAX_REFERENCE_STRENGTH,
                    step=0.05,
                    tooltip=STRENGTH_TOOLTIP,
                ),
                io.Float.Input(
                    "start",
                    optional=True,
                    advanced=True,
                    default=0.0,
                    min=0.0,
                    max=1.0,
                    step=0.01,
                    tooltip=START_TOOLTIP,
                ),
                io.Float.Input(
                    "end",
                    optional=True,
                    advanced=True,
                    default=1.0,
                    min=0.0,
                    max=1.0,
                    step=0.01,
                    tooltip=END_TOOLTIP,
                ),  # fmt: skip
            ],
            outputs=[
                sockets.References.Output(
                    display_name="references",
                    tooltip="The references, in order, for the sampler or another Reference Encode.",
                )
            ],
        )

    @classmethod
    def validate_inputs(cls, start=None, end=None):
        if start is not None and end is not None and start >= end:  # linked values arrive as None
            return (
                f"start {start:g} is not before end {end:g}: the references would count at no step; set "
                "start < end"
            )
        return True

    @classmethod
    def execute(cls, vae: types.KleinVAE, image, references=None, max_megapixels: float = 1.0, resize="crop",
                tile_size=0, tile_overlap=64, strength=1.0, start=0.0, end=1.0) -> io.NodeOutput:  # fmt: skip
        weight = ReferenceStrength(strength, start, end)  # checked before the VAE runs
        images, pixels = convert.image_to_list(image), int(max_megapixels * MEGAPIXEL)
        tiles = {"tile_size": tile_size, "tile_overlap": tile_overlap}
        host.load(vae.patcher, reference_encode_memory(vae.vae, images, pixels, resize, **tiles))
        progress = host.progress_reporter()  # per encoder stage of each tile, one image after another
        encoded = encode_references(
            vae.vae, images, pixels, host.check_interrupt, fit=resize, progress=progress, **tiles
        )
        if not weight.plain:
            encoded = encoded.with_strength(weight)
        return io.NodeOutput(encoded if references is None else references + encoded)
