"""What the command line is given, read and checked before any model is loaded: the device, the output path,
images and masks (as a viewer shows them), the text encoder and VAE that pair with the model, the memory a
run needs; and the images it writes (complete or not at all)."""

from __future__ import annotations

import argparse
import gc
import logging
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps

from ..configs import FLUX2
from ..errors import Flux2Error
from ..flow import given_sigmas
from ..limits import GB, check_fits
from ..lora import read_lora
from ..steering.reference_strength import ReferenceStrength
from ..steering.regions import latent_region_mask
from ..weights.hub import PAIRED_REPOS, MissingComponent, local_path, parse

log = logging.getLogger("flux2_core")

MIN_REFERENCE_PIXELS = 64 * 64
HIGH_BIT_DEPTH = ("I;16", "I;16B", "I;16L", "I;16N", "I", "F")
IMAGE_FORMATS = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP"}


def companions(args: argparse.Namespace, context_width: int) -> tuple[str, str]:
    """The text encoder and VAE to use: as given, else from the model's own Hub repo when it has them, else
    from the official repo that pairs with the model's text width."""
    given = {"text_encoder": args.text_encoder, "vae": args.vae}
    if all(given.values()):
        return args.text_encoder, args.vae
    ref = parse(args.model)
    source = None
    local = Path(args.model).expanduser()
    if local.is_dir() and all((local / c).is_dir() for c, value in given.items() if value is None):
        source = args.model  # a local diffusers repository with its own text encoder and VAE
    elif ref is not None and not ref.filename:
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


def device_for(name: str | None) -> torch.device:
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


def check_output(output: Path) -> Path:
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


