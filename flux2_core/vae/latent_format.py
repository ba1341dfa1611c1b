"""How a VAE's posterior mean becomes the latent a DiT and ComfyUI's ``LATENT`` hold, and back.

FLUX.2: patchify 2x2 ([B, 32, H/8, W/8] -> [B, 128, H/16, W/16]), then a BatchNorm with the checkpoint's
running statistics (eps 1e-4), always in float32. FLUX.1: ``(z - shift) * scale`` with two published
constants and no patch. The statistics of FLUX.2 are module buffers (``bn.*`` in the files); the format
objects only hold the arithmetic.
"""

from __future__ import annotations

import torch
from einops import rearrange
from torch import Tensor

BN_EPS = 1e-4  # latent BatchNorm eps (diffusers ``batch_norm_eps``); the GroupNorms use 1e-6
PATCH = 2


def patchify(z: Tensor, patch: int = PATCH) -> Tensor:
    """[B, C, H, W] -> [B, 4C, H/2, W/2]; channel c*4 + pi*2 + pj (diffusers ``_patchify_latents``)."""
    return rearrange(z, "b c (i pi) (j pj) -> b (c pi pj) i j", pi=patch, pj=patch)


def unpatchify(x: Tensor, patch: int = PATCH) -> Tensor:
    """[B, 4C, h, w] -> [B, C, 2h, 2w], the exact inverse of ``patchify``."""
    return rearrange(x, "b (c pi pj) i j -> b c (i pi) (j pj)", pi=patch, pj=patch)


def normalize(x: Tensor, running_mean: Tensor, running_var: Tensor, eps: float = BN_EPS) -> Tensor:
    """Latent BatchNorm in float32: (x - mean) / sqrt(var + eps) per channel of [B, C, h, w]."""
    mean, std = _bn_stats(x, running_mean, running_var, eps)
    return (x.float() - mean) / std


def denormalize(x: Tensor, running_mean: Tensor, running_var: Tensor, eps: float = BN_EPS) -> Tensor:
    """Inverse of ``normalize``, in float32."""
    mean, std = _bn_stats(x, running_mean, running_var, eps)
    return x.float() * std + mean


class PatchedBatchNorm:
    """FLUX.2: 2x2 patchify, then the latent BatchNorm of the checkpoint (``bn`` of the autoencoder)."""

    def to_latent(self, mean: Tensor, bn: torch.nn.BatchNorm2d) -> Tensor:
        return normalize(patchify(mean), bn.running_mean, bn.running_var, bn.eps)

    def from_latent(self, latent: Tensor, bn: torch.nn.BatchNorm2d) -> Tensor:
        return unpatchify(denormalize(latent, bn.running_mean, bn.running_var, bn.eps))


class ScaleShift:
    """FLUX.1 (and SD3): ``(z - shift) * scale``, float32."""

    def __init__(self, scale: float, shift: float):
        self.scale, self.shift = scale, shift

    def to_latent(self, mean: Tensor, bn=None) -> Tensor:
        return (mean.float() - self.shift) * self.scale

    def from_latent(self, latent: Tensor, bn=None) -> Tensor:
        return latent.float() / self.scale + self.shift


class RawMean:
    """FLUX.1's VAE as ComfyUI sees it: the ``LATENT`` is the raw posterior mean; the model applies
    ``ScaleShift`` on entry and exit (ComfyUI ``latent_formats.Flux``), so native VAE nodes read it."""

    def to_latent(self, mean: Tensor, bn=None) -> Tensor:
        return mean.float()

    def from_latent(self, latent: Tensor, bn=None) -> Tensor:
        return latent.float()


def _bn_stats(x: Tensor, running_mean: Tensor, running_var: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    mean = running_mean.to(x.device, torch.float32).view(1, -1, 1, 1)
    std = torch.sqrt(running_var.to(x.device, torch.float32).view(1, -1, 1, 1) + eps)
    return mean, std
