"""Tiled refinement on the command line: ``--image`` (enlarged first by ``--upscale F``, Lanczos) refined in
``--tile-size`` px tiles sharing ``--tile-overlap`` px at ``--strength`` (``upscale.tiled``), decoded in
tiles. Checked with the other arguments before any model is loaded; the memory plan is one tile's run with
its reference (the canvas's latents on top)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch
from PIL import Image
from tqdm import tqdm

from ..configs import FLUX2
from ..errors import Flux2Error
from ..limits import check_size
from ..references import prepare_reference
from ..upscale.tiled import DEFAULT_OVERLAP, TiledRefine, tile_grid, tiled_refine
from ..vae.autoencoder import load_vae
from . import inputs, progress

REFINE_STRENGTH = 0.35  # --strength's default with --tile-size: detail added, the picture kept
ALONE = ("mask", "outpaint", "reference", "region", "controlnet", "sigmas", "parallel")


def add_flags(gen) -> None:
    gen.add_argument(
        "--tile-size", type=int, default=None, metavar="PX",
        help=f"refine --image in tiles of PX pixels (a multiple of 16; 1024: klein's native size) blended at "
        f"every step, no seams; --strength default {REFINE_STRENGTH}",
    )  # fmt: skip
    gen.add_argument(
        "--tile-overlap", type=int, default=DEFAULT_OVERLAP, metavar="PX",
        help=f"with --tile-size: pixels neighbouring tiles share (default {DEFAULT_OVERLAP}; at most half "
        "a tile)",
    )  # fmt: skip
    gen.add_argument(
        "--upscale", type=float, default=None, metavar="F",
        help="with --tile-size: enlarge --image F times (Lanczos) before the tiled refinement",
    )  # fmt: skip


@dataclass
class Canvas:
    """The enlarged image (cropped to multiples of 16 when encoded) and the refinement's numbers."""

    image: Image.Image | torch.Tensor
    width: int
    height: int
    strength: float
    tile: int


def check(args: argparse.Namespace, fill: bool) -> Canvas | None:
    """--tile-size with what it needs and allows, and the enlarged canvas; None without --tile-size."""
    if fill and args.tile_size is not None:
        raise Flux2Error("--tile-size is for FLUX.2 klein models: FLUX.1 Fill [dev] has no tiled refinement")
    if args.tile_size is None:
        if args.upscale is not None:
            raise Flux2Error("--upscale enlarges the image for a tiled refinement: give --tile-size too")
        return None
    if args.image is None:
        raise Flux2Error("--tile-size refines an image: give it with --image")
    given = [f"--{name}" for name in ALONE if getattr(args, name, None) not in (None, [], False)]
    if given:
        raise Flux2Error(f"--tile-size refines --image with the prompt alone: leave out {', '.join(given)}")
    if len(args.prompt) > 1:
        raise Flux2Error("--tile-size refines one image with one prompt: give --prompt once")
    if args.batch_size != 1 or args.width is not None or args.height is not None:
        raise Flux2Error("--tile-size refines one image at its (enlarged) size: leave out --batch-size, "
                         "--width and --height")  # fmt: skip
    strength = REFINE_STRENGTH if args.strength is None else args.strength
    if not 0.0 <= strength <= 1.0:
        raise Flux2Error(
            f"strength (denoise) is {strength}: use a value from 0 (keep the image) to 1 (repaint)"
        )
    image = inputs.open_image(args.image)
    width, height = inputs.image_size(image)
    if args.upscale is not None:
        if not 1.0 <= args.upscale <= 8.0:
            raise Flux2Error(f"--upscale {args.upscale:g} is not allowed: give a factor from 1 to 8")
        width, height = round(width * args.upscale), round(height * args.upscale)
        pil = image if isinstance(image, Image.Image) else _to_pil(image)
        image = pil.resize((width, height), Image.LANCZOS)
    m = FLUX2.size_multiple
    width, height = width // m * m, height // m * m
    check_size(width, height)
    tile_grid(width, height, args.tile_size, args.tile_overlap)  # the tiles' refusals
    return Canvas(image, width, height, strength, args.tile_size)


def refs(canvas: Canvas | None) -> list[tuple[int, int]]:
    """The reference sizes the common plan counts: one tile's (its window of the image), or none."""
    if canvas is None:
        return []
    return [(min(canvas.tile, canvas.width), min(canvas.tile, canvas.height))]


def planned_args(args: argparse.Namespace, canvas: Canvas | None) -> argparse.Namespace:
    """The arguments the common plan checks: one tile's run at its size (as they are without tiles)."""
    if canvas is None:
        return args
    (width, height), none = refs(canvas)[0], {"image": None, "strength": None}
    return argparse.Namespace(**{**vars(args), "width": width, "height": height, **none})


def run(request, plan, model, conditioning) -> list:
    """Encode the canvas, refine it in tiles on the DiT's device, decode it in tiles, write it."""
    args, canvas, device = request.args, request.tiled, request.device
    vae = load_vae(plan.vae, dtype=torch.float32, device=device)
    with torch.inference_mode():
        pixels = prepare_reference(canvas.image, canvas.width * canvas.height)
        source = progress.encode(vae, pixels, request.tiles)
    negative = conditioning[1:2] if model.variant.uses_cfg and plan.settings.guidance > 1.0 else None
    model.transformer.to(device)
    with tqdm(total=plan.settings.steps, unit="step") as bar:
        refine = TiledRefine(
            model, conditioning[:1], source, plan.settings.steps, canvas.strength, args.seed, args.tile_size,
            args.tile_overlap, negative=negative, guidance=plan.settings.guidance,
            callback=lambda done, total, x0: bar.update(1),
        )  # fmt: skip
        latent = tiled_refine(refine)
    model.transformer.to("cpu")
    inputs.release(device)
    image = progress.decode_each(vae, latent, device, request.tiles)
    return inputs.save_images([image], request.output)


def _to_pil(image: torch.Tensor) -> Image.Image:
    return Image.fromarray((image.clamp(0, 1) * 255).round().to(torch.uint8).numpy())
