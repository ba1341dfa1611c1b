"""FLUX.2 [klein] in plain PyTorch: DiT, VAE, Qwen3 text conditioning, references, KV cache, sampler, loaders;
FLUX.1 Fill [dev] beside it (``flux1``).

Self-contained (it never imports ComfyUI). A text-to-image run::

    model = load_transformer("flux-2-klein-4b.safetensors")            # variant read from the name
    encoder = load_text_encoder("qwen_3_4b.safetensors")
    vae = load_vae("flux2-vae.safetensors")
    settings = SampleSettings(1024, 1024, 4, 1.0, seed=0)
    latents = sample(SampleRequest(model, encoder.encode(["a red fox"]), settings))
    pixels = vae.decode(latents)                                         # [B, 3, H, W] in about -1..1

Editing adds ``references=encode_references(vae, [image, ...])`` to the request. The map of the package
(which subpackage holds what, and the rules between them) is written once, in docs/architecture.md.
"""

from .configs import (
    FLUX1,
    FLUX2,
    KLEIN_4B,
    KLEIN_9B,
    KLEIN_VARIANTS,
    TEXT_ENCODER_FOR_CONTEXT,
    VARIANTS,
    Family,
    Flux2Config,
    Variant,
)
from .devices.parallel import (
    Distributed,
    ParallelInfo,
    broadcast_conditioning,
    broadcast_references,
    broadcast_tensor,
    close_distributed,
    init_distributed,
    parallel_info,
    parallelize_sequence,
)
from .devices.parallel_load import load_transformer_parallel, planned_weight_bytes
from .devices.placement import BlockPlacement, parse_devices, place_blocks, remove_placement, split_devices
from .devices.streaming import disable_streaming, enable_streaming, streamer_of
from .dit.control import Flux2ControlNet, load_controlnet
from .dit.extrapolation import DEFAULT_BASE as EXTRAPOLATION_BASE
from .dit.extrapolation import KV_AND_EXTRAPOLATION, PositionExtrapolation, position_extrapolation
from .dit.extrapolation import METHODS as EXTRAPOLATION_METHODS
from .dit.files import load_transformer
from .dit.kv_cache import RefKVCache
from .dit.step_cache import MAX_STEP_CACHE, STEP_CACHE_HELP, StepCache
from .dit.transformer import Flux2Model, Flux2Transformer, compile_blocks
from .editing import Stitch, composite, latent_mask, outpaint_canvas, prepare_inpaint
from .errors import Flux2Error, OutOfMemory
from .flow import make_noise
from .flux1 import (
    FillConditioning,
    FillInputs,
    FillSettings,
    FillTextEncoder,
    Flux1AutoEncoder,
    Flux1FillModel,
    fill_inputs,
    fill_memory,
    load_fill_text_encoder,
    load_fill_transformer,
    load_flux1_vae,
    sample_fill,
)
from .kv_store import RefKVStore
from .limits import (
    MAX_BATCH,
    MAX_FILL_GUIDANCE,
    MAX_GUIDANCE,
    MAX_SEED,
    MAX_SIZE,
    MAX_STEPS,
    MemoryNeed,
    check_fits,
    check_request,
    check_size,
)
from .lora import Lora, parse_block_strengths, prepare_lora, read_lora
from .references import (
    FIT_MODES,
    MAX_REFERENCE_PIXELS,
    ReferenceLatents,
    encode_references,
    prepare_reference,
    processed_size,
)
from .runs import (
    ControlSource,
    FillPlan,
    Prompt,
    SamplerInputs,
    SamplingPlan,
    check_image_size,
    encode_image,
    encode_images,
    inpaint_crop,
    plan_fill,
    plan_sampling,
    reference_encode_memory,
    reference_kv,
    refine_image,
    refine_memory,
)
from .sampling import (
    SampleRequest,
    SampleSettings,
    check_conditioning,
    encode_reference_kv,
    estimate_memory,
    get_sigmas,
    latent_velocity,
    model_run,
    output_size,
    sample,
)
from .steering.control_image import MAX_CONTROL_STRENGTH, AppliedControl, control_context, control_output_size
from .steering.reference_strength import MAX_STRENGTH as MAX_REFERENCE_STRENGTH
from .steering.reference_strength import ReferenceStrength, at_step, step_of
from .steering.regions import Region, RegionalPrompt, regional_plan
from .text.encoder import TextEncoder, load_text_encoder, text_encoder_spec_for
from .upscale.tiled import DEFAULT_OVERLAP as TILE_OVERLAP
from .upscale.tiled import DEFAULT_TILE as TILE_SIZE
from .upscale.tiled import TiledRefine, tiled_memory, tiled_refine
from .vae.autoencoder import AutoEncoder, load_vae
from .vae.progress import split_progress
from .weights.hub import MissingComponent
from .weights.kitchen import MODES as QUANT_COMPUTE_MODES

