"""Editing nodes: encode an image to a start latent, prepare an inpaint (crop-to-mask, source as the first
reference), composite the result back over the original, and pad a canvas for outpainting.

The inpaint latent is ComfyUI's LATENT with a ``noise_mask`` at pixel resolution (1 = repaint), the same key
native ``SetLatentNoiseMask`` writes, so native masks and latents work with our sampler too.
"""

from __future__ import annotations

import torch

from ..flux2_core import (
    FLUX2,
    ReferenceLatents,
    check_image_size,
    composite,
    encode_image,
    encode_images,
    inpaint_crop,
    outpaint_canvas,
)
from . import convert, host, sockets, types
from .aliases import KLEIN
from .sockets import io
from .vae_runs import encoding

PAD = {"default": 0, "min": 0, "max": 4096, "step": FLUX2.size_multiple}
INPAINT = "flux2_klein/inpaint"
CROP_TO_MASK_TOOLTIP = (
    "Sample only the mask's box plus the context, at up to about 1 megapixel (a small mask on a big image "
    "is enlarged up to 4x for detail); off: the whole image, at most 1 MP."
)


class Flux2KleinEncode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinEncode",
            search_aliases=[*KLEIN, "vae encode", "encode", "img2img", "编码"],
            display_name="FLUX.2 Encode",
            category="flux2_klein/latent",
            description=(
                "Encodes images to FLUX.2 latents (centre-cropped to multiples of 16), the start of an "
                "img2img run: connect the latent to the sampler and set its denoise below 1."
            ),
            inputs=[
                sockets.Vae.Input("vae", tooltip="From FLUX.2 VAE Loader."),
                io.Image.Input(
                    "image", tooltip="The images to start from (a batch gives a batch of latents)."
                ),
            ],
            outputs=[
                io.Latent.Output(
                    display_name="latent", tooltip="FLUX.2 latents [batch, 128, height/16, width/16]."
                )
            ],
        )

    @classmethod
    def execute(cls, vae: types.KleinVAE, image) -> io.NodeOutput:
        check_image_size(image.shape[2], image.shape[1])  # a side the sampler would refuse is refused here
        with encoding(vae, image.shape[1:3]) as progress:
            latents = encode_images(vae.vae, convert.image_to_list(image), host.check_interrupt, progress)
        return io.NodeOutput({"samples": latents.to(host.intermediate_device())})


class Flux2KleinInpaintPrepare(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinInpaintPrepare",
            search_aliases=[*KLEIN, "inpaint", "mask", "inpaint crop", "局部重绘"],
            display_name="FLUX.2 Inpaint Prepare",
            category=INPAINT,
            description=(
                "Prepares an inpaint: the image (or, with crop_to_mask, the mask's box plus some context) at "
                "the model's resolution, its latent with the mask for the sampler, the references with the "
                "image first, and what FLUX.2 Composite needs to put the result back over the original."
            ),
            inputs=[
                sockets.Vae.Input("vae", tooltip="From FLUX.2 VAE Loader."),
                io.Image.Input("image", tooltip="The image to inpaint (one image)."),
                io.Mask.Input(
                    "mask", tooltip="White / 1 = repaint, black / 0 = keep (e.g. Load Image's MASK)."
                ),
                sockets.References.Input(
                    "references", optional=True, tooltip="Extra references, after the image itself."
                ),
                io.Int.Input(
                    "grow_mask",
                    optional=True,
                    tooltip="Grow the mask by this many pixels.",
                    default=0,
                    min=0,
                    max=256,
                ),  # fmt: skip
                io.Boolean.Input("crop_to_mask", optional=True, tooltip=CROP_TO_MASK_TOOLTIP, default=False),
                io.Int.Input(
                    "context",
                    optional=True,
                    advanced=True,
                    tooltip="Pixels of context around the mask's box (crop_to_mask).",
                    default=64,
                    min=0,
                    max=2048,
                ),  # fmt: skip
            ],
            outputs=[
                io.Latent.Output(
                    display_name="latent",
                    tooltip="The source latent with its noise_mask: connect it to the sampler's latent "
                    "input.",
                ),
                sockets.References.Output(
                    display_name="references",
                    tooltip="The source image as reference 1, then the extra references: connect them to the "
                    "sampler.",
                ),
                sockets.Stitch.Output(display_name="stitch", tooltip="For FLUX.2 Composite."),
            ],
        )

    @classmethod
    def execute(cls, vae: types.KleinVAE, image, mask, references=None, grow_mask=0, crop_to_mask=False,
                context=64):  # fmt: skip
        pixels, crop_mask, stitch = inpaint_crop(image, mask, grow_mask, crop_to_mask, context)
        with encoding(vae, pixels.shape[:2], "use crop_to_mask or a smaller image") as progress:
            source = encode_image(vae.vae, pixels, progress)
        refs = ReferenceLatents.from_latents([source.cpu()])  # the source first, then the extra references
        device = host.intermediate_device()
        latent = {"samples": source.to(device), "noise_mask": crop_mask[None, None].to(device)}
        return io.NodeOutput(latent, refs if references is None else refs + references, stitch)


