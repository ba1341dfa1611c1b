"""The images a host hands to an edit: checked, cropped and encoded at their own size.

Images are float tensors [H, W, 3] in 0..1, a batch [B, H, W, C] (ComfyUI's IMAGE layout); masks [H, W] or
[B, H, W] in 0..1, 1 = repaint. An image is encoded centre-cropped to multiples of 16 (as a reference is, with
no pixel cap), so its latent is [1, 128, H/16, W/16].
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..configs import FLUX2
from ..editing import Stitch, prepare_inpaint
from ..errors import Flux2Error
from ..limits import check_size
from ..references import prepare_reference, processed_size
from ..vae.progress import Progress, split_progress


def check_image_size(width: int, height: int) -> None:
    """An image of ``width x height`` encodes (cropped to multiples of 16) to a size the sampler takes."""
    m = FLUX2.size_multiple
    check_size(width // m * m, height // m * m)


def encode_image(vae, image: torch.Tensor, progress: Progress | None = None) -> torch.Tensor:
    """One image [H, W, 3] at its own size -> its latent [1, 128, H/16, W/16], float32; ``progress``: the
    encode's (``vae.progress``)."""
    height, width = image.shape[:2]
    return vae.encode(prepare_reference(image, max_pixels=width * height), progress=progress).float()


def encode_images(
    vae,
    images: list[torch.Tensor],
    interrupt: Callable[[], None] | None = None,
    progress: Progress | None = None,
) -> torch.Tensor:
    """``encode_image`` of each image of a batch (``interrupt`` called before each): [B, 128, h, w];
    ``progress`` counts the encodes as one run after another (``vae.progress.split_progress``)."""
    latents = []
    for image, part in zip(images, split_progress(progress, len(images))):
        if interrupt is not None:
            interrupt()
        latents.append(encode_image(vae, image, part))
    if len({tuple(latent.shape) for latent in latents}) > 1:
        raise Flux2Error("the images of the batch have different sizes: encode them separately")
    return torch.cat(latents)


def reference_encode_memory(
    vae,
    images: list[torch.Tensor],
    max_pixels: int,
    fit: str = "crop",
    tile_size: int = 0,
    tile_overlap: int = 64,
) -> int:
    """What encoding the largest of ``images`` [H, W, 3] as references needs, at the size preprocessing
    gives it ("resize" may round a side up by up to 16 px)."""
    pad = 16 if fit == "resize" else 0
    sizes = [processed_size(image.shape[1], image.shape[0], max_pixels) for image in images]
    return max((vae.encode_memory(h + pad, w + pad, tile_size, tile_overlap) for w, h in sizes), default=0)


def inpaint_crop(
    image: torch.Tensor, mask: torch.Tensor, grow: int = 0, crop_to_mask: bool = False, context: int = 64
) -> tuple[torch.Tensor, torch.Tensor, Stitch]:
    """``editing.prepare_inpaint`` of the one image of a batch [1, H, W, C] and its mask [H, W] or [1, H, W]:
    (the area to sample [h, w, 3], its mask [h, w], the stitch that puts the result back)."""
    if image.shape[0] != 1 or (mask.ndim == 3 and mask.shape[0] != 1):
        raise Flux2Error("inpaint one image at a time: the image (and mask) batch must hold one")
    return prepare_inpaint(image[0], mask, grow, crop_to_mask, context)
