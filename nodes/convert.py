"""ComfyUI <-> core layouts: IMAGE, MASK and LATENT.

IMAGE is [B, H, W, C] float in 0..1 (channels last); the core takes reference images as [H, W, 3] in 0..1 and
its VAE gives pixels [B, 3, H, W] in about -1..1. LATENT is ``{"samples": [B, 128, H/16, W/16]}``, the same
BN-normalised layout as native FLUX.2 latents (EmptyFlux2LatentImage, VAEEncode of the FLUX.2 VAE); a
FLUX.1 Fill LATENT is native FLUX.1's, ``{"samples": [B, 16, H/8, W/8]}``, the raw VAE mean.
"""

from __future__ import annotations

import torch

from ..flux2_core import FLUX1, FLUX2, Flux2Error


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
    channels = FLUX2.latent_channels
    if not isinstance(samples, torch.Tensor) or samples.ndim != 4 or samples.shape[1] != channels:
        shape = list(samples.shape) if isinstance(samples, torch.Tensor) else type(samples).__name__
        raise Flux2Error(
            f"the latent has shape {shape}, not a FLUX.2 latent [batch, {channels}, height/16, "
            "width/16]: make it with EmptyFlux2LatentImage or the FLUX.2 VAE"
        )
    return samples


def fill_latent_samples(latent: dict) -> torch.Tensor:
    """The [B, 16, h, w] tensor of a FLUX.1 LATENT, or a clear error for a FLUX.2 / SD / video latent."""
    samples = latent.get("samples") if isinstance(latent, dict) else None
    channels = FLUX1.noise_channels
    if not isinstance(samples, torch.Tensor) or samples.ndim != 4 or samples.shape[1] != channels:
        shape = list(samples.shape) if isinstance(samples, torch.Tensor) else type(samples).__name__
        raise Flux2Error(
            f"the latent has shape {shape}, not a FLUX.1 latent [batch, {channels}, height/8, width/8]: "
            "connect the FLUX.1 Fill [dev] Sampler's latent (or native VAE Encode with ae.safetensors)"
        )
    return samples


def image_to_pixels(image: torch.Tensor) -> torch.Tensor:
    """One image [H, W, 3] in 0..1 -> VAE pixels [1, 3, H, W] in -1..1."""
    return (image.float() * 2.0 - 1.0).permute(2, 0, 1)[None].contiguous()


def noise_mask(latent: dict | None) -> torch.Tensor | None:
    """A LATENT's ``noise_mask`` (pixels, 1 = repaint: SetLatentNoiseMask's key), or None."""
    return latent.get("noise_mask") if isinstance(latent, dict) else None


def first_image(image: torch.Tensor | None) -> torch.Tensor | None:
    """The first image of an IMAGE [B, H, W, C] as [1, 3, H, W] in 0..1, on the CPU."""
    return None if image is None else image[:1, ..., :3].permute(0, 3, 1, 2).float().cpu()


def first_mask(mask: torch.Tensor | None) -> torch.Tensor | None:
    """The first mask of a MASK [B, H, W] as [H, W], on the CPU."""
    return None if mask is None else mask[0].float().cpu()
