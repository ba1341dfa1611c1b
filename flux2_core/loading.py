"""Loading a FLUX.2 DiT checkpoint: format detection, one key-mapping table, shape-derived config, variant.

Accepted: BFL single files (bare keys, or prefixed with ``model.diffusion_model.`` / ``diffusion_model.`` as
ComfyUI writes them), and diffusers ``transformer/`` folders or files (sharded too). diffusers names are
mapped onto the BFL names by ``DIFFUSERS_TO_BFL`` plus two reshapes: q/k/v are concatenated into one fused
qkv, and the final layer's (scale; shift) rows are swapped back to BFL's (shift; scale). Missing that swap
would load silently and produce garbage, so it lives in the same table as the renames."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import Checkpoint, load_into, open_checkpoint, reject_quantized, strip_prefix
from .configs import VARIANTS, Flux2Config, Variant, describe, get_variant
from .errors import Flux2Error
from .transformer import Flux2Transformer

log = logging.getLogger(__name__)

PREFIXES = ("model.diffusion_model.", "diffusion_model.", "transformer.")

# diffusers name pattern -> (BFL name, how the tensors combine). "cat" joins the listed sources along dim 0
# (q, k, v -> fused qkv); "swap" exchanges the two row halves ((scale; shift) -> (shift; scale)).
DIFFUSERS_TO_BFL: list[tuple[str, str, str]] = [
    (r"x_embedder\.weight", "img_in.weight", "copy"),
    (r"context_embedder\.weight", "txt_in.weight", "copy"),
    (r"time_guidance_embed\.timestep_embedder\.linear_1\.weight", "time_in.in_layer.weight", "copy"),
    (r"time_guidance_embed\.timestep_embedder\.linear_2\.weight", "time_in.out_layer.weight", "copy"),
    (r"time_guidance_embed\.guidance_embedder\.linear_1\.weight", "guidance_in.in_layer.weight", "copy"),
    (r"time_guidance_embed\.guidance_embedder\.linear_2\.weight", "guidance_in.out_layer.weight", "copy"),
    (
        r"double_stream_modulation_(img|txt)\.linear\.weight",
        r"double_stream_modulation_\1.lin.weight",
        "copy",
    ),
    (r"single_stream_modulation\.linear\.weight", "single_stream_modulation.lin.weight", "copy"),
    (r"transformer_blocks\.(\d+)\.attn\.to_(q|k|v)\.weight", r"double_blocks.\1.img_attn.qkv.weight", "cat"),
    (r"transformer_blocks\.(\d+)\.attn\.to_qkv\.weight", r"double_blocks.\1.img_attn.qkv.weight", "copy"),
    (
        r"transformer_blocks\.(\d+)\.attn\.add_(q|k|v)_proj\.weight",
        r"double_blocks.\1.txt_attn.qkv.weight",
        "cat",
    ),
    (
        r"transformer_blocks\.(\d+)\.attn\.to_added_qkv\.weight",
        r"double_blocks.\1.txt_attn.qkv.weight",
        "copy",
    ),
    (
        r"transformer_blocks\.(\d+)\.attn\.norm_q\.weight",
        r"double_blocks.\1.img_attn.norm.query_norm.scale",
        "copy",
    ),
    (
        r"transformer_blocks\.(\d+)\.attn\.norm_k\.weight",
        r"double_blocks.\1.img_attn.norm.key_norm.scale",
        "copy",
    ),
    (
        r"transformer_blocks\.(\d+)\.attn\.norm_added_q\.weight",
        r"double_blocks.\1.txt_attn.norm.query_norm.scale",
        "copy",
    ),
    (
        r"transformer_blocks\.(\d+)\.attn\.norm_added_k\.weight",
        r"double_blocks.\1.txt_attn.norm.key_norm.scale",
        "copy",
    ),
    (r"transformer_blocks\.(\d+)\.attn\.to_out\.0\.weight", r"double_blocks.\1.img_attn.proj.weight", "copy"),
    (
        r"transformer_blocks\.(\d+)\.attn\.to_add_out\.weight",
        r"double_blocks.\1.txt_attn.proj.weight",
        "copy",
    ),
    (r"transformer_blocks\.(\d+)\.ff\.linear_in\.weight", r"double_blocks.\1.img_mlp.0.weight", "copy"),
    (r"transformer_blocks\.(\d+)\.ff\.linear_out\.weight", r"double_blocks.\1.img_mlp.2.weight", "copy"),
    (
        r"transformer_blocks\.(\d+)\.ff_context\.linear_in\.weight",
        r"double_blocks.\1.txt_mlp.0.weight",
        "copy",
    ),
    (
        r"transformer_blocks\.(\d+)\.ff_context\.linear_out\.weight",
        r"double_blocks.\1.txt_mlp.2.weight",
        "copy",
    ),
    (
        r"single_transformer_blocks\.(\d+)\.attn\.to_qkv_mlp_proj\.weight",
        r"single_blocks.\1.linear1.weight",
        "copy",
    ),
    (r"single_transformer_blocks\.(\d+)\.attn\.to_out\.weight", r"single_blocks.\1.linear2.weight", "copy"),
    (
        r"single_transformer_blocks\.(\d+)\.attn\.norm_q\.weight",
        r"single_blocks.\1.norm.query_norm.scale",
        "copy",
    ),
    (
        r"single_transformer_blocks\.(\d+)\.attn\.norm_k\.weight",
        r"single_blocks.\1.norm.key_norm.scale",
        "copy",
    ),
    (r"norm_out\.linear\.weight", "final_layer.adaLN_modulation.1.weight", "swap"),
    (r"proj_out\.weight", "final_layer.linear.weight", "copy"),
]
_QKV_ORDER = {"q": 0, "k": 1, "v": 2}
# safetensors metadata fields that may carry the model's name (checked after the file name).
METADATA_NAME_KEYS = ("modelspec.title", "name", "model_name")


@dataclass
class Flux2Model:
    """A loaded DiT with what was learned about it: its shape, its variant and where it came from."""

    transformer: Flux2Transformer
    variant: Variant
    name: str  # e.g. "klein 9B"
    source: str  # file or folder name

    @property
    def config(self) -> Flux2Config:
        return self.transformer.config


def load_transformer(
    path: str | Path,
    variant: str = "auto",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Flux2Model:
    """Load a FLUX.2 DiT from a file or folder; ``variant`` is "auto", "distilled", "base" or "kv"."""
    checkpoint = open_checkpoint(path, "transformer")
    reject_quantized(checkpoint.tensors, checkpoint.metadata, checkpoint.name)
    state_dict = to_bfl_state_dict(checkpoint.tensors, checkpoint.name)
    config = transformer_config(state_dict, checkpoint.name)
    with torch.device("meta"):
        module = Flux2Transformer(config)
    load_into(module, state_dict, checkpoint.name)
    module = module.to(device=device, dtype=dtype).eval().requires_grad_(False)
    chosen = get_variant(variant) if variant != "auto" else detect_variant(checkpoint)
    log.info("loaded %s (%s, %s) from %s", describe(config), chosen.name, dtype, checkpoint.name)
    return Flux2Model(module, chosen, describe(config), checkpoint.name)


def to_bfl_state_dict(tensors: dict[str, torch.Tensor], name: str) -> dict[str, torch.Tensor]:
    """Strip known prefixes and map diffusers names onto BFL names; BFL files pass through."""
    tensors = strip_prefix(tensors, PREFIXES)
    _check_is_flux2(tensors, name)
    if "img_in.weight" in tensors:
        return {_bfl_norm_name(k): v for k, v in tensors.items()}
    out: dict[str, torch.Tensor] = {}
    parts: dict[str, dict[int, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        for pattern, target, how in DIFFUSERS_TO_BFL:
            match = re.fullmatch(pattern, key)
            if match is None:
                continue
            if how == "cat":
                parts.setdefault(match.expand(target), {})[_QKV_ORDER[match.group(2)]] = tensor
            elif how == "swap":
                scale, shift = tensor.chunk(2, dim=0)
                out[match.expand(target)] = torch.cat([shift, scale], dim=0)
            else:
                out[match.expand(target)] = tensor
            break
        else:
            out[key] = tensor  # left for load_into to report as unexpected
    for target, pieces in parts.items():
        if sorted(pieces) != [0, 1, 2]:
            raise Flux2Error(f"{name}: {target} is missing some of its q/k/v parts; the file is incomplete")
        out[target] = torch.cat([pieces[0], pieces[1], pieces[2]], dim=0)
    return out


def transformer_config(state_dict: dict[str, torch.Tensor], name: str) -> Flux2Config:
    """Every size of the DiT, read from tensor shapes (head_dim is the QK-norm width)."""
    needed = (
        "img_in.weight",
        "txt_in.weight",
        "double_blocks.0.img_attn.norm.query_norm.scale",
        "double_blocks.0.img_mlp.2.weight",
    )
    missing = [k for k in needed if k not in state_dict]
    if missing:
        raise Flux2Error(f"{name} lacks {', '.join(missing)}: it is an incomplete or unknown FLUX.2 file")
    hidden, in_channels = state_dict["img_in.weight"].shape
    head_dim = state_dict["double_blocks.0.img_attn.norm.query_norm.scale"].shape[0]
    mlp_hidden = state_dict["double_blocks.0.img_mlp.2.weight"].shape[1]
    if hidden % head_dim or head_dim % 8:
        raise Flux2Error(f"{name}: hidden size {hidden} and head size {head_dim} do not fit a FLUX.2 DiT")
    axis = head_dim // 4
    return Flux2Config(
        hidden_size=hidden,
        num_heads=hidden // head_dim,
        depth=_count_blocks(state_dict, "double_blocks."),
        depth_single_blocks=_count_blocks(state_dict, "single_blocks."),
        context_in_dim=state_dict["txt_in.weight"].shape[1],
        in_channels=in_channels,
        mlp_ratio=mlp_hidden / hidden,
        axes_dim=(axis, axis, axis, axis),
        guidance_embed="guidance_in.in_layer.weight" in state_dict,
    )


def detect_variant(checkpoint: Checkpoint) -> Variant:
    """Distilled, base and KV share shapes: read model_index.json, then the file name, then the metadata."""
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


def _bfl_norm_name(key: str) -> str:
    # ComfyUI may store the QK-norm weights as ".weight" instead of BFL's ".scale".
    if key.endswith(("query_norm.weight", "key_norm.weight")):
        return key[: -len("weight")] + "scale"
    return key


def _count_blocks(state_dict: dict[str, torch.Tensor], prefix: str) -> int:
    indices = {int(k[len(prefix) :].split(".")[0]) for k in state_dict if k.startswith(prefix)}
    return max(indices) + 1 if indices else 0


def _check_is_flux2(tensors: dict[str, torch.Tensor], name: str) -> None:
    keys = set(tensors)
    if (
        "double_stream_modulation_img.lin.weight" in keys
        or "double_stream_modulation_img.linear.weight" in keys
    ):
        if any(k.endswith(".bias") for k in keys):
            raise Flux2Error(
                f"{name} has bias tensors, which no FLUX.2 DiT has: the file is not a FLUX.2 model"
            )
        return
    if any(k.startswith("double_blocks.0.img_mod.") for k in keys) or "vector_in.in_layer.weight" in keys:
        raise Flux2Error(
            f"{name} is a FLUX.1 model (per-block modulation): this pack runs FLUX.2 [klein]; "
            "load flux-2-klein-4b / -9b / -base / -9b-kv .safetensors instead"
        )
    if any(k.startswith(("model.layers.", "layers.")) for k in keys):
        kind = "a text encoder (Qwen3/LLM weights)"
    elif any(k.startswith(("encoder.", "decoder.")) for k in keys):
        kind = "a VAE"
    else:
        kind = "not a FLUX.2 DiT"
    raise Flux2Error(
        f"{name} is {kind}, not a FLUX.2 [klein] diffusion model: choose the flux-2-klein-*.safetensors file "
        "(ComfyUI folder models/diffusion_models)"
    )
