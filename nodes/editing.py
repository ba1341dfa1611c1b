"""Editing nodes: encode an image to a start latent, prepare an inpaint (crop-to-mask, source as the first
reference), composite the result back over the original, and pad a canvas for outpainting.

The inpaint latent is ComfyUI's LATENT with a ``noise_mask`` at pixel resolution (1 = repaint), the same key
native ``SetLatentNoiseMask`` writes, so native masks and latents work with our sampler too.
"""

from __future__ import annotations

import torch

from ..flux2_core import (
    FLUX2,
    Flux2Error,
    ReferenceLatents,
    check_size,
    composite,
    outpaint_canvas,
    prepare_inpaint,
    prepare_reference,
)
from . import convert, host, types
from .types import socket

PAD = {"default": 0, "min": 0, "max": 4096, "step": FLUX2.size_multiple}


class Flux2KleinEncode:
    DESCRIPTION = (
        "Encodes images to FLUX.2 latents (centre-cropped to multiples of 16), the start of an img2img run: "
        "connect the latent to the sampler and set its denoise below 1."
    )
    CATEGORY = "flux2_klein/latent"
    RETURN_TYPES = (types.LATENT,)
    RETURN_NAMES = ("latent",)
    OUTPUT_TOOLTIPS = ("FLUX.2 latents [batch, 128, height/16, width/16].",)
    FUNCTION = "encode"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "vae": socket(types.VAE, "From FLUX.2 VAE Loader."),
                "image": socket(types.IMAGE, "The images to start from (a batch gives a batch of latents)."),
            }
        }

    def encode(self, vae: types.KleinVAE, image):
        height, width = image.shape[1:3]
        m = FLUX2.size_multiple
        check_size(width // m * m, height // m * m)  # a side the sampler would refuse is refused here
        host.load(vae.patcher, vae.vae.encode_memory(height, width))
        latents = []
        for item in convert.image_to_list(image):
            host.check_interrupt()
            with host.out_of_memory(f"encoding {width}x{height}", "encode a smaller image"):
                pixels = prepare_reference(item, max_pixels=width * height)
                latents.append(vae.vae.encode(pixels).float())
        if len({tuple(lat.shape) for lat in latents}) > 1:
            raise Flux2Error("the images of the batch have different sizes: encode them separately")
        return ({"samples": torch.cat(latents).to(host.intermediate_device())},)


class Flux2KleinInpaintPrepare:
    DESCRIPTION = (
        "Prepares an inpaint: the image (or, with crop_to_mask, the mask's box plus some context) at the "
        "model's resolution, its latent with the mask for the sampler, the references with the image first, "
        "and what FLUX.2 Composite needs to put the result back over the original."
    )
    CATEGORY = "flux2_klein/inpaint"
    RETURN_TYPES = (types.LATENT, types.REFERENCES, types.STITCH)
    RETURN_NAMES = ("latent", "references", "stitch")
    OUTPUT_TOOLTIPS = (
        "The source latent with its noise_mask: connect it to the sampler's latent input.",
        "The source image as reference 1, then the extra references: connect them to the sampler.",
        "For FLUX.2 Composite.",
    )
    FUNCTION = "prepare"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "vae": socket(types.VAE, "From FLUX.2 VAE Loader."),
                "image": socket(types.IMAGE, "The image to inpaint (one image)."),
                "mask": socket(types.MASK, "White / 1 = repaint, black / 0 = keep (e.g. Load Image's MASK)."),
            },
            "optional": {
                "references": socket(types.REFERENCES, "Extra references, after the image itself."),
                "grow_mask": socket("INT", "Grow the mask by this many pixels.", default=0, min=0, max=256),
                "crop_to_mask": socket(
                    "BOOLEAN",
                    "Sample only the mask's box plus the context, at up to about 1 megapixel (a small mask "
                    "on a big image is enlarged up to 4x for detail); off: the whole image, at most 1 MP.",
                    default=False,
                ),
                "context": socket(
                    "INT",
                    "Pixels of context around the mask's box (crop_to_mask).",
                    default=64,
                    min=0,
                    max=2048,
                ),
            },
        }

    def prepare(self, vae: types.KleinVAE, image, mask, references=None, grow_mask=0, crop_to_mask=False,
                context=64):  # fmt: skip
        if image.shape[0] != 1 or (mask.ndim == 3 and mask.shape[0] != 1):
            raise Flux2Error("inpaint one image at a time: the image (and mask) batch must hold one")
        pixels, crop_mask, stitch = prepare_inpaint(image[0], mask, grow_mask, crop_to_mask, context)
        height, width = pixels.shape[:2]
        host.load(vae.patcher, vae.vae.encode_memory(height, width))
        with host.out_of_memory(f"encoding {width}x{height}", "use crop_to_mask or a smaller image"):
            source = vae.vae.encode(prepare_reference(pixels, max_pixels=width * height)).float()
        refs = ReferenceLatents.from_latents([source.cpu()])
        if references is not None:
            refs = refs + references
        latent = {
            "samples": source.to(host.intermediate_device()),
            "noise_mask": crop_mask[None, None].to(host.intermediate_device()),
        }
        return (latent, refs, stitch)


