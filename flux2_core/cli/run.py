"""A FLUX.2 run of the command line, in the order its data flows, one phase a function:

1. ``check_arguments``: everything the arguments alone can tell, before a file is resolved or downloaded;
2. ``plan``: the model files' headers (family, variant, text width, sizes), the pairing and the memory check,
   before any weight is read;
3. ``encode_prompts``: the DiT (on the CPU) and the text encoder, the LoRAs, every prompt encoded at once;
   the text encoder leaves the device before sampling;
4. ``encode_images``: the VAE, the references and the image to edit;
5. ``sample_prompts``: the DiT on its device (resident, streamed or compiled), one run per prompt;
6. ``decode_and_save``: the decode, the inpaint composite, the files.

FLUX.1 Fill [dev] shares phase 1 and runs its own rest (``fill``). With ``--parallel`` every process runs
the same phases; ``ranks`` is where they differ (``parallel``).
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm

from ..configs import FLUX2, Flux2Config, Variant, describe
from ..devices.streaming import disable_streaming, enable_streaming, streamed_device_bytes
from ..dit.extrapolation import position_extrapolation
from ..dit.files import DIT_SPEC, transformer_variant
from ..dit.step_cache import check_threshold
from ..dit.transformer import Flux2Model, compile_blocks
from ..errors import Flux2Error
from ..limits import MAX_FILL_GUIDANCE, MAX_GUIDANCE, check_request, check_seed
from ..lora import prepare_lora
from ..references import MAX_REFERENCE_PIXELS, encode_references, processed_size
from ..sampling import (
    SampleRequest,
    SampleSettings,
    check_conditioning,
    check_text_width,
    encode_reference_kv,
    output_size,
    sample,
    sampling_memory,
)
from ..steering.control_image import control_context
from ..steering.regions import Region, RegionalPrompt, regional_cost
from ..text.encoder import load_text_encoder, text_encoder_spec_for
from ..vae.autoencoder import load_vae
from ..vae.tiling import check_tiling
from ..weights.loading import weight_bytes
from . import control as control_flags
from . import inputs, progress
from . import tiled as tiled_flags
from .edit import Edit, composite_pixels, encode_edit, prepare_edit
from .fill import check_fill_args
from .parallel import Ranks

log = logging.getLogger("flux2_core")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
VAE_TILE_OVERLAP = 64  # pixels shared by neighbouring VAE tiles, blended (a quarter of smaller tiles)


@dataclass
class Request:
    """What the arguments ask for, checked (phase 1)."""

    args: argparse.Namespace  # ``text_encoder`` is one path (or None) for FLUX.2, the list for Fill
    device: torch.device
    dtype: torch.dtype
    output: Path
    images: list  # the reference images, opened
    sizes: list[tuple[int, int]]  # their sizes once processed
    max_pixels: int  # the pixel cap per reference
    edit: Edit | None  # --image with --mask / --outpaint / --strength
    loras: list[tuple[object, float]]  # (LoraFile, strength)
    tiles: dict  # the VAE's tile_size and tile_overlap
    strengths: tuple = ()  # ReferenceStrength of each reference image (empty: every one plain)
    regions: list = field(default_factory=list)  # (prompt, mask [H, W]) of each --region
    control: tuple | None = None  # --controlnet: cli.control.ControlInputs (map, mask, picture)
    context: torch.Tensor | None = None  # its control context at the output size, once the VAE has run
    extrapolation: object = None  # --dype: dit.extrapolation.PositionExtrapolation
    tiled: object = None  # --tile-size: cli.tiled.Canvas (``sizes`` then holds its tile's, for the plan)


@dataclass
class Plan:
    """The run as the files' headers describe it (phase 2)."""

    config: Flux2Config
    variant: Variant
    settings: SampleSettings
    text_encoder: str
    vae: str

    @property
    def grid(self) -> tuple[int, int]:
        return self.settings.height // FLUX2.size_multiple, self.settings.width // FLUX2.size_multiple


