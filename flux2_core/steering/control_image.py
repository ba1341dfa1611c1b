"""The Fun ControlNet's control context from a control map, and for its inpaint mode a mask and an image.

As VideoX-Fun's ``Flux2ControlPipeline`` builds it, per image token ([B, N, 260], N the output's tokens):

- channels 0-127: the control map's VAE latent (posterior mean, patchified 2x2, batch-norm normalised:
  ``AutoEncoder.encode``), the map resized to the output size first;
- channels 128-131: ``1 - mask`` (mask 1 = regenerate, binarised at 0.5), nearest-resized to the latent's
  H/8 x W/8 grid and patchified 2x2 (channel ``dy * 2 + dx``);
- channels 132-259: the latent of the image to inpaint with the masked pixels set to 0 (mid-grey in
  [-1, 1]).

Plain control (no mask, no image) fills the last two as ``examples/flux2_fun/predict_t2i_control.py`` calls
the pipeline: an all-white mask (so 0 in the mask channels) and an all-zero image, whose masked-out latent is
then the encoded mid-grey picture, not zeros. Without a control map (inpaint only) channels 0-127 are zeros,
as the pipeline leaves them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import Flux2Error
from ..flow import pack
from ..vae.latent_format import patchify


def resize(pixels: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[B, C, h, w] to ``height x width`` (bicubic with antialiasing, as PIL's resize of the reference
    example), unchanged when it already has that size."""
    if tuple(pixels.shape[-2:]) == (height, width):
        return pixels
    return F.interpolate(
        pixels.float(), size=(height, width), mode="bicubic", antialias=True, align_corners=False
    )


def control_context(
    vae,
    height: int,
    width: int,
    control: torch.Tensor | None,
    mask: torch.Tensor | None = None,
    image: torch.Tensor | None = None,
) -> torch.Tensor:
    """[1, N, 260] for an output of ``height x width`` pixels. ``control`` and ``image`` are [1, 3, h, w] in
    [0, 1] (any size: resized to the output), ``mask`` [1, 1, h, w] or [h, w] in [0, 1] (1 = regenerate)."""
    if control is None and mask is None and image is None:
        raise Flux2Error("the ControlNet needs a control image (pose, depth, canny ...), or a mask and image")
    if mask is None:
        mask = torch.ones(1, 1, height, width)
    mask = mask.reshape(1, 1, *mask.shape[-2:]).float()
    mask = (F.interpolate(mask, size=(height, width), mode="nearest") >= 0.5).float()
    inpaint = torch.zeros(1, 3, height, width) if image is None else resize(image, height, width) * 2 - 1
    inpaint = inpaint * (mask < 0.5)
    latent = vae.encode(inpaint.clamp(-1, 1) if image is not None else inpaint)
    grid = latent.shape[-2:]
    kept = F.interpolate(1 - mask, size=(grid[0] * 2, grid[1] * 2), mode="nearest")
    if control is None:
        control_latent = torch.zeros_like(latent)
    else:
        control_latent = vae.encode(resize(control, height, width).clamp(0, 1) * 2 - 1)
    parts = [control_latent, patchify(kept.to(latent.device, latent.dtype)), latent]
    return torch.cat([pack(p.float()) for p in parts], dim=-1)
