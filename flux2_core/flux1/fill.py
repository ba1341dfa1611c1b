"""The Fill conditioning: what FLUX.1 Fill [dev] reads next to the noisy latent, per token.

    channels   0 -  63   the noisy latent (the sampler's state)
    channels  64 - 127   the masked image's latent: image * (1 - mask) in [-1, 1], VAE mean, scaled, shifted
    channels 128 - 383   the mask: each latent cell's 8x8 pixels (channel ph * 8 + pw), 2x2 cells per token

Every part is packed like the latent: 2x2 latent cells per token, channel ``c * 4 + qh * 2 + qw``, tokens
row-major. The mask is 1 (white) where the model paints. It is binarised at 0.5, as diffusers does: BFL feeds
it continuous and ComfyUI feeds its continuous, resized mask to the 256 channels; a binary mask makes the
masked image and the mask channels agree, and a "white" mask read from an 8-bit PNG (0.996) still hides
every source pixel under it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import Flux2Error
from ..flow import pack
from ..vae.latent_format import patchify, unpatchify
from .config import LATENT_FORMAT, MASK_CELL

MASK_THRESHOLD = 0.5


def pack_latent(latent: torch.Tensor) -> torch.Tensor:
    """[B, 16, h, w] -> [B, (h/2)(w/2), 64] (BFL ``prepare``, diffusers ``_pack_latents``)."""
    return pack(patchify(latent))


def unpack_latent(tokens: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """[B, N, 64] -> [B, 16, 2 rows, 2 cols] for a token grid (rows, cols): the inverse of ``pack_latent``."""
    rows, cols = grid
    return unpatchify(tokens.transpose(1, 2).reshape(tokens.shape[0], -1, rows, cols))


def binary_mask(mask: torch.Tensor) -> torch.Tensor:
    """[B, H, W] (or [H, W]) in 0..1 -> float 0/1: 1 where the value is at least 0.5."""
    return (mask.float() >= MASK_THRESHOLD).float()


def masked_pixels(pixels: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Pixels [B, 3, H, W] in [-1, 1] with the area to paint set to 0 (mid grey); ``mask`` [B, H, W] 0/1."""
    return pixels * (1.0 - mask[:, None].to(pixels))


def mask_tokens(mask: torch.Tensor) -> torch.Tensor:
    """Binary pixel mask [B, H, W] -> [B, N, 256]: space-to-depth 8x8 per latent cell, then 2x2 packing."""
    batch, height, width = mask.shape
    cells = mask.float().view(batch, height // MASK_CELL, MASK_CELL, width // MASK_CELL, MASK_CELL)
    cells = cells.permute(0, 2, 4, 1, 3).reshape(batch, MASK_CELL * MASK_CELL, height // 8, width // 8)
    return pack_latent(cells)


@dataclass
class FillInputs:
    """The constant 320 channels of every token, and the grid they were made for."""

    tokens: torch.Tensor  # [1 or B, N, 320] float32: masked-image latent | mask
    grid: tuple[int, int]  # (rows, cols) of tokens: (H / 16, W / 16)
    source: torch.Tensor | None = None  # [1 or B, N, 64] the unmasked image's packed latent (for denoise < 1)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) in pixels."""
        return self.grid[1] * 16, self.grid[0] * 16


def fill_inputs(
    vae, pixels: torch.Tensor, mask: torch.Tensor, with_source: bool = False, **tiles
) -> FillInputs:
    """Encode the Fill conditioning of ``pixels`` [B, 3, H, W] in [-1, 1] under ``mask`` [B, H, W] or
    [H, W] (1 = paint); with ``with_source`` also the unmasked image's latent (a start for denoise < 1).
    ``vae`` is the FLUX.1 VAE (raw means); ``tiles`` go to its ``encode``."""
    if mask.ndim == 2:
        mask = mask[None]
    if pixels.ndim != 4 or mask.ndim != 3 or tuple(pixels.shape[-2:]) != tuple(mask.shape[-2:]):
        raise Flux2Error(
            f"the image {list(pixels.shape)} and the mask {list(mask.shape)} do not match: give a mask of "
            "the image's size"
        )
    height, width = mask.shape[-2:]
    if height % 16 or width % 16:
        raise Flux2Error(f"the image is {width}x{height}: FLUX.1 Fill needs sides that are multiples of 16")
    binary = binary_mask(mask)
    if binary.shape[0] != pixels.shape[0]:
        binary = binary.expand(pixels.shape[0], -1, -1)
    masked = LATENT_FORMAT.to_latent(vae.encode(masked_pixels(pixels, binary), **tiles))
    tokens = torch.cat([pack_latent(masked), mask_tokens(binary)], dim=-1)
    source = pack_latent(LATENT_FORMAT.to_latent(vae.encode(pixels, **tiles))) if with_source else None
    return FillInputs(tokens.float().cpu(), (height // 16, width // 16), source)
