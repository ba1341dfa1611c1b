"""Command line: ``python -m flux2_core generate ...``: text-to-image or reference editing without ComfyUI.

The text encoder runs first and is released before sampling, so the DiT and the text encoder never share the
device. Images are written as PNG; with a batch, ``OUT.png`` becomes ``OUT_1.png``, ``OUT_2.png``, ...
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import sys
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from tqdm import tqdm

from .configs import FLUX2, KLEIN_VARIANTS
from .errors import Flux2Error
from .hub import DEFAULT_MODEL
from .limits import check_fits
from .loading import weight_bytes
from .sampling import sampling_memory

log = logging.getLogger("flux2_core")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_OUTPUT = "flux2-klein.png"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flux2_core", description="FLUX.2 [klein] image generation"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="text-to-image, or editing with --reference images")
    where = "a .safetensors file, a folder, or a Hugging Face id (org/repo[@revision][/file])"
    gen.add_argument("--model", default=DEFAULT_MODEL, help=f"DiT: {where}; default {DEFAULT_MODEL}")
    gen.add_argument(
        "--text-encoder",
        default=None,
        help=f"Qwen3 text encoder: {where}; default: the model's repo if it has one, else the official "
        "repo that pairs with the model (klein 4B: Qwen3-4B, klein 9B: Qwen3-8B)",
    )
    gen.add_argument("--vae", default=None, help=f"FLUX.2 VAE: {where}; default: as for --text-encoder")
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
    gen.add_argument(
        "--output", default=DEFAULT_OUTPUT, help=f"image file, .png/.jpg/.webp (default {DEFAULT_OUTPUT})"
    )
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
    except torch.OutOfMemoryError:
        log.error(
            "error: out of memory: lower --width/--height, --batch-size or the number of references, or use "
            "--dtype bfloat16"
        )
        return 2
    except KeyboardInterrupt:
        log.error("interrupted: no image was written")
        return 130
    return 0


def generate(args: argparse.Namespace) -> list[Path]:
    from .dit_files import DIT_SPEC, load_transformer, transformer_variant
    from .limits import check_request, check_seed
    from .references import MAX_REFERENCE_PIXELS, encode_references, processed_size
    from .sampling import SampleSettings, check_conditioning, output_size, sample, settings_numbers
    from .text_encoder import QWEN3_SPEC, load_text_encoder
    from .vae import load_vae

    # 1. Everything that can be checked without reading a weight, before any model is loaded.
    device = _device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.float32 if device.type == "cpu" else torch.bfloat16)
    output = _check_output(Path(args.output))
    check_seed(args.seed)
    if args.reference_max_pixels is not None and args.reference_max_pixels < MIN_REFERENCE_PIXELS:
        raise Flux2Error(
            f"--reference-max-pixels {args.reference_max_pixels} is too small: give at least "
            f"{MIN_REFERENCE_PIXELS} (64 x 64), e.g. {MAX_REFERENCE_PIXELS} for 1024 x 1024"
        )
    for name in ("width", "height"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:  # 0 is no "default" here
            raise Flux2Error(
                f"--{name} {getattr(args, name)} is not a size: give a multiple of 16, or leave it out"
            )
    max_pixels = args.reference_max_pixels or MAX_REFERENCE_PIXELS
    images = [_open_image(p) for p in args.reference]
    sizes = [processed_size(*_size(image), max_pixels) for image in images]
    width, height = output_size(args.width, args.height, sizes[0] if sizes else None)
    config, dit_bytes, checkpoint = weight_bytes(DIT_SPEC, args.model, dtype)
    variant = transformer_variant(checkpoint, config, args.variant)
    text_encoder, vae_path = _companions(args, config.context_in_dim)
    steps = variant.default_steps if args.steps is None else args.steps
    guidance = variant.default_guidance if args.guidance is None else args.guidance
    settings = SampleSettings(width, height, steps, guidance, args.seed, args.batch_size)
    check_request(*settings_numbers(settings))
    _, te_bytes, _ = weight_bytes(QWEN3_SPEC, text_encoder, dtype)
    num_ref_tokens = sum(w * h for w, h in sizes) // FLUX2.size_multiple**2
    activations = sampling_memory(config, variant, dtype, settings, num_ref_tokens)
    _check_memory(
        device, dit_bytes, te_bytes, activations, f"{width}x{height} with {len(images)} reference(s)"
    )
    del checkpoint

    # 2. Text first, then the encoder leaves the device; references; sampling; decoding.
    model = load_transformer(args.model, variant=args.variant, dtype=dtype, device="cpu")
    encoder = load_text_encoder(text_encoder, dtype=dtype, device=device)
    prompts = [args.prompt]
    if model.variant.uses_cfg and guidance > 1.0:
        prompts.append(args.negative or "")
    check_conditioning(model, torch.empty(1, 1, encoder.output_dim), f"text encoder ({encoder.name})")
    with torch.inference_mode():
        conditioning = encoder.encode(prompts).cpu()
    del encoder
    _release(device)

    vae = load_vae(vae_path, dtype=torch.float32, device=device)
    references = encode_references(vae, images, max_pixels) if images else None
    model.transformer.to(device)
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
        pixels = torch.cat([vae.decode(item.to(device)).cpu() for item in latents.split(1)])
    return _save(pixels, output)


MIN_REFERENCE_PIXELS = 64 * 64
IMAGE_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP"}


def _companions(args: argparse.Namespace, context_width: int) -> tuple[str, str]:
    """The text encoder and VAE to use: as given, else from the model's own Hub repo when it has them, else
    from the official repo that pairs with the model's text width."""
    from .hub import PAIRED_REPOS, MissingComponent, local_path, parse

    given = {"text_encoder": args.text_encoder, "vae": args.vae}
    if all(given.values()):
        return args.text_encoder, args.vae
    ref = parse(args.model)
    source = None
    if ref is not None and not ref.filename:
        try:
            for component, value in given.items():
                if value is None:
                    local_path(args.model, component)
            source = args.model
        except MissingComponent:
            source = None
    if source is None:
        source = PAIRED_REPOS.get(context_width)
        if source is None:
            raise Flux2Error(
                f"no official text encoder pairs with a DiT reading {context_width}-wide text: give "
                "--text-encoder and --vae"
            )
        log.info("text encoder and VAE: from %s, the official pairing for this model", source)
    else:
        log.info("text encoder and VAE: from %s, the model's own repository", source)
    return args.text_encoder or source, args.vae or source


