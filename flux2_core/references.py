"""Reference images for editing: validation, pixel cap, multiple-of-16 centre crop, encoding to tokens.

Preprocessing follows BFL and diffusers: reject a side under 64 px or an aspect ratio over 8:1; when the image
has more than ``max_pixels`` pixels, scale it by sqrt(max_pixels / area) (sizes truncated to int, Lanczos);
then centre-crop (never resize) to multiples of 16. The two references differ on the cap: BFL allows 2024^2
for a single reference and 1024^2 for several, diffusers always 1024^2. We default to 1024^2 for every
reference (diffusers; also what ComfyUI's klein templates feed), and let the caller raise it.

Reference k gets position ids t = 10 * (k + 1) on its own latent grid. The plain klein models append the
references after the noisy tokens ([text, image, references]); the KV model computes their keys and values
once, on their own, and splices them in after the text at every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import numpy as np
import torch
from PIL import Image

from .configs import FLUX2
from .dit.rope import reference_ids
from .errors import Flux2Error
from .steering.reference_strength import PLAIN, ReferenceStrength, check_strengths
from .vae.progress import Progress, split_progress

MAX_REFERENCE_PIXELS = 1024 * 1024
MIN_SIDE = 64
MAX_ASPECT = 8.0
MULTIPLE = FLUX2.size_multiple


@dataclass
class ReferenceLatents:
    """Encoded references: tokens [1, R, 128] (float32), ids [R, 4], each reference's latent grid, and how
    much each counts (``reference_strength``; every one plain unless set)."""

    tokens: torch.Tensor
    ids: torch.Tensor
    grid_sizes: list[tuple[int, int]]
    strengths: tuple[ReferenceStrength, ...] = field(default=())

    def __post_init__(self) -> None:
        if not self.strengths:
            self.strengths = (PLAIN,) * len(self.grid_sizes)
        check_strengths(self.strengths, len(self.grid_sizes))

    @property
    def token_counts(self) -> list[int]:
        """Tokens of each reference, in order."""
        return [h * w for h, w in self.grid_sizes]

    @property
    def plain(self) -> bool:
        """Every reference at strength 1 over every step (the edit as the model was trained for it)."""
        return all(s.plain for s in self.strengths)

    def with_strength(self, strength: ReferenceStrength) -> ReferenceLatents:
        """The same references, every one of them at ``strength``."""
        return replace(self, strengths=(strength,) * len(self))

    @property
    def num_tokens(self) -> int:
        return self.tokens.shape[1]

    def __len__(self) -> int:
        return len(self.grid_sizes)

    def pixel_size(self, k: int = 0) -> tuple[int, int]:
        """(width, height) in pixels of reference k after preprocessing."""
        h, w = self.grid_sizes[k]
        return w * MULTIPLE, h * MULTIPLE

    def __add__(self, other: ReferenceLatents) -> ReferenceLatents:
        joined = ReferenceLatents.from_latents(self.latents() + other.latents())
        return replace(joined, strengths=self.strengths + other.strengths)

    def latents(self) -> list[torch.Tensor]:
        """The references as [1, 128, h, w] latents, in order."""
        out, start = [], 0
        for h, w in self.grid_sizes:
            out.append(self.tokens[:, start : start + h * w].transpose(1, 2).reshape(1, -1, h, w))
            start += h * w
        return out

    @staticmethod
    def from_latents(latents: list[torch.Tensor]) -> ReferenceLatents:
        """Pack [1, 128, h, w] latents (references 0, 1, ...) into one token sequence with their ids."""
        if not latents:
            return ReferenceLatents(torch.zeros(1, 0, FLUX2.latent_channels), reference_ids([]), [])
        grids = [(lat.shape[-2], lat.shape[-1]) for lat in latents]
        tokens = torch.cat([lat[:1].float().flatten(2).transpose(1, 2) for lat in latents], dim=1)
        return ReferenceLatents(tokens, reference_ids(grids), grids)


FIT_MODES = ("crop", "resize")


def prepare_reference(
    image: Image.Image | torch.Tensor, max_pixels: int = MAX_REFERENCE_PIXELS, fit: str = "crop"
) -> torch.Tensor:
    """PIL image or float tensor [3, H, W] / [H, W, 3] in 0..1 -> [1, 3, h, w] in -1..1, sides % 16 == 0.

    ``fit`` "crop" centre-crops to multiples of 16 (BFL, diffusers); "resize" scales to the nearest multiples
    of 16 instead, keeping the whole picture at the cost of a slight change of aspect (at most 8 px a side).
    """
    if fit not in FIT_MODES:
        raise Flux2Error(f"reference fit {fit!r} is unknown: choose one of {', '.join(FIT_MODES)}")
    if isinstance(image, Image.Image):
        pixels = _from_pil(image, max_pixels)
    else:
        pixels = _from_tensor(image, max_pixels)
    _, height, width = pixels.shape
    if fit == "resize":
        size = (
            max(MIN_SIDE, round(width / MULTIPLE) * MULTIPLE),
            max(MIN_SIDE, round(height / MULTIPLE) * MULTIPLE),
        )
        if size != (width, height):
            pixels = _resize_float(pixels, size)
        return (pixels * 2.0 - 1.0).unsqueeze(0)
    crop_w, crop_h = width // MULTIPLE * MULTIPLE, height // MULTIPLE * MULTIPLE
    left, top = (width - crop_w) // 2, (height - crop_h) // 2
    pixels = pixels[:, top : top + crop_h, left : left + crop_w]
    return (pixels * 2.0 - 1.0).unsqueeze(0)


def encode_references(
    vae,
    images: list,
    max_pixels: int = MAX_REFERENCE_PIXELS,
    interrupt: Callable[[], None] | None = None,
    fit: str = "crop",
    tile_size: int | None = None,
    tile_overlap: int = 64,
    progress: Progress | None = None,
) -> ReferenceLatents:
    """Preprocess and encode each reference separately (they may differ in size) and pack them in order.

    ``interrupt`` is called before each image and may raise to stop. ``tile_size`` and ``tile_overlap``
    are passed to ``AutoEncoder.encode`` (tiled encoding of large references; None: automatic).
    ``progress`` counts the encodes as one run after another (``vae.progress.split_progress``).
    """
    tiling = {} if tile_size is None else {"tile_size": tile_size, "tile_overlap": tile_overlap}
    latents = []
    for image, part in zip(images, split_progress(progress, len(images))):
        if interrupt is not None:
            interrupt()
        pixels = prepare_reference(image, max_pixels, fit)
        latents.append(vae.encode(pixels, progress=part, **tiling).float().cpu())
    return ReferenceLatents.from_latents(latents)


def scaled_size(width: int, height: int, max_pixels: int) -> tuple[int, int]:
    """The size an image is scaled to before cropping (unchanged when within the cap)."""
    _validate(width, height)
    if width * height <= max_pixels:
        return width, height
    scale = math.sqrt(max_pixels / (width * height))
    size = int(width * scale), int(height * scale)
    if min(size) < MIN_SIDE:
        raise Flux2Error(
            f"a {width}x{height} reference capped at {max_pixels} pixels would be {size[0]}x{size[1]}, under "
            f"{MIN_SIDE} px a side: raise the pixel cap (max_megapixels / --reference-max-pixels)"
        )
    return size


def processed_size(width: int, height: int, max_pixels: int = MAX_REFERENCE_PIXELS) -> tuple[int, int]:
    """(width, height) of an image of this size after preprocessing: the pixel cap, then the crop to 16."""
    scaled_w, scaled_h = scaled_size(width, height, max_pixels)
    return scaled_w // MULTIPLE * MULTIPLE, scaled_h // MULTIPLE * MULTIPLE


def _validate(width: int, height: int) -> None:
    if width < MIN_SIDE or height < MIN_SIDE:
        raise Flux2Error(
            f"reference image is {width}x{height}: both sides must be at least {MIN_SIDE} px; "
            "use a larger image"
        )
    if max(width / height, height / width) > MAX_ASPECT:
        raise Flux2Error(
            f"reference image is {width}x{height}, an aspect ratio over {MAX_ASPECT:g}:1: "
            "crop it closer to square"
        )


def _from_pil(image: Image.Image, max_pixels: int) -> torch.Tensor:
    image = image.convert("RGB")
    size = scaled_size(*image.size, max_pixels)
    if size != image.size:
        image = image.resize(size, Image.Resampling.LANCZOS)
    return torch.from_numpy(np.asarray(image, dtype=np.float32) / 255.0).permute(2, 0, 1)


def _from_tensor(image: torch.Tensor, max_pixels: int) -> torch.Tensor:
    if image.ndim == 4 and image.shape[0] == 1:
        image = image[0]
    if image.ndim != 3 or 3 not in (image.shape[0], image.shape[-1]):
        raise Flux2Error(
            f"reference image tensor has shape {list(image.shape)}: expected [3, H, W] or [H, W, 3]"
        )
    if image.shape[0] != 3:
        image = image.permute(2, 0, 1)
    image = image.detach().float().cpu()
    height, width = image.shape[1:]
    size = scaled_size(width, height, max_pixels)
    if size == (width, height):
        return image
    return _resize_float(image, size)


def _resize_float(image: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[3, H, W] float -> [3, h, w]: Lanczos on each float channel ("F" mode), adding no 8-bit rounding."""
    channels = [Image.fromarray(c.numpy(), mode="F").resize(size, Image.Resampling.LANCZOS) for c in image]
    return torch.from_numpy(np.stack([np.asarray(c) for c in channels])).clamp(0, 1)
