"""Shared pieces of the whole-run comparisons with diffusers' FLUX.2 pipelines (test helper)."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from flux2_core.vae.autoencoder import AutoEncoder, denormalize, unpatchify


def random_image(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def as_diffusers_latents(latents: torch.Tensor, vae: AutoEncoder) -> torch.Tensor:
    """Our sampler's latents [B, 128, H/16, W/16] as diffusers hands them back for ``output_type="latent"``:
    de-normalised and unpatchified, [B, 32, H/8, W/8]."""
    return unpatchify(denormalize(latents, vae.bn.running_mean, vae.bn.running_var))