__all__ = [
    "ControlSource",
    "FillPlan",
    "MemoryNeed",
    "Prompt",
    "SamplerInputs",
    "SamplingPlan",
    "check_image_size",
    "encode_image",
    "encode_images",
    "inpaint_crop",
    "plan_fill",
    "plan_sampling",
    "reference_encode_memory",
    "reference_kv",
    "refine_image",
    "refine_memory",
    "MAX_CONTROL_STRENGTH",
    "AppliedControl",
    "Flux2ControlNet",
    "EXTRAPOLATION_BASE",
    "EXTRAPOLATION_METHODS",
    "KV_AND_EXTRAPOLATION",
    "PositionExtrapolation",
    "position_extrapolation",
    "control_context",
    "control_output_size",
    "load_controlnet",
    "QUANT_COMPUTE_MODES",
    "FIT_MODES",
    "FLUX1",
    "FLUX2",
    "MAX_BATCH",
    "MAX_FILL_GUIDANCE",
    "MAX_GUIDANCE",
    "MAX_SEED",
    "MAX_SIZE",
    "MAX_STEPS",
    "MAX_STEP_CACHE",
    "KLEIN_4B",
    "KLEIN_9B",
    "KLEIN_VARIANTS",
    "Lora",
    "MAX_REFERENCE_PIXELS",
    "MAX_REFERENCE_STRENGTH",
    "ReferenceStrength",
    "Region",
    "RegionalPrompt",
    "regional_plan",
    "at_step",
    "step_of",
    "VARIANTS",
    "AutoEncoder",
    "BlockPlacement",
    "Distributed",
    "Family",
    "FillConditioning",
    "FillInputs",
    "FillSettings",
    "FillTextEncoder",
    "Flux1AutoEncoder",
    "Flux1FillModel",
    "Flux2Config",
    "Flux2Error",
    "MissingComponent",
    "OutOfMemory",
    "Flux2Model",
    "Flux2Transformer",
    "ParallelInfo",
    "ReferenceLatents",
    "RefKVCache",
    "RefKVStore",
    "TEXT_ENCODER_FOR_CONTEXT",
    "STEP_CACHE_HELP",
    "SampleRequest",
    "SampleSettings",
    "StepCache",
    "Stitch",
    "TextEncoder",
    "Variant",
    "broadcast_conditioning",
    "broadcast_references",
    "broadcast_tensor",
    "check_conditioning",
    "check_fits",
    "check_request",
    "check_size",
    "close_distributed",
    "compile_blocks",
    "composite",
    "encode_reference_kv",
    "encode_references",
    "disable_streaming",
    "enable_streaming",
    "estimate_memory",
    "fill_inputs",
    "fill_memory",
    "get_sigmas",
    "init_distributed",
    "latent_mask",
    "latent_velocity",
    "model_run",
    "load_fill_text_encoder",
    "load_fill_transformer",
    "load_flux1_vae",
    "load_text_encoder",
    "load_transformer",
    "load_transformer_parallel",
    "load_vae",
    "split_progress",
    "make_noise",
    "outpaint_canvas",
    "parse_devices",
    "place_blocks",
    "parallel_info",
    "parallelize_sequence",
    "parse_block_strengths",
    "prepare_lora",
    "output_size",
    "planned_weight_bytes",
    "prepare_inpaint",
    "prepare_reference",
    "processed_size",
    "read_lora",
    "remove_placement",
    "split_devices",
    "sample",
    "sample_fill",
    "streamer_of",
    "text_encoder_spec_for",
    "TILE_OVERLAP",
    "TILE_SIZE",
    "TiledRefine",
    "tiled_memory",
    "tiled_refine",
]
