"""FLUX.1 Fill DiT files: what a file is, its shape from the tensors, and ``load_fill_transformer``.

Accepted: BFL single files (``flux1-fill-dev.safetensors``, bare or prefixed with ``model.diffusion_model.``
as ComfyUI writes whole checkpoints), quantised and GGUF re-packs of them, and diffusers ``transformer/``
folders or files. diffusers' names map through ``FILL_DIT``: split q/k/v (and the single blocks' q/k/v/MLP,
1:1:1:4) join into BFL's fused tensors, weights and biases alike, and ``norm_out``'s halves swap.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from ..errors import Flux2Error
from ..weights.checkpoint import Checkpoint
from ..weights.keymaps import DIT_PREFIXES, KeyMap, Part
from ..weights.loading import load_component
from ..weights.plan import ComponentSpec, block_count
from .config import FILL_CHANNELS, Flux1Config, describe
from .transformer import Flux1FillModel, Flux1Transformer

log = logging.getLogger(__name__)

_B, _D = r"transformer_blocks\.(\d+)\.", r"double_blocks.\1."
_S, _SB = r"single_transformer_blocks\.(\d+)\.", r"single_blocks.\1."
_P = r"\.(weight|bias)"  # every FLUX.1 linear layer has both


def _parts(target: str, count: int, weights=None) -> list:
    return [[(target + r".\2", Part(i, count, weights), None)] for i in range(count)]


_IMG_QKV = _parts(_D + "img_attn.qkv", 3)
_TXT_QKV = _parts(_D + "txt_attn.qkv", 3)
_LINEAR1 = _parts(_SB + "linear1", 4, (1, 1, 1, 4))

FILL_DIT = KeyMap(
    rules=[
        (r"(.*\.(?:query|key)_norm)\.weight", r"\1.scale"),
        (r"x_embedder" + _P, r"img_in.\1"),
        (r"context_embedder" + _P, r"txt_in.\1"),
        (r"time_text_embed\.timestep_embedder\.linear_1" + _P, r"time_in.in_layer.\1"),
        (r"time_text_embed\.timestep_embedder\.linear_2" + _P, r"time_in.out_layer.\1"),
        (r"time_text_embed\.guidance_embedder\.linear_1" + _P, r"guidance_in.in_layer.\1"),
        (r"time_text_embed\.guidance_embedder\.linear_2" + _P, r"guidance_in.out_layer.\1"),
        (r"time_text_embed\.text_embedder\.linear_1" + _P, r"vector_in.in_layer.\1"),
        (r"time_text_embed\.text_embedder\.linear_2" + _P, r"vector_in.out_layer.\1"),
        (_B + r"norm1\.linear" + _P, _D + r"img_mod.lin.\2"),
        (_B + r"norm1_context\.linear" + _P, _D + r"txt_mod.lin.\2"),
        (_B + r"attn\.to_q" + _P, _IMG_QKV[0]),
        (_B + r"attn\.to_k" + _P, _IMG_QKV[1]),
        (_B + r"attn\.to_v" + _P, _IMG_QKV[2]),
        (_B + r"attn\.add_q_proj" + _P, _TXT_QKV[0]),
        (_B + r"attn\.add_k_proj" + _P, _TXT_QKV[1]),
        (_B + r"attn\.add_v_proj" + _P, _TXT_QKV[2]),
        (_B + r"attn\.norm_q\.weight", _D + "img_attn.norm.query_norm.scale"),
        (_B + r"attn\.norm_k\.weight", _D + "img_attn.norm.key_norm.scale"),
        (_B + r"attn\.norm_added_q\.weight", _D + "txt_attn.norm.query_norm.scale"),
        (_B + r"attn\.norm_added_k\.weight", _D + "txt_attn.norm.key_norm.scale"),
        (_B + r"attn\.to_out\.0" + _P, _D + r"img_attn.proj.\2"),
        (_B + r"attn\.to_add_out" + _P, _D + r"txt_attn.proj.\2"),
        (_B + r"ff\.net\.0\.proj" + _P, _D + r"img_mlp.0.\2"),
        (_B + r"ff\.net\.2" + _P, _D + r"img_mlp.2.\2"),
        (_B + r"ff_context\.net\.0\.proj" + _P, _D + r"txt_mlp.0.\2"),
        (_B + r"ff_context\.net\.2" + _P, _D + r"txt_mlp.2.\2"),
        (_S + r"norm\.linear" + _P, _SB + r"modulation.lin.\2"),
        (_S + r"attn\.to_q" + _P, _LINEAR1[0]),
        (_S + r"attn\.to_k" + _P, _LINEAR1[1]),
        (_S + r"attn\.to_v" + _P, _LINEAR1[2]),
        (_S + r"proj_mlp" + _P, _LINEAR1[3]),
        (_S + r"proj_out" + _P, _SB + r"linear2.\2"),
        (_S + r"attn\.norm_q\.weight", _SB + "norm.query_norm.scale"),
        (_S + r"attn\.norm_k\.weight", _SB + "norm.key_norm.scale"),
        (
            r"norm_out\.linear" + _P,  # (scale; shift) -> (shift; scale), weight and bias
            [
                (r"final_layer.adaLN_modulation.1.\1", Part(1, 2), Part(0, 2)),
                (r"final_layer.adaLN_modulation.1.\1", Part(0, 2), Part(1, 2)),
            ],
        ),
        (r"proj_out" + _P, r"final_layer.linear.\1"),
    ]
)


def load_fill_transformer(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    keep_quantized: bool = True,
    quant_compute: str = "auto",
) -> Flux1FillModel:
    """Load a FLUX.1 Fill [dev] DiT from a file, folder or GGUF in the compute ``dtype`` (bfloat16 or
    float32: FLUX.1 Fill overflows in float16); ``quant_compute`` as for ``load_transformer``."""
    if dtype == torch.float16:
        raise Flux2Error(
            "FLUX.1 Fill [dev] does not run in float16 (its activations overflow into black images): use "
            "bfloat16 (GPUs) or float32"
        )
    loaded = load_component(FILL_SPEC, path, dtype, device, keep_quantized, quant_compute)
    return Flux1FillModel(loaded.module, loaded.description)


def fill_config(shapes: dict[str, tuple[int, ...]], name: str) -> Flux1Config:
    """Every size of the DiT from tensor shapes; heads are hidden / 128 (the QK-norm width)."""
    needed = (
        "img_in.weight",
        "txt_in.weight",
        "vector_in.in_layer.weight",
        "double_blocks.0.img_attn.norm.query_norm.scale",
        "double_blocks.0.img_mlp.0.weight",
        "final_layer.linear.weight",
    )
    missing = [k for k in needed if k not in shapes]
    if missing:
        raise Flux2Error(f"{name} lacks {', '.join(missing)}: it is an incomplete or unknown FLUX.1 file")
    hidden, in_channels = shapes["img_in.weight"]
    head_dim = shapes["double_blocks.0.img_attn.norm.query_norm.scale"][0]
    if hidden % head_dim or head_dim != 128:
        raise Flux2Error(f"{name}: hidden size {hidden} and head size {head_dim} do not fit a FLUX.1 DiT")
    if in_channels != FILL_CHANNELS:
        kind = {64: "FLUX.1 [dev] / [schnell] / Kontext", 128: "FLUX.1 Canny / Depth [dev]"}.get(
            in_channels, f"a FLUX.1 model with {in_channels} input channels"
        )
        raise Flux2Error(
            f"{name} is {kind}, not FLUX.1 Fill [dev] (384 input channels: latent, masked image and mask): "
            "choose flux1-fill-dev.safetensors"
        )
    return Flux1Config(
        hidden_size=hidden,
        num_heads=hidden // head_dim,
        depth=block_count(shapes, "double_blocks.", "double blocks", name),
        depth_single_blocks=block_count(shapes, "single_blocks.", "single blocks", name),
        in_channels=in_channels,
        out_channels=shapes["final_layer.linear.weight"][0],
        context_in_dim=shapes["txt_in.weight"][1],
        vec_in_dim=shapes["vector_in.in_layer.weight"][1],
        mlp_ratio=shapes["double_blocks.0.img_mlp.0.weight"][0] / hidden,
        guidance_embed="guidance_in.in_layer.weight" in shapes,
    )


_FLUX1_MARKERS = re.compile(
    r"^(double_blocks\.0\.img_mod\.|vector_in\.|transformer_blocks\.0\.norm1\.linear)"
)


def is_flux1_dit(keys) -> bool:
    """Whether (prefix-stripped) DiT keys are FLUX.1's: per-block modulation, the pooled-text embedder."""
    return any(_FLUX1_MARKERS.match(k) for k in keys)