def release(device: torch.device) -> None:
    """Give freed memory back: Python's garbage, and the CUDA allocator's cache."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def check_memory(
    device: torch.device,
    dit: int,
    text_encoder: int,
    activations: int,
    what: str,
    processes: int = 1,
    parallel: str | None = None,
    in_ram: int | None = None,
) -> None:
    """The DiT waits in RAM while the text encoder runs on ``device``; then the DiT samples there. Under
    ``--parallel`` each of the run's ``processes`` on this host holds its own ``dit`` bytes (a copy, or its
    slices) in RAM at once; each has its own GPU, and rank 0 alone runs the text encoder. ``in_ram``: the
    DiT's bytes in RAM when more than ``dit`` goes there (streaming keeps the whole model in RAM while only
    its resident part and the blocks in flight are on the device)."""
    ram = dit if in_ram is None else in_ram
    advice = "lower --width/--height, --batch-size or the references, or use --dtype bfloat16"
    held, ram_advice = "the diffusion model", advice
    if processes > 1:
        held = (
            f"the diffusion model of all {processes} processes on this host ({processes} x {dit / GB:.1f} GB)"
        )
        tensor = (
            "" if parallel == "tensor" else ", use --parallel tensor (each process holds about 1/N of it)"
        )
        ram_advice = (
            f"start fewer processes on this host (--nproc-per-node){tensor}, or use --dtype bfloat16 or a "
            "quantised model file (fp8, int8)"
        )
    if device.type == "cpu":
        required = processes * ram + max(text_encoder, processes * activations)
        where = f"on the CPU with {held}" if processes > 1 else "on the CPU"
        check_fits(required, device, f"sampling {what} {where}", ram_advice)
        return
    check_fits(max(text_encoder, dit + activations), device, f"sampling {what}", advice)
    if in_ram is not None and processes == 1:
        held = "the streamed diffusion model"
        ram_advice = "use a smaller model file (--dtype bfloat16, fp8 or a GGUF quantisation)"
    check_fits(processes * ram, torch.device("cpu"), f"holding {held} in RAM while the text runs", ram_advice)


def image_size(image) -> tuple[int, int]:
    return image.size if isinstance(image, Image.Image) else (image.shape[1], image.shape[0])


def open_image(path: str):
    """An image as a viewer shows it: EXIF orientation applied, alpha dropped (as ComfyUI's LoadImage does),
    16-bit images scaled to 0..1 rather than clipped, float images taken as 0..1. 8-bit images stay PIL
    images; others come back as float tensors [H, W, 3]. Images over PIL's decompression-bomb limit are
    refused."""
    try:
        with Image.open(path) as image:
            image = ImageOps.exif_transpose(image)
            if image.mode in HIGH_BIT_DEPTH:
                gray = _high_bit_depth(image)
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


def save_images(outputs: list[torch.Tensor], output: Path) -> list[Path]:
    """One [B, 3, H, W] tensor in -1..1 per prompt -> image files (rounded to 8 bit): ``OUT.png`` for one
    image, ``OUT_j.png`` for a batch, ``OUT-k.png`` (``OUT-k_j.png``) for prompt k of several. Each is written
    under a temporary name and renamed once every file is complete, so an interrupted or failed save leaves
    no partial file."""
    fmt = IMAGE_FORMATS[output.suffix.lower()]
    named = []
    for k, pixels in enumerate(outputs):
        stem = output.stem if len(outputs) == 1 else f"{output.stem}-{k + 1}"
        arrays = ((pixels.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
        for j, array in enumerate(arrays):
            name = f"{stem}{output.suffix}" if len(arrays) == 1 else f"{stem}_{j + 1}{output.suffix}"
            named.append((array, output.with_name(name)))
    temps = [path.with_name(f".{path.name}.{os.getpid()}.partial") for _, path in named]
    try:
        for (array, _), temp in zip(named, temps):
            Image.fromarray(array).save(temp, format=fmt)
        for (_, path), temp in zip(named, temps):
            os.replace(temp, path)
    except OSError as e:
        raise Flux2Error(
            f"could not write {output} ({e.strerror or e}): check the disk space and the path"
        ) from None
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)
    return [path for _, path in named]


def open_mask(path: str, size: tuple[int, int] | None, white: str = "repaint") -> torch.Tensor:
    """A mask file (white = ``white``; grey, RGB or with alpha: its luminance) -> [H, W] in 0..1 for an image
    of ``size`` (width, height; None: any size, scaled where it is used)."""
    try:
        with Image.open(path) as image:
            image = ImageOps.exif_transpose(image)
            if image.mode in HIGH_BIT_DEPTH:  # scaled like open_image, not clipped at 255
                values = _high_bit_depth(image)
            else:
                values = np.asarray(image.convert("L"), dtype=np.float32) / 255.0
    except Image.DecompressionBombError as e:
        raise Flux2Error(f"the mask {path} is refused as a possible decompression bomb ({e})") from None
    except (OSError, ValueError) as e:
        raise Flux2Error(f"could not read the mask {path} ({e}): use a PNG (white = {white})") from None
    if size is not None and values.shape[::-1] != tuple(size):
        height, width = values.shape
        raise Flux2Error(
            f"the mask {path} is {width}x{height} but the image is {size[0]}x{size[1]}: use a "
            "mask of the image's size"
        )
    return torch.from_numpy(values).clamp(0, 1)


def _high_bit_depth(image: Image.Image) -> np.ndarray:
    """A 16-bit or 32-bit integer image scaled from 0..65535, a float one taken as 0..1: [H, W] float32."""
    return np.asarray(image, dtype=np.float32) / (1.0 if image.mode == "F" else 65535.0)


def as_tensor(image) -> torch.Tensor:
    """A PIL image or a float tensor [H, W, 3] -> float tensor [H, W, 3] in 0..1."""
    if isinstance(image, Image.Image):
        return torch.from_numpy(np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0)
    return image.float()


MAX_LORA_STRENGTH = 10.0


def read_loras(values: list[str]) -> list[tuple[object, float]]:
    """``--lora FILE[:STRENGTH]`` values -> [(LoraFile, strength)], read and checked before any model loads.

    The strength follows the last ``:`` when that part is a number (``C:\\loras\\x.safetensors`` is a
    path).
    """
    loras = []
    for value in values:
        path, strength = value, 1.0
        head, sep, tail = value.rpartition(":")
        if sep and head:
            try:
                strength = float(tail)
                path = head
            except ValueError:
                pass
        if not -MAX_LORA_STRENGTH <= strength <= MAX_LORA_STRENGTH:  # also refuses nan
            raise Flux2Error(
                f"--lora {value}: strength {strength:g} is out of range: give -{MAX_LORA_STRENGTH:g} to "
                f"{MAX_LORA_STRENGTH:g} (1 = as trained), e.g. --lora {path}:0.8"
            )
        if not Path(path).is_file():
            raise Flux2Error(f"--lora {value}: {path} is not a file: give the path of a LoRA .safetensors")
        loras.append((read_lora(path), strength))
    return loras


def sigma_list(text: str | None) -> tuple[float, ...] | None:
    """``--sigmas "1.0,0.6509,...,0"`` -> the schedule as given (``flow.given_sigmas``), None without it."""
    if text is None:
        return None
    values = []
    for item in text.replace(",", " ").split():
        try:
            values.append(float(item))
        except ValueError:
            raise Flux2Error(
                f"--sigmas {text!r}: {item!r} is not a number; give the sigmas separated by commas, e.g. "
                '--sigmas "1.0, 0.75, 0.5, 0.25, 0"'
            ) from None
    return given_sigmas(values, "--sigmas")


def read_regions(values: list[list[str]]) -> list[tuple[str, torch.Tensor]]:
    """``--region PROMPT MASK`` values -> [(prompt, mask [H, W] in 0..1)], the masks read now."""
    return [(text, open_mask(path, None, "the region")) for text, path in values]


def check_regions(regions: list[tuple[str, torch.Tensor]], grid: tuple[int, int], global_prompt: bool):
    """Before any weight is read: the regions' masks at the output's latent ``grid`` (rows, cols). One that
    covers no token is left out when the prompts run (``regional_plan`` says so); with none left and no
    ``--prompt`` there is nothing to run."""
    size = f"{grid[1] * FLUX2.size_multiple}x{grid[0] * FLUX2.size_multiple}"
    empty = [k for k, (_, mask) in enumerate(regions) if not bool(latent_region_mask(mask, grid).any())]
    if len(empty) == len(regions) and not global_prompt:
        raise Flux2Error(
            f"every --region mask is empty at {size} (a 16 x 16 token is in a region when at least half of "
            "it is white): paint the regions white in the masks, or give a global --prompt"
        )


def reference_strengths(values: list[float], count: int) -> tuple:
    """``--reference-strength`` values -> a ReferenceStrength per reference (empty: every one plain): one
    per ``--reference`` in order, or one for all."""
    if not values:
        return ()
    if count == 0:
        raise Flux2Error("--reference-strength needs reference images: add them with --reference")
    if len(values) not in (1, count):
        raise Flux2Error(
            f"{len(values)} --reference-strength values for {count} --reference images: give one per "
            "reference, in the same order, or one for all"
        )
    try:
        strengths = tuple(ReferenceStrength(v) for v in values)
    except Flux2Error as e:
        raise Flux2Error(f"--reference-strength: {e}") from None
    return strengths * count if len(strengths) == 1 else strengths
