"""Flux2KleinDecode: FLUX.2 latents -> IMAGE, like native VAEDecode with the FLUX.2 VAE."""

from __future__ import annotations

import torch

from ..flux2_core import FLUX2
from . import convert, host, sockets, types
from .aliases import search_aliases
from .sockets import io

TILE_SIZE_TOOLTIP = (
    "Decode in square tiles of this many pixels, for large images on small cards (memory then grows with the "
    "tile, not the image). 0 = automatic: the whole image at once when it fits in free memory, else the "
    "largest tile that fits. Tiles differ slightly from a whole-image decode; larger tiles are closer."
)
TILE_OVERLAP_TOOLTIP = (
    "Pixels neighbouring tiles share; they are blended smoothly so no seam shows. Must be under half the "
    "tile size. Only used when tiling."
)


def tile_inputs(size_tooltip: str = TILE_SIZE_TOOLTIP) -> list:
    """The optional ``tile_size`` and ``tile_overlap`` inputs of the nodes that run the VAE."""
    return [
        io.Int.Input(
            "tile_size",
            optional=True,
            advanced=True,
            tooltip=size_tooltip,
            default=0,
            min=0,
            max=8192,
            step=16,
        ),
        io.Int.Input(
            "tile_overlap",
            optional=True,
            advanced=True,
            tooltip=TILE_OVERLAP_TOOLTIP,
            default=64,
            min=0,
            max=512,
            step=16,
        ),
    ]


IMAGE_OUTPUT = "Images [batch, height, width, 3] in 0..1."


class Flux2KleinDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinDecode",
            search_aliases=search_aliases("Flux2KleinDecode"),
            display_name="FLUX.2 Decode",
            category="flux2_klein/latent",
            description="Decodes FLUX.2 latents (ours or native FLUX.2 ones) to images with the FLUX.2 VAE.",
            inputs=[
                sockets.Vae.Input("vae", tooltip="From FLUX.2 VAE Loader."),
                io.Latent.Input("latent", tooltip="FLUX.2 latents, e.g. from FLUX.2 Sampler."),
                *tile_inputs(),
            ],
            outputs=[io.Image.Output(display_name="image", tooltip=IMAGE_OUTPUT)],
        )

    @classmethod
    def execute(cls, vae: types.KleinVAE, latent: dict, tile_size: int = 0, tile_overlap: int = 64):
        samples = convert.latent_samples(latent)
        return io.NodeOutput(decode_samples(vae, samples, FLUX2.size_multiple, tile_size, tile_overlap))


def decode_samples(vae, samples, scale: int, tile_size: int, tile_overlap: int):
    """Latents [B, C, h, w] -> IMAGE with a loaded VAE payload (``scale``: pixels per latent cell)."""
    height, width = samples.shape[-2] * scale, samples.shape[-1] * scale
    # Automatic (0) reserves the whole-image estimate: ComfyUI frees what it can, then the VAE tiles only
    # if that was not enough.
    host.load(vae.patcher, vae.vae.decode_memory(height, width, tile_size, tile_overlap))
    # One image at a time: decoding at full resolution is the VAE's memory peak.
    device = host.intermediate_device()
    advice = "decode a smaller image or fewer at once, or set a smaller tile_size (e.g. 512)"
    with host.out_of_memory(f"decoding {width}x{height}", advice):
        pixels = [vae.vae.decode(item, tile_size, tile_overlap).to(device) for item in samples.split(1)]
    return convert.pixels_to_image(torch.cat(pixels))  # [B, H, W, 3]