def check_arguments(args: argparse.Namespace, fill: bool, ranks: Ranks) -> Request:
    """Phase 1: every check the arguments allow, before any model file is resolved or read."""
    if fill:
        check_fill_args(args)
    else:
        args = _one_text_encoder(args)
    dtype = (
        DTYPES[args.dtype]
        if args.dtype
        else (torch.float32 if ranks.device.type == "cpu" else torch.bfloat16)
    )
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
    if args.sigmas is not None and (fill or args.steps is not None):
        raise Flux2Error(
            "--sigmas is for FLUX.2 models: FLUX.1 Fill [dev] runs its own schedule"
            if fill
            else f"--sigmas sets the steps (its values less one): leave --steps {args.steps} out"
        )
    inputs.sigma_list(args.sigmas)  # refused by name before anything is read
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
    tiled = tiled_flags.check(args, fill)
    args = tiled_flags.planned_args(args, tiled)  # with tiles, the plan checks one tile's run (cli.tiled)
    max_pixels = args.reference_max_pixels or MAX_REFERENCE_PIXELS
    strengths = inputs.reference_strengths(args.reference_strength, len(args.reference))
    if not args.prompt and not args.region:
        raise Flux2Error("give a prompt: --prompt TEXT (or --region PROMPT MASK for regional prompts)")
    regions = inputs.read_regions(args.region)
    images = [inputs.open_image(p) for p in args.reference]
    sizes = [processed_size(*inputs.image_size(image), max_pixels) for image in images]
    sizes += tiled_flags.refs(tiled)
    control = control_flags.read_inputs(args, ranks)
    # the control's inpaint mode alone: --image is the picture the control net inpaints, not a start
    only_control = args.control_mask and args.mask is None and args.outpaint is None and args.strength is None
    edit = prepare_edit(
        argparse.Namespace(**{**vars(args), "image": None}) if only_control else args, max_pixels
    )
    loras = inputs.read_loras(args.lora)
    overlap = VAE_TILE_OVERLAP if args.vae_tile <= 0 else min(VAE_TILE_OVERLAP, args.vae_tile // 64 * 16)
    check_tiling(args.vae_tile, overlap, FLUX2.size_multiple)
    tiles = {"tile_size": args.vae_tile, "tile_overlap": overlap}
    if regions:
        width, height = _sampled_size(args, edit, sizes, control)
        inputs.check_regions(
            regions, (height // FLUX2.size_multiple, width // FLUX2.size_multiple), bool(args.prompt)
        )
    check_threshold(args.step_cache)  # before anything is read
    if fill and args.dype:
        raise Flux2Error("--dype is for FLUX.2 models: FLUX.1 Fill [dev] has no position extrapolation")
    extrapolation = position_extrapolation("dype" if args.dype else "off", args.dype_base)
    if not fill and args.resident_mb < 0:
        raise Flux2Error(f"--resident-mb {args.resident_mb} is negative: give 0 (stream every block) or more")
    return Request(
        args, ranks.device, dtype, output, images, sizes, max_pixels, edit, loras, tiles, strengths, regions,
        control, extrapolation=extrapolation, tiled=tiled,
    )  # fmt: skip


def _sampled_size(args: argparse.Namespace, edit: Edit | None, sizes: list, control) -> tuple[int, int]:
    """(width, height) sampled: the edit's (--width / --height may only repeat the output's), else the given
    sides, the first reference's size or a control map's aspect."""
    if edit is not None:
        return edit.size
    first = sizes[0] if sizes else control_flags.output_size_of(control)
    return output_size(args.width, args.height, first)


def _one_text_encoder(args: argparse.Namespace) -> argparse.Namespace:
    if args.text_encoder and len(args.text_encoder) > 1:
        raise Flux2Error(
            "FLUX.2 models take one --text-encoder (Qwen3 or Mistral); two (T5-XXL, CLIP-L) are FLUX.1 Fill's"
        )
    if args.tokenizer and (len(args.tokenizer) > 1 or not Path(args.tokenizer[0]).is_dir()):
        raise Flux2Error(
            f"--tokenizer {' '.join(args.tokenizer)}: a FLUX.2 run takes one tokenizer folder (HF layout) "
            "for its text encoder; two (T5, CLIP) are for FLUX.1 Fill"
        )
    return argparse.Namespace(**{**vars(args), "text_encoder": (args.text_encoder or [None])[0]})


def plan(request: Request, ranks: Ranks) -> Plan:
    """Phase 2: the files' headers, the pairing of DiT and text encoder, and the memory check."""
    args, edit, dtype = request.args, request.edit, request.dtype
    width, height = _sampled_size(args, edit, request.sizes, request.control)
    config, dit_bytes, checkpoint = weight_bytes(DIT_SPEC, args.model, dtype)
    variant = transformer_variant(checkpoint, config, args.variant)
    inpaint = edit is not None and edit.mask is not None  # the image to inpaint is reference 1
    variant.check_references(len(request.images) + inpaint)
    text_encoder, vae_path = inputs.companions(args, config.context_in_dim)
    steps = variant.default_steps if args.steps is None else args.steps
    guidance = variant.default_guidance if args.guidance is None else args.guidance
    settings = SampleSettings(width, height, steps, guidance, args.seed, args.batch_size)
    if args.sigmas is not None:  # a schedule as given: its length sets the steps
        settings = settings.with_sigmas(inputs.sigma_list(args.sigmas))
    settings.check()
    te_spec = text_encoder_spec_for(text_encoder)
    te_shape, te_bytes, _ = weight_bytes(te_spec, text_encoder, dtype)
    check_text_width(
        config, describe(config), te_shape.output_dim, f"text encoder ({te_spec.describe(te_shape)})"
    )
    dit_bytes = ranks.dit_bytes(args.model, dtype, dit_bytes)
    pixels = sum(w * h for w, h in request.sizes) + (width * height if inpaint else 0)
    num_ref_tokens = pixels // FLUX2.size_multiple**2
    activations = sampling_memory(config, variant, dtype, settings, num_ref_tokens)
    if request.regions:  # every prompt is 512 tokens; what the grouped attention gathers over them
        counts = [FLUX2.max_text_tokens] * ((1 if args.prompt else 0) + len(request.regions))
        text, mask = regional_cost(
            counts, settings.grid, config.hidden_size, dtype.itemsize, settings.batch_size, num_ref_tokens
        )
        activations = sampling_memory(config, variant, dtype, settings, num_ref_tokens, text) + mask
    in_ram = None
    if args.offload == "stream":  # what stays on the device, plus the blocks in flight; all of it in RAM
        blocks = config.depth + config.depth_single_blocks
        in_ram, dit_bytes = dit_bytes, streamed_device_bytes(dit_bytes, blocks, args.resident_mb * 2**20)
    what = f"{width}x{height} with {len(request.images)} reference(s) ({num_ref_tokens} reference tokens)"
    if args.controlnet is not None:  # beside the DiT (streamed with it)
        control_bytes, control_ram, hints = control_flags.memory(
            args, config, settings, num_ref_tokens, dtype
        )
        dit_bytes, activations = dit_bytes + control_bytes, activations + hints
        in_ram = None if in_ram is None else in_ram + control_ram
        what += f", under {Path(args.controlnet).name}"
    inputs.check_memory(
        request.device, dit_bytes, te_bytes, activations, what, ranks.on_this_host, ranks.mode, in_ram
    )
    return Plan(config, variant, settings, text_encoder, vae_path)


def encode_prompts(request: Request, plan: Plan, ranks: Ranks) -> tuple[Flux2Model, torch.Tensor]:
    """Phase 3: the DiT loaded on the CPU, the LoRAs matched, every prompt (and the negative) encoded on the
    main process; the text encoder is released before sampling, so it never shares the device with the DiT."""
    args, device = request.args, request.device
    keep = device.type != "mps"  # MPS cannot hold float8: quantised files are dequantised at load there
    model = ranks.load_transformer(args.model, args.variant, request.dtype, keep, args.quant_compute)
    tokenizer = args.tokenizer[0] if args.tokenizer else None
    encoder = None
    if ranks.is_main:
        encoder = load_text_encoder(
            plan.text_encoder,
            request.dtype,
            device,
            tokenizer_path=tokenizer,
            keep_quantized=keep,
            quant_compute=args.quant_compute,
        )
    for lora_file, strength in request.loras:  # each LoRA's report is logged as it is matched
        lora = prepare_lora(lora_file, model.transformer, encoder.model if encoder else None, strength)
        model, encoder = model.with_lora(lora), encoder.with_lora(lora) if encoder else None
    conditioning = None
    if encoder is not None:
        check_conditioning(model, torch.empty(1, 1, encoder.output_dim), f"text encoder ({encoder.name})")
        with torch.inference_mode():
            conditioning = encoder.encode(_texts(args, model, plan, request.regions)).cpu()
    conditioning = ranks.share_text(conditioning)
    del encoder
    inputs.release(device)
    return model, conditioning


def _uses_cfg(model: Flux2Model, plan: Plan) -> bool:
    return model.variant.uses_cfg and plan.settings.guidance > 1.0


def _texts(args: argparse.Namespace, model: Flux2Model, plan: Plan, regions=()) -> list[str]:
    """Every prompt, every region's, then the negative one when classifier-free guidance runs."""
    texts = list(args.prompt) + [text for text, _ in regions]
    return texts + ([args.negative or ""] if _uses_cfg(model, plan) else [])


def encode_images(request: Request, plan: Plan, ranks: Ranks):
    """Phase 4: (vae, references, start latent, packed mask), encoded on the main process and shared."""
    vae, references, start, mask = None, None, None, None
    if ranks.is_main:
        vae = load_vae(plan.vae, dtype=torch.float32, device=request.device)
        if request.images:
            with progress.vae_bar("VAE encode (references)") as bar:
                references = encode_references(
                    vae, request.images, request.max_pixels, progress=bar, **request.tiles
                )
            if request.strengths:
                references = replace(references, strengths=request.strengths)
        start, mask, references = encode_edit(vae, request.edit, references, plan.grid, request.tiles)
        if request.control is not None:
            s = plan.settings
            with torch.inference_mode():
                request.context = control_context(vae, s.height, s.width, *request.control)
    references, start, mask = ranks.share_inputs(references, start, mask)
    return vae, references, start, mask


def sample_prompts(request, plan, model, conditioning, references, start, mask, ranks) -> list[torch.Tensor]:
    """Phase 5: one sampling run per prompt on the DiT's device; the DiT goes back to the CPU after."""
    args, settings, edit = request.args, plan.settings, request.edit
    if args.offload == "stream":
        enable_streaming(model.transformer, request.device, resident_bytes=args.resident_mb * 2**20)
    else:
        model.transformer.to(request.device)
    if args.compile:
        compile_blocks(model.transformer)
    log.info(
        "%s (%s): %dx%d, %d steps, guidance %g, seed %d%s", model.name, model.variant.name, settings.width,
        settings.height, settings.steps, settings.guidance, args.seed,
        f", strength {edit.strength:g}" if edit else "",
    )  # fmt: skip
    prompts, regions = len(args.prompt), len(request.regions)
    negative = conditioning[prompts + regions :] if _uses_cfg(model, plan) else None
    kv_cache = None
    if model.variant.kv_cache and references is not None and len(references):
        kv_cache = encode_reference_kv(model, references)  # once, for every prompt
    control = None
    if request.control is not None:
        control = control_flags.load(args, request.context, request.device, request.dtype)
    results = []
    for k in range(max(prompts, 1)):  # regions without a global prompt: one run
        positive = conditioning[k : k + 1] if prompts else conditioning[:1, :0]
        regional = None
        if regions:
            masks = [mask for _, mask in request.regions]
            parts = conditioning[prompts : prompts + regions].split(1)
            regional = RegionalPrompt(positive, tuple(Region(c, m) for c, m in zip(parts, masks)))
        with tqdm(total=settings.steps, unit="step", disable=None if ranks.is_main else True) as bar:
            run = SampleRequest(
                model,
                positive,
                settings,
                regions=regional,
                negative=negative,
                references=references,
                callback=lambda done, total, x0: bar.update(1),
                start=start,
                strength=edit.strength if edit is not None else 1.0,
                mask=mask,
                kv_cache=kv_cache,
                step_cache=args.step_cache,
                control=control,
                extrapolation=request.extrapolation,
            )
            results.append(sample(run))
    if args.offload == "stream":
        disable_streaming(model.transformer)  # back on the CPU, as loaded
        control_flags.release(control)
    model.transformer.to("cpu")
    del control  # the control net is read for this run only
    inputs.release(request.device)
    return results


def decode_and_save(request: Request, vae, results: list[torch.Tensor]) -> list[Path]:
    """Phase 6: each prompt's latents decoded (one image at a time), composited for an inpaint, written."""
    args, edit = request.args, request.edit
    outputs = []
    for latents in results:
        pixels = progress.decode_each(vae, latents, request.device, request.tiles)
        if edit is not None and edit.stitch is not None and not args.no_composite:
            pixels = composite_pixels(pixels, edit.stitch, args.mask_feather)
        outputs.append(pixels)
    return inputs.save_images(outputs, request.output)


def run_flux2(request: Request, ranks: Ranks) -> list[Path]:
    """Phases 2-6 of a FLUX.2 run (klein or dev); the main process returns the files it wrote."""
    the_plan = plan(request, ranks)
    model, conditioning = encode_prompts(request, the_plan, ranks)
    if request.tiled is not None:
        return tiled_flags.run(request, the_plan, model, conditioning)
    vae, references, start, mask = encode_images(request, the_plan, ranks)
    with ranks.waiting("sampling"):  # the DiT's collectives: a process that left or stalls ends the others
        results = sample_prompts(request, the_plan, model, conditioning, references, start, mask, ranks)
    if not ranks.is_main:
        return []  # the main process decodes and writes
    return decode_and_save(request, vae, results)
