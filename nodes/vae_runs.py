"""A VAE payload run inside ComfyUI: loaded with the memory its run needs (ComfyUI frees the rest first), an
out-of-memory error named with what to change. Declares no node."""

from __future__ import annotations

import contextlib

import torch

from . import convert, host


@contextlib.contextmanager
def encoding(vae, size: tuple[int, int], advice: str = "encode a smaller image"):
    """The body encodes an image of ``size`` (height, width) with ``vae`` (a ``types.KleinVAE`` or
    ``types.FillVAE``), loaded first."""
    height, width = size
    host.load(vae.patcher, vae.vae.encode_memory(height, width))
    with host.out_of_memory(f"encoding {width}x{height}", advice):
        yield


def decode_samples(vae, samples: torch.Tensor, scale: int, tile_size: int, tile_overlap: int) -> torch.Tensor:
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
