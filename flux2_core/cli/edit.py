"""Editing on the command line: ``--image`` with ``--mask`` / ``--outpaint`` / ``--strength``, checked and
prepared before any model is loaded, encoded once the VAE is, and composited back after decoding. Shared by
the FLUX.2 and FLUX.1 Fill runs."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from ..editing import composite, latent_mask, outpaint_canvas, prepare_inpaint
from ..errors import Flux2Error
from ..references import ReferenceLatents, prepare_reference, processed_size
from . import inputs, progress

# --image without a mask: 1.0 would ignore the image; 0.75 skips the first of 4 steps (steps skipped:
# int(steps - steps * strength), diffusers' rule, so with 4 steps anything above 0.75 skips none)
IMG2IMG_STRENGTH = 0.75


@dataclass
class Edit:
    """What --image (with --mask or --outpaint) asks for, prepared before any model is loaded."""

    pixels: object  # the image to encode: PIL image or float tensor [H, W, 3]
    size: tuple[int, int]  # (width, height) sampled
    strength: float
    max_pixels: int  # the pixel cap it is encoded with
    mask: torch.Tensor | None = None  # [h, w] at the sampled size: inpaint
    stitch: object = None  # editing.Stitch for the composite


def prepare_edit(args: argparse.Namespace, max_pixels: int) -> Edit | None:
    """--image, --mask, --outpaint and --strength, checked and prepared (nothing is encoded yet)."""
    if args.image is None:
        if args.mask or args.outpaint:
            raise Flux2Error("--mask and --outpaint work on an image: give it with --image")
        if args.strength is not None:
            raise Flux2Error("--strength needs an image to start from: give it with --image")
        return None
    if args.strength is not None and not 0.0 <= args.strength <= 1.0:
        raise Flux2Error(
            f"strength (denoise) is {args.strength}: use a value from 0 (keep the image) to 1 (repaint)"
        )
    image = inputs.open_image(args.image)
    if args.mask is None and args.outpaint is None:
        strength = IMG2IMG_STRENGTH if args.strength is None else args.strength
        size = processed_size(*inputs.image_size(image), max_pixels)
        _check_size(args, size, "the image's size (scaled to the pixel cap and to multiples of 16)")
        return Edit(image, size, strength, max_pixels)
    pixels = inputs.as_tensor(image)
    if args.outpaint is not None:
        if args.mask is not None:
            raise Flux2Error("give --mask or --outpaint, not both")
        # at least a 1 px fade, so the composite keeps the new area wholly painted
        pixels, mask = outpaint_canvas(pixels, *parse_sides(args.outpaint), feather=max(1, args.mask_feather))
        _check_size(args, (pixels.shape[1], pixels.shape[0]), "the padded canvas's size")
    else:
        mask = inputs.open_mask(args.mask, (pixels.shape[1], pixels.shape[0]))
        _check_size(args, (pixels.shape[1], pixels.shape[0]), "the image's size")
    crop, crop_mask, stitch = prepare_inpaint(pixels, mask, max_pixels=max_pixels)
    strength = 1.0 if args.strength is None else args.strength
    size = (crop.shape[1], crop.shape[0])
    return Edit(crop, size, strength, size[0] * size[1], crop_mask, stitch)


def _check_size(args: argparse.Namespace, size: tuple[int, int], what: str) -> None:
    """--width/--height with --image may repeat the output's size, never change it."""
    for name, given, actual in (("width", args.width, size[0]), ("height", args.height, size[1])):
        if given is not None and given != actual:
            raise Flux2Error(
                f"--{name} {given} differs from the output's {name} {actual} ({what}): with --image the "
                "output takes the image's size; leave --width/--height out or give that size"
            )


def encode_edit(vae, edit: Edit | None, references, grid, tiles: dict):
    """(start latent, packed mask, references): an inpaint's source is also its first reference."""
    if edit is None:
        return None, None, references
    # img2img: capped and cropped as references are; inpaint: the prepared crop, already at its size
    start = progress.encode(vae, prepare_reference(edit.pixels, edit.max_pixels), tiles, "VAE encode (image)")
    if tuple(start.shape[-2:]) != grid:  # cannot happen: the output size is the encoded image's
        raise Flux2Error(
            f"the image encodes to a {start.shape[-1]}x{start.shape[-2]} latent grid, not {grid[1]}x{grid[0]}"
        )
    if edit.mask is None:
        return start, None, references
    source = ReferenceLatents.from_latents([start])
    references = source if references is None else source + references
    return start, latent_mask(edit.mask, grid), references


def composite_pixels(pixels: torch.Tensor, stitch, feather: int) -> torch.Tensor:
    """Decoded [B, 3, h, w] in -1..1 -> composited over the original, [B, 3, H, W] in -1..1."""
    images = [composite(((p + 1) / 2).clamp(0, 1).permute(1, 2, 0), stitch, feather) for p in pixels]
    return torch.stack([img.permute(2, 0, 1) * 2 - 1 for img in images])


def parse_sides(text: str) -> tuple[int, int, int, int]:
    try:
        sides = tuple(int(v) for v in text.split(","))
    except ValueError:
        sides = ()
    if len(sides) != 4:
        raise Flux2Error(f"--outpaint {text!r}: give LEFT,TOP,RIGHT,BOTTOM in pixels, e.g. 0,0,256,0")
    return sides
