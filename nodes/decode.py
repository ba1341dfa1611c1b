"""Flux2KleinDecode: FLUX.2 latents -> IMAGE, like native VAEDecode with the FLUX.2 VAE."""

from __future__ import annotations

from ..flux2_core import FLUX2
from . import convert, sockets, types
from .aliases import KLEIN
from .inputs import tile_inputs
from .sockets import io
from .tooltips import IMAGE_OUTPUT
from .vae_runs import decode_samples


class Flux2KleinDecode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinDecode",
            search_aliases=[*KLEIN, "vae decode", "decode", "tiled decode", "解码"],
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
