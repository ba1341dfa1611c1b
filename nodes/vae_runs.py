"""A VAE payload run inside ComfyUI: loaded with the memory its run needs (ComfyUI frees the rest first), an
out-of-memory error named with what to change, its progress on the node's bar (per encoder or decoder stage
of each tile, ``flux2_core.vae.progress``) and a cancel checked between stages. Declares no node."""

from __future__ import annotations

import contextlib

import torch

from ..flux2_core import split_progress
from . import convert, host


@contextlib.contextmanager
def encoding(vae, size: tuple[int, int], advice: str = "encode a smaller image"):
    """The body encodes an image of ``size`` (height, width) with ``vae`` (a ``types.KleinVAE`` or
    ``types.FillVAE``), loaded first; it is given the progress callback that moves the node's bar (a node
    with a bar of its own, a sampler's, leaves it unused)."""
    height, width = size
    host.load(vae.patcher, vae.vae.encode_memory(height, width))
    with host.out_of_memory(f"encoding {width}x{height}", advice):
        yield host.progress_reporter()


def decode_samples(vae, samples: torch.Tensor, scale: int, tile_size: int, tile_overlap: int) -> torch.Tensor:
    """Latents [B, C, h, w] -> IMAGE with a loaded VAE payload (``scale``: pixels per latent cell)."""
    height, width = samples.shape[-2] * scale, samples.shape[-1] * scale
    # Automatic (0) reserves the whole-image estimate: ComfyUI frees what it can, then the VAE tiles only
    # if that was not enough.
    host.load(vae.patcher, vae.vae.decode_memory(height, width, tile_size, tile_overlap))
    # One image at a time: decoding at full resolution is the VAE's memory peak.
    device = host.intermediate_device()
    advice = "decode a smaller image or fewer at once, or set a smaller tile_size (e.g. 512)"
    items, parts = samples.split(1), split_progress(host.progress_reporter(), len(samples))
    with host.out_of_memory(f"decoding {width}x{height}", advice):
        pixels = [
            vae.vae.decode(item, tile_size, tile_overlap, part).to(device) for item, part in zip(items, parts)
        ]
    return convert.pixels_to_image(torch.cat(pixels))  # [B, H, W, 3]
