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

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..configs import FLUX2
from ..dit.control import Control, Flux2ControlNet, check_pairing
from ..editing import sample_size
from ..errors import Flux2Error
from ..flow import pack
from ..vae.latent_format import patchify
from .reference_strength import _number, in_step_range

MAX_CONTROL_STRENGTH = 2.0  # the release recommends 0.65-0.80; above 1 the control map dominates


@dataclass(frozen=True)
class AppliedControl:
    """A control net with its context for one output size, a strength and the steps it acts on: step i of n
    when ``start <= i / n < end`` (no hint outside them, so the plain model's step)."""

    net: Flux2ControlNet
    context: torch.Tensor  # [1, N, 260]
    strength: float = 0.75
    start: float = 0.0
    end: float = 1.0

    def check(self, dit, grid: tuple[int, int]) -> None:
        check_pairing(self.net, dit)
        if not _number(self.strength) or not 0.0 <= self.strength <= MAX_CONTROL_STRENGTH:
            raise Flux2Error(
                f"control strength {self.strength} is not allowed: use a number from 0 (no control) to "
                f"{MAX_CONTROL_STRENGTH:g} (0.65-0.80 recommended)"
            )
        if not (_number(self.start) and _number(self.end) and 0.0 <= self.start <= self.end <= 1.0):
            raise Flux2Error(
                f"control step range start {self.start}, end {self.end} is not allowed: use fractions of the "
                "steps with 0 <= start <= end <= 1"
            )
        tokens = grid[0] * grid[1]
        if self.context.ndim != 3 or self.context.shape[1:] != (tokens, self.net.config.in_channels):
            raise Flux2Error(
                f"the control context has shape {list(self.context.shape)}, not [1, {tokens}, "
                f"{self.net.config.in_channels}] for the {grid[1]}x{grid[0]} latent grid: build it at the "
                "output size (control_context)"
            )

    def at(self, step: int, steps: int, device, dtype) -> Control | None:
        """The control of step ``step`` of ``steps``, or None outside its range or at strength 0."""
        if not self.strength or not in_step_range(self.start, self.end, step, steps):
            return None
        return Control(self.net, self.context.to(device, dtype), self.strength)


def control_output_size(
    control: torch.Tensor | None, image: torch.Tensor | None = None
) -> tuple[int, int] | None:
    """(width, height) a control map [B, 3, H, W] (else, in the inpaint mode alone, the picture to inpaint)
    gives the output when nothing else sets it (no reference, no latent, a side left at 0): its aspect ratio
    at about one megapixel (FLUX.2's default size), in multiples of 16, a small map enlarged up to 4x. None
    without either."""
    shown = control if control is not None else image
    if shown is None:
        return None
    height, width = shown.shape[-2:]
    return sample_size(width, height, FLUX2.default_size**2, enlarge=True)


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
    latent = vae.encode(inpaint.clamp(-1, 1))
    grid = latent.shape[-2:]
    kept = F.interpolate(1 - mask, size=(grid[0] * 2, grid[1] * 2), mode="nearest")
    if control is None:
        control_latent = torch.zeros_like(latent)
    else:
        control_latent = vae.encode(resize(control, height, width).clamp(0, 1) * 2 - 1)
    parts = [control_latent, patchify(kept.to(latent.device, latent.dtype)), latent]
    return torch.cat([pack(p.float()) for p in parts], dim=-1)