class Flux2KleinComposite(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinComposite",
            search_aliases=[*KLEIN, "inpaint", "composite", "stitch", "paste back", "局部重绘"],
            display_name="FLUX.2 Composite",
            category=INPAINT,
            description=(
                "Puts the inpainted result back over the original image at its size: outside the mask every "
                "pixel is exactly the original's; feather softens a hard mask's edge, inside the mask (a "
                "mask that fades already, like Outpaint Pad's, blends through its own fade)."
            ),
            inputs=[
                io.Image.Input(
                    "image", tooltip="The decoded inpaint result (FLUX.2 Decode or FLUX.1 Fill [dev] Decode)."
                ),
                sockets.Stitch.Input(
                    "stitch", tooltip="From FLUX.2 Inpaint Prepare or FLUX.1 Fill [dev] Sampler."
                ),
                io.Int.Input(
                    "feather", tooltip="Blend width in pixels, inside the mask.", default=8, min=0, max=256
                ),
            ],
            outputs=[
                io.Image.Output(
                    display_name="image", tooltip="The original image with the masked area repainted."
                )
            ],
        )

    @classmethod
    def execute(cls, image, stitch, feather=8) -> io.NodeOutput:
        out = torch.stack([composite(item, stitch, feather) for item in convert.image_to_list(image)])
        return io.NodeOutput(out.to(host.intermediate_device()))


class Flux2KleinOutpaintPad(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        sides = [io.Int.Input(name, tooltip=f"Pixels to add on the {name} (a multiple of 16).", **PAD)
                 for name in ("left", "top", "right", "bottom")]  # fmt: skip
        return io.Schema(
            node_id="Flux2KleinOutpaintPad",
            search_aliases=[*KLEIN, "outpaint", "pad image", "extend", "扩图"],
            display_name="FLUX.2 Outpaint Pad",
            category=INPAINT,
            description=(
                "Adds space around an image for outpainting: the new area is grey and masked for repainting, "
                "the mask fading into the original's edge over feather pixels. Feed both to FLUX.2 Inpaint "
                "Prepare or to the FLUX.1 Fill [dev] Sampler."
            ),
            inputs=[
                io.Image.Input("image", tooltip="The image to extend."),
                *sides,
                io.Int.Input(
                    "feather",
                    tooltip="Pixels over which the mask fades into the image; 0 gives a hard edge (then set "
                    "FLUX.2 Composite's feather to 0 too, so the new area's seam is not blended with the "
                    "grey canvas).",
                    default=24,
                    min=0,
                    max=512,
                ),
            ],
            outputs=[
                io.Image.Output(display_name="image", tooltip="The larger canvas."),
                io.Mask.Output(
                    display_name="mask",
                    tooltip="1 on the new area, fading to 0 over feather pixels into the image (0 on the "
                    "image with feather 0).",
                ),
            ],
        )

    @classmethod
    def execute(cls, image, left, top, right, bottom, feather=24):
        canvases, masks = zip(
            *(
                outpaint_canvas(item, left, top, right, bottom, feather)
                for item in convert.image_to_list(image)
            )
        )
        device = host.intermediate_device()
        return io.NodeOutput(torch.stack(canvases).to(device), torch.stack(masks).to(device))
