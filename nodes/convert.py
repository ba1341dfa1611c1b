"""ComfyUI <-> core layouts: IMAGE, LATENT and the sampler's output size.

IMAGE is [B, H, W, C] float in 0..1 (channels last); the core takes reference images as [H, W, 3] in 0..1 and
its VAE gives pixels [B, 3, H, W] in about -1..1. LATENT is ``{"samples": [B, 128, H/16, W/16]}``, the same
BN-normalised layout as native FLUX.2 latents (EmptyFlux2LatentImage, VAEEncode of the FLUX.2 VAE).
"""

from __future__ import annotations

import torch

from ..flux2_core.errors import Flux2Error
from ..flux2_core.references import ReferenceLatents
from ..flux2_core.sampling import LATENT_CHANNELS, SIZE_MULTIPLE

DEFAULT_SIZE = 1024  # output side when neither the widgets, a latent nor a reference give one


def image_to_list(image: torch.Tensor) -> list[torch.Tensor]:
    """IMAGE [B, H, W, C] -> B tensors [H, W, 3] in 0..1, in batch order (an alpha channel is dropped)."""
    if image.ndim != 4 or image.shape[-1] < 3:
        raise Flux2Error(f"expected an IMAGE [batch, height, width, channels], got shape {list(image.shape)}")
    return list(image[..., :3].float().unbind(0))


def pixels_to_image(pixels: torch.Tensor) -> torch.Tensor:
    """Decoded pixels [B, 3, H, W] in about -1..1 -> IMAGE [B, H, W, 3] float32, (x + 1) / 2 clamped."""
    return ((pixels.float() + 1.0) / 2.0).clamp(0.0, 1.0).permute(0, 2, 3, 1).contiguous()


def latent_samples(latent: dict) -> torch.Tensor:
    """The [B, 128, h, w] tensor of a LATENT, or a clear error for an SD / FLUX.1 / video latent."""
    samples = latent.get("samples") if isinstance(latent, dict) else None
    if not isinstance(samples, torch.Tensor) or samples.ndim != 4 or samples.shape[1] != LATENT_CHANNELS:
        shape = list(samples.shape) if isinstance(samples, torch.Tensor) else type(samples).__name__
        raise Flux2Error(
            f"the latent has shape {shape}, not a FLUX.2 latent [batch, {LATENT_CHANNELS}, height/16, "
            "width/16]: make it with EmptyFlux2LatentImage or the FLUX.2 VAE"
        )
    return samples


def output_size(
    width: int,
    height: int,
    batch_size: int,
    references: ReferenceLatents | None = None,
    latent: dict | None = None,
) -> tuple[int, int, int]:
    """(width, height, batch size) to sample. A latent sets all three; otherwise a 0 side takes the first
    reference's processed size, or DEFAULT_SIZE without references."""
    if latent is not None:
        batch, _, h, w = latent_samples(latent).shape
        return w * SIZE_MULTIPLE, h * SIZE_MULTIPLE, batch
    if references is not None and len(references):
        ref_width, ref_height = references.pixel_size(0)
    else:
        ref_width, ref_height = DEFAULT_SIZE, DEFAULT_SIZE
    return width or ref_width, height or ref_height, batch_size
