"""The command line's FLUX.1 Fill [dev] run: ``generate --model FILL --text-encoder T5 --text-encoder CLIP
--vae AE --image SRC --mask MASK --prompt TEXT`` (or ``--outpaint L,T,R,B`` instead of the mask).

``main.generate`` sends a run here when the DiT's tensors are FLUX.1's; the two text encoders are told apart
by their own tensors, in any order. As for klein, everything that can be checked from file headers is checked
before a weight is read: which file is which, the pairing of the DiT with the encoders and the VAE, and the
memory. The text encoders run first and leave the device before the DiT samples.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import torch
from tqdm import tqdm

from ..dit.transformer import compile_blocks
from ..errors import Flux2Error
from ..flux1.config import DEFAULT_GUIDANCE, DEFAULT_STEPS
from ..flux1.dit_files import FILL_SPEC, is_flux1_dit, load_fill_transformer
from ..flux1.encoders import load_fill_text_encoder
from ..flux1.fill import fill_inputs
from ..flux1.sampling import FillSettings, fill_activation_bytes, sample_fill
from ..flux1.text import CLIP_FILE, CLIP_SPEC, T5_FILE, T5_SPEC, describe_clip, describe_t5, text_encoder_kind
from ..flux1.transformer import Flux1FillModel
from ..flux1.vae import FILE_HINT, FLUX1_VAE_SPEC, load_flux1_vae
from ..limits import MAX_FILL_GUIDANCE, check_request
from ..weights.checkpoint import open_checkpoint
from ..weights.hub import parse
from ..weights.keymaps import DIT_PREFIXES, strip_prefix
from ..weights.loading import weight_bytes
from . import inputs, progress
from .edit import composite_pixels

log = logging.getLogger("flux2_core")


def is_flux1_model(path: str) -> bool:
    """Whether ``path`` holds a FLUX.1 DiT: from its key names alone for a local file or folder, from the
    repository's name (``black-forest-labs/FLUX.1-Fill-dev``) for a Hub id."""
    local = Path(path).expanduser()
    if not local.exists():  # a Hub id: told by the repository's name, before anything is downloaded
        ref = parse(path)
        return ref is not None and "flux.1" in ref.repo_id.lower()
    return is_flux1_dit(strip_prefix(open_checkpoint(local, "transformer").tensors, DIT_PREFIXES))


def check_fill_args(args: argparse.Namespace) -> None:
    """The options a Fill run cannot use, refused by name before anything is loaded."""
    if args.image is None or (args.mask is None and args.outpaint is None):
        raise Flux2Error(
            "FLUX.1 Fill [dev] paints into an image: give --image with --mask (white = repaint) or --outpaint"
        )
    refused = {
        "--reference": bool(args.reference),
        "--reference-strength": bool(args.reference_strength),
        "--region": bool(args.region),
        "--negative": args.negative is not None,
        "--lora": bool(args.lora),
        "--offload stream": args.offload != "none",
        "--variant": args.variant != "auto",
    }
    given = [name for name, on in refused.items() if on]
    if given:
        raise Flux2Error(
            f"{', '.join(given)} do(es) not apply to FLUX.1 Fill [dev] (one image, one prompt, embedded "
            "guidance): leave it out"
        )
    if args.dtype == "float16":
        raise Flux2Error(
            "FLUX.1 Fill [dev] overflows in float16 (black images): use --dtype bfloat16 or float32"
        )


def fill_text_encoders(values: list[str] | None) -> tuple[str, str]:
    """(T5 path, CLIP path) from the two --text-encoder values, in either order."""
    if not values or len(values) != 2:
        raise Flux2Error(
            f"FLUX.1 Fill [dev] needs two text encoders: --text-encoder {T5_FILE} --text-encoder {CLIP_FILE} "
            f"({len(values or [])} given)"
        )
    kinds = {text_encoder_kind(value): value for value in values}
    if set(kinds) != {"t5", "clip"}:
        kind = next(iter(kinds)).upper()
        raise Flux2Error(
            f"both --text-encoder files are {kind} encoders: give one {T5_FILE} and one {CLIP_FILE}"
        )
    return kinds["t5"], kinds["clip"]


