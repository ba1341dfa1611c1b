"""Editing an existing image: inpaint masks and their per-step blend, inpaint preparation with crop-to-mask,
outpaint canvases, and the composite of the result back over the original.

Conventions follow diffusers' ``Flux2KleinInpaintPipeline``: a mask is 1 (white) where the image is
repainted; it is binarised at 0.5 and brought to the latent grid bilinearly; after every step the latent
outside the mask is replaced by the source latent noised to the next sigma; the source image is also the first
reference. Images here are float tensors [H, W, 3] in 0..1 and masks [H, W] in 0..1 (ComfyUI's layouts).

The composite is what keeps the unmasked pixels: the decoded crop is scaled back onto its box in the
original and blended through the mask (a hard one feathered *inward* only, a fading one through its fade),
so every pixel outside the mask is exactly the original's whatever the feather.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .configs import FLUX2
from .errors import Flux2Error
from .flow import inpaint_blend  # noqa: F401  (importable here)
from .limits import MAX_SIZE

MAX_UPSCALE = 4.0  # crop-to-mask enlarges a small box at most this much
SNAP = 1.5 / 255  # mask values this close to 0 or 1 count as 0 or 1 in the composite


def latent_mask(mask: torch.Tensor, grid: tuple[int, int], batch: int | None = None) -> torch.Tensor:
    """A pixel mask [H, W], [B, H, W] or [B, 1, H, W] (1 = repaint) -> packed latent mask [B, h * w, 1].

    With ``batch``, the masks are repeated or cut to that many, as ComfyUI does for a latent batch.
    """
    if mask.ndim == 2:
        mask = mask[None]
    if mask.ndim == 3:
        mask = mask[:, None]
    if mask.ndim != 4 or mask.shape[1] != 1 or mask.shape[0] == 0 or min(mask.shape[-2:]) == 0:
        raise Flux2Error(
            f"the mask has shape {list(mask.shape)}: expected [height, width] or [batch, height, width]"
        )
    if batch is not None and mask.shape[0] != batch:
        mask = mask.repeat(math.ceil(batch / mask.shape[0]), 1, 1, 1)[:batch]
    binary = (mask.float() >= 0.5).float()  # diffusers binarises at 0.5 inclusive
    small = F.interpolate(binary, size=grid, mode="bilinear")
    return small.flatten(2).transpose(1, 2)  # [B, h * w, 1]


@dataclass
class Stitch:
    """What the composite needs: the original image, the box that was sampled and the repaint mask."""

    original: torch.Tensor  # [H, W, 3] in 0..1, CPU
    mask: torch.Tensor  # [H, W] in 0..1 (after growing), 1 = repainted
    box: tuple[int, int, int, int]  # left, top, width, height in original pixels
    size: tuple[int, int]  # (width, height) the box was sampled at, multiples of 16


def prepare_inpaint(
    image: torch.Tensor,
    mask: torch.Tensor,
    grow: int = 0,
    crop_to_mask: bool = False,
    context: int = 64,
    max_pixels: int = 1024 * 1024,
) -> tuple[torch.Tensor, torch.Tensor, Stitch]:
    """(image crop [h, w, 3], its mask [h, w], stitch) ready to encode: the whole image, or with
    ``crop_to_mask`` the mask's bounding box plus ``context`` pixels, scaled to about ``max_pixels`` (a
    small box is enlarged up to 4x, so a tiny mask on a big picture samples only its neighbourhood)."""
    if not bool((mask >= 0.5).any()):  # before the size check: Load Image gives 64x64 zeros when unpainted
        raise Flux2Error("the mask is empty: paint the area to repaint (white, 1) before inpainting")
    image, mask = _check_pair(image, mask)
    mask = grow_mask(mask, grow)
    height, width = mask.shape
    box = _mask_box(mask, context, width, height) if crop_to_mask else (0, 0, width, height)
    size = sample_size(box[2], box[3], max_pixels, enlarge=crop_to_mask)
    left, top, bw, bh = box
    crop = resize_image(image[top : top + bh, left : left + bw], size)
    crop_mask = resize_mask(mask[top : top + bh, left : left + bw], size)
    return crop, crop_mask, Stitch(image.cpu(), mask.cpu(), box, size)


def composite(decoded: torch.Tensor, stitch: Stitch, feather: int = 0) -> torch.Tensor:
    """The decoded crop [h, w, 3] put back on the original through the mask, weighted by ``blend_weight``:
    outside the mask every pixel is exactly the original's. Returns [H, W, 3]."""
    left, top, bw, bh = stitch.box
    if tuple(decoded.shape[:2]) != (stitch.size[1], stitch.size[0]):
        raise Flux2Error(
            f"the image to composite is {decoded.shape[1]}x{decoded.shape[0]} but the inpaint crop was "
            f"{stitch.size[0]}x{stitch.size[1]}: connect the decode of this inpaint's latent"
        )
    patch = resize_image(decoded.float().cpu(), (bw, bh))
    weight = blend_weight(stitch.mask[top : top + bh, left : left + bw], feather)[..., None]
    out = stitch.original.clone()
    region = out[top : top + bh, left : left + bw]
    out[top : top + bh, left : left + bw] = torch.where(
        weight > 0, region * (1 - weight) + patch * weight, region
    )
    return out


