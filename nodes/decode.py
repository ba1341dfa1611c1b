"""Flux2KleinDecode: FLUX.2 latents -> IMAGE, like native VAEDecode with the FLUX.2 VAE."""

from __future__ import annotations

import torch

from ..flux2_core import FLUX2
from . import convert, host, types
from .types import socket


class Flux2KleinDecode:
    DESCRIPTION = "Decodes FLUX.2 latents (ours or native FLUX.2 ones) to images with the FLUX.2 VAE."
    CATEGORY = "flux2_klein/latent"
    RETURN_TYPES = (types.IMAGE,)
    RETURN_NAMES = ("image",)
    OUTPUT_TOOLTIPS = ("Images [batch, height, width, 3] in 0..1.",)
    FUNCTION = "decode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "vae": socket(types.VAE, "From FLUX.2 [klein] VAE Loader."),
                "latent": socket(types.LATENT, "FLUX.2 latents, e.g. from FLUX.2 [klein] Sampler."),
            },
        }

    def decode(self, vae: types.KleinVAE, latent: dict):
        samples = convert.latent_samples(latent)
        height, width = samples.shape[-2] * FLUX2.size_multiple, samples.shape[-1] * FLUX2.size_multiple
        host.load(vae.patcher, vae.vae.decode_memory(height, width))
        # One image at a time: decoding at full resolution is the VAE's memory peak.
        device = host.intermediate_device()
        with host.out_of_memory(f"decoding {width}x{height}", "decode a smaller image or fewer at once"):
            pixels = torch.cat([vae.vae.decode(item).to(device) for item in samples.split(1)])  # [B, 3, H, W]
        return (convert.pixels_to_image(pixels),)