def generate_fill(request) -> list[Path]:
    """Run Fill for every ``--prompt`` of a checked ``run.Request``; returns the written files."""
    args, edit, device, dtype, tiles = (
        request.args,
        request.edit,
        request.device,
        request.dtype,
        request.tiles,
    )
    steps = DEFAULT_STEPS if args.steps is None else args.steps
    guidance = DEFAULT_GUIDANCE if args.guidance is None else args.guidance
    width, height = edit.size
    check_request(width, height, steps, guidance, args.seed, args.batch_size, MAX_FILL_GUIDANCE)
    t5_path, clip_path = fill_text_encoders(args.text_encoder)
    if args.vae is None:
        raise Flux2Error(f"give the FLUX.1 VAE with --vae: {FILE_HINT}")
    # 1. Which file is which, and do they pair: from the headers alone.
    config, dit_bytes, _ = weight_bytes(FILL_SPEC, args.model, dtype)
    t5_shape, t5_bytes, _ = weight_bytes(T5_SPEC, t5_path, dtype)
    clip_shape, clip_bytes, _ = weight_bytes(CLIP_SPEC, clip_path, dtype)
    weight_bytes(FLUX1_VAE_SPEC, args.vae, torch.float32)  # the FLUX.2 VAE is refused here, by name
    for got, need, what, name in (
        (t5_shape.d_model, config.context_in_dim, describe_t5(t5_shape), T5_FILE),
        (clip_shape.hidden_size, config.vec_in_dim, describe_clip(clip_shape), CLIP_FILE),
    ):
        if got != need:
            raise Flux2Error(
                f"the FLUX.1 Fill DiT reads {need}-wide text states, but {what} gives {got}: use {name}"
            )
    activations = fill_activation_bytes(config, dtype, width, height, args.batch_size)
    inputs.check_memory(device, dit_bytes, t5_bytes + clip_bytes, activations, f"{width}x{height}")

    # 2. Text first, then the encoders leave the device.
    keep = device.type != "mps"
    encoder = load_fill_text_encoder(t5_path, clip_path, dtype, device, args.tokenizer, keep)
    with torch.inference_mode():
        conditioning = encoder.encode(list(args.prompt))
    del encoder
    inputs.release(device)

    # 3. The image's fill conditioning, sampling once per prompt, decoding, compositing.
    vae = load_flux1_vae(args.vae, torch.float32, device)
    pixels = edit.pixels.permute(2, 0, 1)[None].float() * 2 - 1
    fill = fill_inputs(vae, pixels, edit.mask, with_source=edit.strength < 1.0, **tiles)
    model: Flux1FillModel = load_fill_transformer(args.model, dtype, "cpu", keep, args.quant_compute)
    model.transformer.to(device)
    if args.compile:
        compile_blocks(model.transformer)
    settings = FillSettings(args.seed, steps, guidance, args.batch_size, edit.strength)
    results = []
    for k in range(len(args.prompt)):
        positive = type(conditioning)(conditioning.t5[k : k + 1], conditioning.pooled[k : k + 1])
        with tqdm(total=steps, unit="step", disable=None) as bar:
            report = lambda *_: bar.update(1)  # noqa: E731
            results.append(sample_fill(model, positive, fill, settings, report, step_cache=args.step_cache))
    model.transformer.to("cpu")
    inputs.release(device)
    outputs = []
    for latents in results:
        decoded = progress.decode_each(vae, latents, device, tiles)
        outputs.append(
            decoded if args.no_composite else composite_pixels(decoded, edit.stitch, args.mask_feather)
        )
    return inputs.save_images(outputs, request.output)
