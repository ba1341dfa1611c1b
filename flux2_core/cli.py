"""Command line: ``python -m flux2_core generate ...``: text-to-image or reference editing without ComfyUI.

The text encoder runs first and is released before sampling, so the DiT and the text encoder never share the
device. Images are written as PNG; with a batch, ``OUT.png`` becomes ``OUT_1.png``, ``OUT_2.png``, ...
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path

import torch
from PIL import Image
from tqdm import tqdm

from .configs import KLEIN_VARIANTS
from .errors import Flux2Error

log = logging.getLogger("flux2_core")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flux2_core", description="FLUX.2 [klein] image generation"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="text-to-image, or editing with --reference images")
    gen.add_argument("--model", required=True, help="DiT: .safetensors file or diffusers folder")
    gen.add_argument("--text-encoder", required=True, help="Qwen3 text encoder: file or folder")
    gen.add_argument("--vae", required=True, help="FLUX.2 VAE: file or folder")
    gen.add_argument("--prompt", required=True)
    gen.add_argument(
        "--negative", default=None, help="negative prompt for base models (default: empty prompt)"
    )
    gen.add_argument("--reference", action="append", default=[], help="reference image; repeat for more")
    gen.add_argument(
        "--reference-max-pixels", type=int, default=None, help="pixel cap per reference (1024^2)"
    )
    gen.add_argument("--width", type=int, default=None, help="default: first reference's size, else 1024")
    gen.add_argument("--height", type=int, default=None)
    gen.add_argument("--steps", type=int, default=None, help="default: 4 distilled / kv, 50 base")
    gen.add_argument("--guidance", type=float, default=None, help="default: 1.0 distilled / kv, 4.0 base")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--batch-size", type=int, default=1)
    gen.add_argument("--variant", default="auto", choices=["auto", *KLEIN_VARIANTS])
    gen.add_argument(
        "--dtype", default=None, choices=list(DTYPES), help="default: bfloat16 on GPU, float32 on CPU"
    )
    gen.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    gen.add_argument("--output", required=True, help="output PNG path")
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = build_parser().parse_args(argv)
    try:
        for path in generate(args):
            log.info("saved %s", path)
    except Flux2Error as e:
        log.error("error: %s", e)
        return 2
    return 0


def generate(args: argparse.Namespace) -> list[Path]:
    from .dit_files import load_transformer
    from .references import MAX_REFERENCE_PIXELS, encode_references, processed_size
    from .sampling import SampleSettings, check_conditioning, check_size, output_size, sample
    from .text_encoder import load_text_encoder
    from .vae import load_vae

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = DTYPES[args.dtype] if args.dtype else (torch.float32 if device.type == "cpu" else torch.bfloat16)
    images = [_open_image(p) for p in args.reference]
    max_pixels = args.reference_max_pixels or MAX_REFERENCE_PIXELS
    first = processed_size(*images[0].size, max_pixels) if images else None
    width, height = output_size(args.width, args.height, first)
    check_size(width, height)

    model = load_transformer(args.model, variant=args.variant, dtype=dtype, device="cpu")
    steps = args.steps or model.variant.default_steps
    guidance = model.variant.default_guidance if args.guidance is None else args.guidance
    encoder = load_text_encoder(args.text_encoder, dtype=dtype, device=device)
    prompts = [args.prompt]
    if model.variant.uses_cfg and guidance > 1.0:
        prompts.append(args.negative or "")
    check_conditioning(model, torch.empty(1, 1, encoder.output_dim), f"text encoder ({encoder.name})")
    with torch.inference_mode():
        conditioning = encoder.encode(prompts).cpu()
    del encoder
    _release(device)

    vae = load_vae(args.vae, dtype=torch.float32, device=device)
    references = encode_references(vae, images, max_pixels) if images else None
    model.transformer.to(device)
    settings = SampleSettings(width, height, steps, guidance, args.seed, args.batch_size)
    log.info(
        "%s (%s): %dx%d, %d steps, guidance %g, seed %d",
        model.name,
        model.variant.name,
        width,
        height,
        steps,
        guidance,
        args.seed,
    )
    with tqdm(total=steps, unit="step", disable=None) as bar:
        latents = sample(
            model,
            conditioning[:1],
            settings,
            negative=conditioning[1:] if len(prompts) > 1 else None,
            references=references,
            callback=lambda done, total, x0: bar.update(1),
        )
    model.transformer.to("cpu")
    _release(device)
    with torch.inference_mode():
        pixels = vae.decode(latents.to(device)).float().cpu()
    return _save(pixels, Path(args.output))


def _open_image(path: str) -> Image.Image:
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, ValueError) as e:
        raise Flux2Error(
            f"could not read the reference image {path} ({e}): use a PNG, JPEG or WebP file"
        ) from None


def _save(pixels: torch.Tensor, output: Path) -> list[Path]:
    """[B, 3, H, W] in -1..1 -> PNG files (rounded to 8 bit)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    arrays = ((pixels.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    if len(arrays) == 1:
        paths = [output]
    else:
        paths = [
            output.with_name(f"{output.stem}_{i + 1}{output.suffix or '.png'}") for i in range(len(arrays))
        ]
    for array, path in zip(arrays, paths):
        Image.fromarray(array).save(path)
    return paths


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