class Flux2KleinComposite:
    DESCRIPTION = (
        "Puts the inpainted result back over the original image at its size: outside the mask every pixel is "
        "exactly the original's; feather softens a hard mask's edge, inside the mask (a mask that fades "
        "already, like Outpaint Pad's, blends through its own fade)."
    )
    CATEGORY = "flux2_klein/inpaint"
    RETURN_TYPES = (types.IMAGE,)
    RETURN_NAMES = ("image",)
    OUTPUT_TOOLTIPS = ("The original image with the masked area repainted.",)
    FUNCTION = "composite"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "image": socket(
                    types.IMAGE,
                    "The decoded inpaint result (FLUX.2 Decode or FLUX.1 Fill [dev] Decode).",
                ),
                "stitch": socket(types.STITCH, "From FLUX.2 Inpaint Prepare or FLUX.1 Fill [dev] Sampler."),
                "feather": socket(
                    "INT", "Blend width in pixels, inside the mask.", default=8, min=0, max=256
                ),
            }
        }

    def composite(self, image, stitch, feather=8):
        out = torch.stack([composite(item, stitch, feather) for item in convert.image_to_list(image)])
        return (out.to(host.intermediate_device()),)


class Flux2KleinOutpaintPad:
    DESCRIPTION = (
        "Adds space around an image for outpainting: the new area is grey and masked for repainting, the "
        "mask fading into the original's edge over feather pixels. Feed both to FLUX.2 Inpaint "
        "Prepare or to the FLUX.1 Fill [dev] Sampler."
    )
    CATEGORY = "flux2_klein/inpaint"
    RETURN_TYPES = (types.IMAGE, types.MASK)
    RETURN_NAMES = ("image", "mask")
    OUTPUT_TOOLTIPS = (
        "The larger canvas.",
        "1 on the new area, fading to 0 over feather pixels into the image (0 on the image with feather 0).",
    )
    FUNCTION = "pad"

    @classmethod
    def INPUT_TYPES(cls):
        sides = {name: socket("INT", f"Pixels to add on the {name} (a multiple of 16).", **PAD)
                 for name in ("left", "top", "right", "bottom")}  # fmt: skip
        return {
            "required": {
                "image": socket(types.IMAGE, "The image to extend."),
                **sides,
                "feather": socket(
                    "INT",
                    "Pixels over which the mask fades into the image; 0 gives a hard edge (then set "
                    "FLUX.2 Composite's feather to 0 too, so the new area's seam is not blended with the "
                    "grey canvas).",
                    default=24,
                    min=0,
                    max=512,
                ),  # fmt: skip
            }
        }

    def pad(self, image, left, top, right, bottom, feather=24):
        canvases, masks = zip(
            *(
                outpaint_canvas(item, left, top, right, bottom, feather)
                for item in convert.image_to_list(image)
            )
        )
        device = host.intermediate_device()
        return (torch.stack(canvases).to(device), torch.stack(masks).to(device))
