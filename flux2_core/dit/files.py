"""FLUX.2 DiT files: what a file is, its shape from the tensors, its variant, and ``load_transformer``.

Accepted: BFL single files (bare keys, or prefixed with ``model.diffusion_model.`` / ``diffusion_model.`` as
ComfyUI writes them), and diffusers ``transformer/`` folders or files (sharded too); the names are mapped by
``keymaps.DIT``. Distilled, base and KV weights have identical shapes, so the variant is read from
``model_index.json``, then the file name, then the name in the file's metadata, unless it is chosen.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from ..configs import VARIANTS, Flux2Config, Variant, check_variant, describe, get_variant
from ..errors import Flux2Error
from ..weights.checkpoint import Checkpoint, tensor_shape
from ..weights.keymaps import DIT, DIT_PREFIXES
from ..weights.loading import load_component
from ..weights.plan import ComponentSpec, block_count
from .transformer import Flux2Model, Flux2Transformer

log = logging.getLogger(__name__)

# safetensors metadata fields that may carry the model's name (checked after the file name).
METADATA_NAME_KEYS = ("modelspec.title", "name", "model_name")


def load_transformer(
    path: str | Path,
    variant: str = "auto",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    keep_quantized: bool = True,
    quant_compute: str = "auto",
) -> Flux2Model:
    """Load a FLUX.2 DiT from a file, folder or GGUF; ``variant`` is "auto", "distilled", "base", "kv" or
    "dev". ``dtype`` is the compute dtype; quantised layers stay quantised unless ``keep_quantized`` is
    off, and multiply in their format where the device can unless ``quant_compute`` is "dequantize"
    (``weights.kitchen``)."""
    loaded = load_component(DIT_SPEC, path, dtype, device, keep_quantized, quant_compute)
    chosen = transformer_variant(loaded.checkpoint, loaded.config, variant)
    log.info("%s: %s variant", loaded.checkpoint.name, chosen.name)
    return Flux2Model(loaded.module, chosen, loaded.description)


def transformer_variant(checkpoint: Checkpoint, config: Flux2Config, variant: str = "auto") -> Variant:
    """The variant asked for (checked against the weights), or the one the files say with ``auto``."""
    chosen = get_variant(variant) if variant != "auto" else detect_variant(checkpoint, config)
    check_variant(chosen, config, checkpoint.name)
    return chosen


def transformer_config(shapes: dict[str, tuple[int, ...]], name: str) -> Flux2Config:
    """Every size of the DiT, read from tensor shapes (head_dim is the QK-norm width)."""
    needed = (
        "img_in.weight",
        "txt_in.weight",
        "double_blocks.0.img_attn.norm.query_norm.scale",
        "double_blocks.0.img_mlp.2.weight",
    )
    missing = [k for k in needed if k not in shapes]
    if missing:
        raise Flux2Error(f"{name} lacks {', '.join(missing)}: it is an incomplete or unknown FLUX.2 file")
    hidden, in_channels = shapes["img_in.weight"]
    head_dim = shapes["double_blocks.0.img_attn.norm.query_norm.scale"][0]
    mlp_hidden = shapes["double_blocks.0.img_mlp.2.weight"][1]
    if hidden % head_dim or head_dim % 8:
        raise Flux2Error(f"{name}: hidden size {hidden} and head size {head_dim} do not fit a FLUX.2 DiT")
    axis = head_dim // 4
    return Flux2Config(
        hidden_size=hidden,
        num_heads=hidden // head_dim,
        depth=block_count(shapes, "double_blocks.", "double blocks", name),
        depth_single_blocks=block_count(shapes, "single_blocks.", "single blocks", name),
        context_in_dim=shapes["txt_in.weight"][1],
        in_channels=in_channels,
        mlp_ratio=mlp_hidden / hidden,
        axes_dim=(axis, axis, axis, axis),
        guidance_embed="guidance_in.in_layer.weight" in shapes,
    )


def detect_variant(checkpoint: Checkpoint, config: Flux2Config | None = None) -> Variant:
    """A guidance-embedding DiT is dev; otherwise model_index.json, then the file name, then the metadata."""
    if config is not None and config.guidance_embed:
        return VARIANTS["dev"]
    index = checkpoint.model_index or {}
    if "KV" in str(index.get("_class_name", "")):
        return VARIANTS["kv"]
    if "is_distilled" in index:
        return VARIANTS["distilled" if index["is_distilled"] else "base"]
    name = checkpoint.path.name if checkpoint.path.is_file() else str(checkpoint.path)
    hints = [name] + [v for k, v in checkpoint.metadata.items() if k.lower() in METADATA_NAME_KEYS]
    for hint in hints:
        found = variant_from_name(hint)
        if found is not None:
            return found
    log.warning(
        "%s: could not tell distilled, base or KV weights apart; assuming distilled (4 steps, no CFG). "
        "Choose the variant explicitly if this is a base or KV checkpoint.",
        checkpoint.name,
    )
    return VARIANTS["distilled"]


def variant_from_name(text: str) -> Variant | None:
    """Official names: flux-2-klein-4b, flux-2-klein-base-9b, flux-2-klein-9b-kv (any case, _ or -)."""
    words = set(re.split(r"[^a-z0-9]+", Path(text).name.lower()))
    if "kv" in words:
        return VARIANTS["kv"]
    if "base" in words:
        return VARIANTS["base"]
    if "klein" in words or "distilled" in words:
        return VARIANTS["distilled"]
    return None


def identify_flux2(names: dict[str, str], checkpoint: Checkpoint) -> None:
    """Raise a clear error unless the (prefix-stripped) keys are those of a FLUX.2 DiT."""
    keys, name = set(names), checkpoint.name
    if (
        "double_stream_modulation_img.lin.weight" in keys
        or "double_stream_modulation_img.linear.weight" in keys
    ):
        if any(k.endswith(".bias") for k in keys):
            raise Flux2Error(
                f"{name} has bias tensors, which no FLUX.2 DiT has: the file is not a FLUX.2 model"
            )
        return
    if any(_FLUX1_KEYS.match(k) for k in keys):
        raise Flux2Error(_flux1_message(names, checkpoint))
    if "control_img_in.weight" in keys:
        raise Flux2Error(
            f"{name} is the FLUX.2 [dev] Fun ControlNet Union, a control net, not a diffusion model: put it "
            "in models/controlnet and load it with the FLUX.2 [dev] Fun ControlNet Loader (command line: "
            "--controlnet); the model is flux2-dev.safetensors"
        )
    if any(k.startswith(("model.layers.", "layers.")) for k in keys):
        kind = "a text encoder (Qwen3/LLM weights)"
    elif any(k.startswith(("encoder.block.", "shared.", "text_model.")) for k in keys):
        kind = "a FLUX.1 text encoder (T5-XXL or CLIP-L)"
    elif any(k.startswith(("encoder.", "decoder.")) for k in keys):
        kind = "a VAE"
    else:
        kind = "not a FLUX.2 DiT"
    raise Flux2Error(
        f"{name} is {kind}, not a FLUX.2 [klein] diffusion model: choose the flux-2-klein-*.safetensors file "
        "(ComfyUI folder models/diffusion_models)"
    )


# FLUX.1 names (BFL and diffusers): per-block modulation and the pooled-text embedder, which FLUX.2 lacks.
_FLUX1_KEYS = re.compile(
    r"double_blocks\.\d+\.img_mod\.|vector_in\.|transformer_blocks\.\d+\.norm1\.linear\."
)
_FLUX1_KINDS = {128: "FLUX.1 Canny / Depth [dev]", 64: "FLUX.1 [dev] / [schnell] / Kontext"}  # by input width


def _flux1_message(names: dict[str, str], checkpoint: Checkpoint) -> str:
    """What a FLUX.1 file given to the FLUX.2 loader is (by its input width), and where it goes instead."""
    stored = names.get("img_in.weight", names.get("x_embedder.weight"))
    width = tensor_shape(checkpoint.tensors, stored)[-1] if stored is not None else None
    if width == 384:
        return (
            f"{checkpoint.name} is FLUX.1 Fill [dev] (a FLUX.1 model, per-block modulation), not FLUX.2: "
            "load it with the FLUX.1 Fill [dev] Model Loader node (the command line detects it by itself); "
            "this loader takes FLUX.2 files (flux-2-klein-4b / -9b / -base / -9b-kv .safetensors)"
        )
    return (
        f"{checkpoint.name} is {_FLUX1_KINDS.get(width, 'a FLUX.1 model')} (a FLUX.1 model, per-block "
        "modulation), which this pack does not run: it runs FLUX.2 [klein] (flux-2-klein-*.safetensors, "
        "here) and FLUX.1 Fill [dev] (flux1-fill-dev.safetensors, with the FLUX.1 Fill model loader)"
    )


DIT_SPEC = ComponentSpec(
    what="diffusion model",
    component="transformer",
    keymap=DIT,
    config=lambda shapes, checkpoint: transformer_config(shapes, checkpoint.name),
    build=Flux2Transformer,
    describe=describe,
    prefixes=(DIT_PREFIXES,),
    identify=identify_flux2,
    int8_matmul=True,
)