def _device(name: str | None) -> torch.device:
    """The compute device, or a clear error for one this machine does not have."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise Flux2Error(f"--device {name} is not a device name: use cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise Flux2Error(
                f"--device {name}: CUDA is not available (this torch {torch.__version__} has no CUDA, or no "
                "GPU is visible): use --device cpu, or install a CUDA build of torch"
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise Flux2Error(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise Flux2Error(f"--device {name}: Apple MPS is not available here: use --device cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise Flux2Error(f"--device {name} is not supported: use cpu or cuda")
    return device


def _check_output(output: Path) -> Path:
    """The output path must name an image file (by its extension) in a folder we can write."""
    if output.is_dir():
        raise Flux2Error(f"--output {output} is a folder: give a file name, e.g. {output / 'image.png'}")
    if output.suffix.lower() not in IMAGE_FORMATS:
        raise Flux2Error(
            f"--output {output} has no image extension: end it in {', '.join(IMAGE_FORMATS)} (e.g. "
            f"{output.with_suffix('.png').name})"
        )
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise Flux2Error(
            f"cannot create the output folder {output.parent} ({e.strerror}): choose another"
        ) from None
    if not os.access(output.parent, os.W_OK):
        raise Flux2Error(f"the output folder {output.parent} is not writable: choose another --output")
    return output


def _check_memory(device: torch.device, dit: int, text_encoder: int, activations: int, what: str) -> None:
    """The DiT waits in RAM while the text encoder runs on ``device``; then the DiT samples there."""
    advice = "lower --width/--height, --batch-size or the references, or use --dtype bfloat16"
    if device.type == "cpu":
        check_fits(dit + max(text_encoder, activations), device, f"sampling {what} on the CPU", advice)
        return
    check_fits(max(text_encoder, dit + activations), device, f"sampling {what}", advice)
    check_fits(dit, torch.device("cpu"), "holding the diffusion model in RAM while the text runs", advice)


def _size(image) -> tuple[int, int]:
    return image.size if isinstance(image, Image.Image) else (image.shape[1], image.shape[0])


def _open_image(path: str):
    """An image as a viewer shows it: EXIF orientation applied, alpha dropped (as ComfyUI's LoadImage does),
    16-bit and float images scaled to 0..1 rather than clipped. 8-bit images stay PIL images; others come back
    as float tensors [H, W, 3]. Images over PIL's decompression-bomb limit are refused."""
    try:
        with Image.open(path) as image:
            image = ImageOps.exif_transpose(image)
            if image.mode in ("I;16", "I;16B", "I;16L", "I;16N", "I", "F"):
                scale = 1.0 if image.mode == "F" else 65535.0
                gray = np.asarray(image, dtype=np.float32) / scale
                return torch.from_numpy(np.repeat(gray[..., None], 3, axis=-1)).clamp(0, 1)
            if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
                image = image.convert("RGBA")
            return image.convert("RGB")
    except Image.DecompressionBombError as e:
        raise Flux2Error(
            f"the reference image {path} is refused as a possible decompression bomb ({e}): use an image of "
            f"at most {2 * Image.MAX_IMAGE_PIXELS} pixels"
        ) from None
    except (OSError, ValueError) as e:
        raise Flux2Error(
            f"could not read the reference image {path} ({e}): use a PNG, JPEG or WebP file"
        ) from None


def _save(pixels: torch.Tensor, output: Path) -> list[Path]:
    """[B, 3, H, W] in -1..1 -> image files (rounded to 8 bit). Each is written under a temporary name and
    renamed once every file is complete, so an interrupted or failed save leaves no partial file."""
    arrays = ((pixels.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    if len(arrays) == 1:
        paths = [output]
    else:
        paths = [output.with_name(f"{output.stem}_{i + 1}{output.suffix}") for i in range(len(arrays))]
    temps = [path.with_name(f".{path.name}.{os.getpid()}.partial") for path in paths]
    fmt = IMAGE_FORMATS[output.suffix.lower()]
    try:
        for array, temp in zip(arrays, temps):
            Image.fromarray(array).save(temp, format=fmt)
        for temp, path in zip(temps, paths):
            os.replace(temp, path)
    except OSError as e:
        raise Flux2Error(
            f"could not write {output} ({e.strerror or e}): check the disk space and the path"
        ) from None
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)
    return paths


def _release(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


if __name__ == "__main__":
    sys.exit(main())
