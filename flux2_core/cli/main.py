"""Command line: ``python -m flux2_core generate ...``: text-to-image, reference editing, img2img, inpaint and
outpaint without ComfyUI.

Everything is checked before a model is loaded (``cli_inputs``). The text encoder runs first, once for every
prompt, and is released before sampling, so the DiT and the text encoder never share the device. With several
``--prompt`` each gives its own output from the same seed (``OUT-1.png``, ``OUT-2.png``, ...), and the 9B-KV
model's reference K/V are computed once for all of them. With a batch, ``OUT.png`` becomes ``OUT_1.png``, ...
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from ..configs import FLUX2, VARIANTS
from ..errors import Flux2Error
from ..sampling import sampling_memory
from ..weights.hub import DEFAULT_MODEL
from ..weights.loading import weight_bytes
from . import inputs
from .edit import IMG2IMG_STRENGTH, composite_pixels, encode_edit, prepare_edit

log = logging.getLogger("flux2_core")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_OUTPUT = "flux2-klein.png"
VAE_TILE_OVERLAP = 64  # pixels shared by neighbouring VAE tiles, blended (a quarter of smaller tiles)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m flux2_core",
        description="FLUX.2 [klein], FLUX.2 [dev] and FLUX.1 Fill [dev] image generation",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="text-to-image, editing, img2img, inpaint and outpaint")
    where = "a .safetensors file, a folder, or a Hugging Face id (org/repo[@revision][/file])"
    gen.add_argument("--model", default=DEFAULT_MODEL, help=f"DiT: {where}; default {DEFAULT_MODEL}")
    gen.add_argument(
        "--text-encoder",
        action="append",
        default=None,
        help=f"text encoder: {where}; default: the model's repo if it has one, else the official repo that "
        "pairs with the model (klein 4B: Qwen3-4B, klein 9B: Qwen3-8B, dev: Mistral Small 3.2). FLUX.1 Fill "
        "[dev] takes two, in any order: T5-XXL and CLIP-L",
    )
    gen.add_argument(
        "--tokenizer", action="append", default=None, metavar="DIR",
        help="a tokenizer folder (HF layout) for the text encoder; FLUX.1 Fill: a T5 and a CLIP one, in any "
        "order. Default: the tokenizer folders beside the text encoder(s), else the built-in one (FLUX.2)",
    )  # fmt: skip
    gen.add_argument(
        "--vae", default=None, help=f"VAE: {where} (FLUX.2: flux2-vae, FLUX.1 Fill: ae); default: as for "
        "--text-encoder (FLUX.2)",
    )  # fmt: skip
    gen.add_argument("--prompt", action="append", required=True, help="repeat for one output per prompt")
    gen.add_argument(
        "--negative", default=None, help="negative prompt for base models (default: empty prompt)"
    )
    gen.add_argument("--reference", action="append", default=[], help="reference image; repeat for more")
    gen.add_argument(
        "--reference-max-pixels", type=int, default=None, help="pixel cap per reference (1024^2)"
    )
    gen.add_argument("--image", default=None, help="image to start from (img2img), inpaint or outpaint")
    gen.add_argument("--mask", default=None, help="inpaint mask for --image: white = repaint")
    gen.add_argument(
        "--strength",
        type=float,
        default=None,
        help=f"how much of the schedule runs from --image: 1 repaints fully (default with --mask and "
        f"--outpaint), {IMG2IMG_STRENGTH} without a mask",
    )
    gen.add_argument("--outpaint", default=None, help="LEFT,TOP,RIGHT,BOTTOM pixels to add (multiples of 16)")
    gen.add_argument("--mask-feather", type=int, default=0, help="pixels of blend inside the mask's edge")
    gen.add_argument("--no-composite", action="store_true", help="save the raw decoded inpaint, no composite")
    gen.add_argument("--width", type=int, default=None, help="default: first reference's size, else 1024")
    gen.add_argument("--height", type=int, default=None)
    gen.add_argument("--steps", type=int, default=None, help="default: 4 distilled / kv, 50 base, dev, Fill")
    gen.add_argument(
        "--guidance",
        type=float,
        default=None,
        help="default: 1 distilled / kv, 4 base and dev, 30 FLUX.1 Fill",
    )
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--batch-size", type=int, default=1)
    gen.add_argument(
        "--variant", default="auto", choices=["auto", *VARIANTS], help="default: read from the file"
    )
    gen.add_argument(
        "--dtype", default=None, choices=list(DTYPES), help="default: bfloat16 on GPU, float32 on CPU"
    )
    gen.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    gen.add_argument(
        "--offload",
        default="none",
        choices=["none", "stream"],
        help="stream: keep the DiT's blocks in CPU memory and copy each to the GPU just before it runs",
    )
    gen.add_argument(
        "--resident-mb", type=int, default=0, help="with --offload stream: MB of blocks kept on the GPU"
    )
    gen.add_argument(
        "--vae-tile",
        type=int,
        default=0,
        metavar="N",
        help="VAE tile size in pixels (a multiple of 16, at least 128); 0: tile only what does not fit",
    )
    gen.add_argument(
        "--compile", action="store_true", help="torch.compile the DiT's blocks (slow first step)"
    )
    gen.add_argument(
        "--parallel", default=None, choices=["tensor", "sequence"],
        help="under torchrun --nproc-per-node N: run the DiT across the N processes (one per GPU; --device "
        "cpu uses gloo): tensor splits the weights (about 1/N each), sequence the tokens; rank 0 writes",
    )  # fmt: skip
    gen.add_argument(
        "--lora",
        action="append",
        default=[],
        metavar="FILE[:STRENGTH]",
        help="a LoRA .safetensors (any common trainer's layout), strength default 1; repeat for more",
    )
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
    from .fill import is_flux1_model
    from .parallel import ranks_for

    fill = is_flux1_model(args.model)  # FLUX.1 Fill [dev]: its own run (flux1/cli_fill.py)
    ranks = ranks_for(args, fill)
    try:
        return _generate(args, fill, ranks)
    finally:
        ranks.close()


def _generate(args: argparse.Namespace, fill: bool, ranks) -> list[Path]:
    from ..configs import describe
    from ..devices.streaming import BLOCKS_IN_FLIGHT, disable_streaming, enable_streaming
    from ..dit.files import DIT_SPEC, transformer_variant
    from ..dit.transformer import compile_blocks
    from ..limits import MAX_FILL_GUIDANCE, MAX_GUIDANCE, check_request, check_seed
    from ..lora import prepare_lora
    from ..references import MAX_REFERENCE_PIXELS, encode_references, processed_size
    from ..sampling import SampleSettings, check_conditioning, check_text_width, output_size, settings_numbers
    from ..text.encoder import load_text_encoder, text_encoder_spec_for
    from ..vae.autoencoder import load_vae
    from ..vae.tiling import check_tiling
    from .fill import check_fill_args, generate_fill

    # 1. Everything that can be checked without reading a weight, before any model is loaded.
    if fill:
        check_fill_args(args)
    elif args.text_encoder and len(args.text_encoder) > 1:
        raise Flux2Error(
            "FLUX.2 models take one --text-encoder (Qwen3 or Mistral); two (T5-XXL, CLIP-L) are FLUX.1 Fill's"
        )
    elif args.tokenizer and (len(args.tokenizer) > 1 or not Path(args.tokenizer[0]).is_dir()):
        raise Flux2Error(
            f"--tokenizer {' '.join(args.tokenizer)}: a FLUX.2 run takes one tokenizer folder (HF layout) "
            "for its text encoder; two (T5, CLIP) are for FLUX.1 Fill"
        )
    else:
        args = argparse.Namespace(**{**vars(args), "text_encoder": (args.text_encoder or [None])[0]})
    device = ranks.device
    dtype = DTYPES[args.dtype] if args.dtype else (torch.float32 if device.type == "cpu" else torch.bfloat16)
    output = inputs.check_output(Path(args.output))
    check_seed(args.seed)
    if args.reference_max_pixels is not None and args.reference_max_pixels < inputs.MIN_REFERENCE_PIXELS:
        raise Flux2Error(
            f"--reference-max-pixels {args.reference_max_pixels} is too small: give at least "
            f"{inputs.MIN_REFERENCE_PIXELS} (64 x 64), e.g. {MAX_REFERENCE_PIXELS} for 1024 x 1024"
        )
    for name in ("width", "height"):
        if getattr(args, name) is not None and getattr(args, name) <= 0:  # 0 is no "default" here
            raise Flux2Error(
                f"--{name} {getattr(args, name)} is not a size: give a multiple of 16, or leave it out"
            )
    # the numbers first: nothing is resolved or downloaded for a request that cannot run
    check_request(
        args.width or 1024,
        args.height or 1024,
        1 if args.steps is None else args.steps,
        1.0 if args.guidance is None else args.guidance,
        args.seed,
        args.batch_size,
        MAX_FILL_GUIDANCE if fill else MAX_GUIDANCE,
    )
    max_pixels = args.reference_max_pixels or MAX_REFERENCE_PIXELS
    images = [inputs.open_image(p) for p in args.reference]
    sizes = [processed_size(*inputs.image_size(image), max_pixels) for image in images]
    edit = prepare_edit(args, max_pixels)
    loras = inputs.read_loras(args.lora)
    overlap = VAE_TILE_OVERLAP if args.vae_tile <= 0 else min(VAE_TILE_OVERLAP, args.vae_tile // 64 * 16)
    check_tiling(args.vae_tile, overlap, FLUX2.size_multiple)
    tiles = {"tile_size": args.vae_tile, "tile_overlap": overlap}
    if fill:
        return generate_fill(args, edit, device, dtype, output, tiles, composite_pixels)
    if args.resident_mb < 0:
        raise Flux2Error(f"--resident-mb {args.resident_mb} is negative: give 0 (stream every block) or more")
    width, height = output_size(args.width, args.height, edit.size if edit else (sizes[0] if sizes else None))
    config, dit_bytes, checkpoint = weight_bytes(DIT_SPEC, args.model, dtype)
    variant = transformer_variant(checkpoint, config, args.variant)
    variant.check_references(len(images) + (1 if edit is not None and edit.mask is not None else 0))
    text_encoder, vae_path = inputs.companions(args, config.context_in_dim)
    steps = variant.default_steps if args.steps is None else args.steps
    guidance = variant.default_guidance if args.guidance is None else args.guidance
    settings = SampleSettings(width, height, steps, guidance, args.seed, args.batch_size)
    check_request(*settings_numbers(settings))
    te_spec = text_encoder_spec_for(text_encoder)
    te_shape, te_bytes, _ = weight_bytes(te_spec, text_encoder, dtype)
    check_text_width(
        config, describe(config), te_shape.output_dim, f"text encoder ({te_spec.describe(te_shape)})"
    )
    dit_bytes = ranks.dit_bytes(args.model, dtype, dit_bytes)
    source_tokens = (
        width * height if edit is not None and edit.mask is not None else 0
    )  # inpaint: reference 1
    num_ref_tokens = (sum(w * h for w, h in sizes) + source_tokens) // FLUX2.size_multiple**2
    activations = sampling_memory(config, variant, dtype, settings, num_ref_tokens)
    what = f"{width}x{height} with {len(images)} reference(s) ({num_ref_tokens} reference tokens)"
    if args.offload == "stream":  # what stays on the device, plus the blocks in flight
        blocks = config.depth + config.depth_single_blocks
        in_flight = BLOCKS_IN_FLIGHT * dit_bytes // max(blocks, 1)
        dit_bytes = min(dit_bytes, args.resident_mb * 2**20 + in_flight)
    inputs.check_memory(device, dit_bytes, te_bytes, activations, what)
    del checkpoint

    # 2. Text first (every prompt at once, on the main process), then the encoder leaves the device.
    keep = device.type != "mps"  # MPS cannot hold float8: quantised files are dequantised at load there
    model = ranks.load_transformer(args.model, args.variant, dtype, keep)
    tokenizer = args.tokenizer[0] if args.tokenizer else None
    encoder = None
    if ranks.is_main:
        encoder = load_text_encoder(
            text_encoder, dtype, device, tokenizer_path=tokenizer, keep_quantized=keep
        )
    for lora_file, strength in loras:  # each LoRA's report is logged as it is matched
        lora = prepare_lora(lora_file, model.transformer, encoder.model if encoder else None, strength)
        model, encoder = model.with_lora(lora), encoder.with_lora(lora) if encoder else None
    use_cfg = model.variant.uses_cfg and guidance > 1.0
    texts = list(args.prompt) + ([args.negative or ""] if use_cfg else [])
    conditioning = None
    if encoder is not None:
        check_conditioning(model, torch.empty(1, 1, encoder.output_dim), f"text encoder ({encoder.name})")
        with torch.inference_mode():
            conditioning = encoder.encode(texts).cpu()
    conditioning = ranks.share_text(conditioning)
    del encoder
    inputs.release(device)

    # 3. References and the image to edit, sampling once per prompt, decoding, compositing.
    vae, references, start, mask = None, None, None, None
    if ranks.is_main:
        vae = load_vae(vae_path, dtype=torch.float32, device=device)
        references = encode_references(vae, images, max_pixels, **tiles) if images else None
        start, mask, references = encode_edit(vae, edit, references, (height // 16, width // 16), tiles)
    references, start, mask = ranks.share_inputs(references, start, mask)
    if args.offload == "stream":
        enable_streaming(model.transformer, device, resident_bytes=args.resident_mb * 2**20)
    else:
        model.transformer.to(device)
    if args.compile:
        compile_blocks(model.transformer)
    log.info(
        "%s (%s): %dx%d, %d steps, guidance %g, seed %d%s",
        model.name,
        model.variant.name,
        width,
        height,
        steps,
        guidance,
        args.seed,
        f", strength {edit.strength:g}" if edit else "",
    )
    negative = conditioning[len(args.prompt) :] if use_cfg else None
    kv_cache = None
    if model.variant.kv_cache and references is not None and len(references):
        from ..sampling import encode_reference_kv

        kv_cache = encode_reference_kv(model, references)  # once, for every prompt
    results = []
    for k in range(len(args.prompt)):
        with tqdm(total=steps, unit="step", disable=None if ranks.is_main else True) as bar:
            latents = _sample(model, conditioning[k : k + 1], settings, negative, references, bar, start,
                              edit, mask, kv_cache)  # fmt: skip
        results.append(latents)
    if args.offload == "stream":
        disable_streaming(model.transformer)  # back on the CPU, as loaded
    model.transformer.to("cpu")
    inputs.release(device)
    if not ranks.is_main:
        return []  # the main process decodes and writes
    outputs = []
    for latents in results:
        with torch.inference_mode():
            pixels = torch.cat([vae.decode(item.to(device), **tiles).cpu() for item in latents.split(1)])
        if edit is not None and edit.stitch is not None and not args.no_composite:
            pixels = composite_pixels(pixels, edit.stitch, args.mask_feather)
        outputs.append(pixels)
    return inputs.save_images(outputs, output)


def _sample(model, positive, settings, negative, references, bar, start, edit, mask, kv_cache):
    from ..sampling import sample

    return sample(
        model,
        positive,
        settings,
        negative=negative,
        references=references,
        callback=lambda done, total, x0: bar.update(1),
        start=start,
        strength=edit.strength if edit is not None else 1.0,
        mask=mask,
        kv_cache=kv_cache,
    )


if __name__ == "__main__":
    sys.exit(main())