def identify_fill(names: dict[str, str], checkpoint: Checkpoint) -> None:
    """Raise a clear error unless the keys are those of a FLUX.1 DiT (the width is checked from shapes)."""
    keys, name = set(names), checkpoint.name
    if is_flux1_dit(keys):
        if "guidance_in.in_layer.weight" not in keys and not any("guidance_embedder" in k for k in keys):
            raise Flux2Error(
                f"{name} is FLUX.1 [schnell] (no guidance embedder), not FLUX.1 Fill [dev]: choose "
                "flux1-fill-dev.safetensors"
            )
        return
    if any(k.startswith(("double_stream_modulation_img.", "double_blocks.")) for k in keys):
        raise Flux2Error(
            f"{name} is a FLUX.2 model (klein or dev), not FLUX.1 Fill [dev]: load it with the FLUX.2 model "
            "loader, and choose flux1-fill-dev.safetensors here"
        )
    encoders = ("encoder.block.", "shared.", "text_model.", "embeddings.", "model.layers.", "layers.")
    if any(k.startswith(encoders) for k in keys):
        kind = "a text encoder"
    elif any(k.startswith(("encoder.", "decoder.")) for k in keys):
        kind = "a VAE"
    else:
        kind = "not a FLUX.1 DiT"
    raise Flux2Error(
        f"{name} is {kind}, not the FLUX.1 Fill [dev] diffusion model: choose flux1-fill-dev.safetensors "
        "(ComfyUI folder models/diffusion_models)"
    )


FILL_SPEC = ComponentSpec(
    what="FLUX.1 Fill diffusion model",
    component="transformer",
    keymap=FILL_DIT,
    config=lambda shapes, checkpoint: fill_config(shapes, checkpoint.name),
    build=Flux1Transformer,
    describe=describe,
    prefixes=(DIT_PREFIXES,),
    identify=identify_fill,
    int8_matmul=True,
)