def outpaint_canvas(
    image: torch.Tensor, left: int, top: int, right: int, bottom: int, feather: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """The image [H, W, 3] on a larger canvas (new area mid grey, as ComfyUI's outpaint padding) and the
    mask of what to paint: 1 on the new area, fading from just under 1 to 0 over ``feather`` pixels into the
    original (the composite blends through that fade, and keeps the new area wholly painted)."""
    m = FLUX2.size_multiple
    for name, value in (("left", left), ("top", top), ("right", right), ("bottom", bottom)):
        if value < 0 or value % m:
            raise Flux2Error(f"outpaint {name} is {value}: use 0 or a multiple of {m} pixels")
    if not (left or top or right or bottom):
        raise Flux2Error("outpaint adds nothing: give at least one of left, top, right, bottom")
    height, width = image.shape[:2]
    canvas = torch.full((height + top + bottom, width + left + right, 3), 0.5, dtype=torch.float32)
    canvas[top : top + height, left : left + width] = image.float().cpu()
    mask = torch.ones(canvas.shape[:2], dtype=torch.float32)
    inner = torch.zeros(height, width)
    if feather > 0:
        ys = torch.arange(height, dtype=torch.float32)[:, None]
        xs = torch.arange(width, dtype=torch.float32)[None, :]
        sides = ((ys, top), (height - 1 - ys, bottom), (xs, left), (width - 1 - xs, right))
        distances = [d for d, padded in sides if padded]
        nearest = torch.stack([d.expand(height, width) for d in distances]).amin(0)
        inner = (1.0 - (nearest + 1) / (feather + 1)).clamp(min=0.0)  # strictly under 1: a fade
    mask[top : top + height, left : left + width] = inner
    return canvas, mask


def grow_mask(mask: torch.Tensor, pixels: int) -> torch.Tensor:
    """The mask dilated by ``pixels`` (a square neighbourhood), as a float [H, W] mask: a row pass then a
    column pass, so the cost grows linearly with ``pixels``."""
    if pixels <= 0:
        return mask.float()
    k = 2 * pixels + 1
    rows = F.max_pool2d(mask.float()[None, None], (1, k), stride=1, padding=(0, pixels))
    return F.max_pool2d(rows, (k, 1), stride=1, padding=(pixels, 0))[0, 0]


def feather_inward(mask: torch.Tensor, pixels: int) -> torch.Tensor:
    """The binary mask (>= 0.5) with a ramp over ``pixels`` inside its edge (1/pixels at the edge, 1 from
    ``pixels`` deep); 0 wherever the mask is. One 3x3 erosion per pixel of ramp, so linear in ``pixels``."""
    binary = (mask >= 0.5).float()
    if pixels <= 0:
        return binary
    inside = binary[None, None]
    total = torch.zeros_like(binary)
    for _ in range(pixels):  # the number of erosions a pixel survives: its depth inside the mask
        total += inside[0, 0]
        inside = -F.max_pool2d(-inside, 3, stride=1, padding=1)
    return total / pixels


def blend_weight(mask: torch.Tensor, feather: int) -> torch.Tensor:
    """The composite's weight of the repainted image: a hard (0/1) mask with an inward ramp of ``feather``
    pixels; a mask that fades already (an outpaint mask, whose new area is 1 and whose fade lies inside the
    original) as it is, so the canvas's placeholder never shows. Exactly 0 wherever the mask is 0: those
    pixels stay the original's."""
    soft = mask.float().clamp(0, 1)
    # one 8-bit step from white or black is white or black: ComfyUI reads a white PNG mask as 0.996, which
    # must not let 0.4 % of the original show through, nor pass for a fading mask
    soft = torch.where(soft >= 1 - SNAP, 1.0, torch.where(soft <= SNAP, 0.0, soft))
    if feather <= 0 or bool(((soft > 0) & (soft < 1)).any()):
        return soft  # a mask that fades already (Outpaint Pad's, a soft brush) blends as it is
    return feather_inward(soft, feather)


def resize_image(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[H, W, C] -> [h, w, C] for ``size`` = (w, h); bicubic with antialiasing, unchanged when equal."""
    if (image.shape[1], image.shape[0]) == tuple(size):
        return image.float()
    x = image.float().permute(2, 0, 1)[None]
    out = F.interpolate(x, size=(size[1], size[0]), mode="bicubic", antialias=True, align_corners=False)
    return out[0].permute(1, 2, 0).clamp(0, 1)


def resize_mask(mask: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    if (mask.shape[1], mask.shape[0]) == tuple(size):
        return mask.float()
    out = F.interpolate(mask.float()[None, None], size=(size[1], size[0]), mode="bilinear", antialias=True)
    return out[0, 0].clamp(0, 1)


def _check_pair(image: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if image.ndim == 4 and image.shape[0] == 1:
        image = image[0]
    if mask.ndim == 3 and mask.shape[0] == 1:
        mask = mask[0]
    if image.ndim != 3 or image.shape[-1] < 3:
        raise Flux2Error(f"the image has shape {list(image.shape)}: expected one image [height, width, 3]")
    if mask.ndim != 2:
        raise Flux2Error(f"the mask has shape {list(mask.shape)}: expected one mask [height, width]")
    if tuple(mask.shape) != tuple(image.shape[:2]):
        raise Flux2Error(
            f"the mask is {mask.shape[1]}x{mask.shape[0]} but the image is "
            f"{image.shape[1]}x{image.shape[0]}: use a mask of the image's size"
        )
    if min(mask.shape) < FLUX2.min_size:
        raise Flux2Error(f"the image is {mask.shape[1]}x{mask.shape[0]}: both sides must be at least 64 px")
    return image[..., :3].float(), mask.float()


def _mask_box(mask: torch.Tensor, context: int, width: int, height: int) -> tuple[int, int, int, int]:
    ys, xs = torch.nonzero(mask >= 0.5, as_tuple=True)
    x0, x1 = max(0, int(xs.min()) - context), min(width, int(xs.max()) + 1 + context)
    y0, y1 = max(0, int(ys.min()) - context), min(height, int(ys.max()) + 1 + context)
    # at least the model's smallest side, grown around the mask's centre and kept inside the image
    low = FLUX2.min_size
    x0, x1 = _widen(x0, x1, low, width)
    y0, y1 = _widen(y0, y1, low, height)
    return x0, y0, x1 - x0, y1 - y0


def _widen(start: int, stop: int, low: int, limit: int) -> tuple[int, int]:
    missing = low - (stop - start)
    if missing <= 0:
        return start, stop
    start = max(0, start - missing // 2 - missing % 2)
    stop = min(limit, start + low)
    return max(0, stop - low), stop


def sample_size(width: int, height: int, max_pixels: int, enlarge: bool) -> tuple[int, int]:
    """Multiples of 16 close to ``width x height`` scaled to at most ``max_pixels`` (and, with ``enlarge``, up
    to it, at most 4x)."""
    scale = math.sqrt(max_pixels / (width * height))
    scale = min(scale, MAX_UPSCALE) if enlarge else min(scale, 1.0)
    scale = min(scale, MAX_SIZE / max(width, height))  # never a side the sampler refuses
    m, low = FLUX2.size_multiple, FLUX2.min_size
    return max(low, int(width * scale) // m * m), max(low, int(height * scale) // m * m)
