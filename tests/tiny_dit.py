"""Tiny random FLUX.2 DiTs written in the real file layouts (test helper).

The diffusers model is the source of truth for the weights: it is built by diffusers' own class with seeded
random weights, saved with ``save_pretrained`` (the real diffusers folder layout), and converted to the BFL
single-file layout here, by a mapping written from diffusers' key map (loaders/single_file_utils.py,
``convert_flux2_transformer_checkpoint_to_diffusers``, inverted), not by the product's loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from diffusers import Flux2Transformer2DModel
from safetensors.torch import save_file

# head_dim 16 (axes 4 x 4), 2 heads: 32 wide; text 24 wide (3 x 8).
TINY = dict(
    in_channels=128,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=24,
    axes_dims_rope=(4, 4, 4, 4),
    guidance_embeds=False,
)


def make_diffusers_dit(seed: int = 0, **overrides) -> Flux2Transformer2DModel:
    torch.manual_seed(seed)
    model = Flux2Transformer2DModel(**{**TINY, **overrides}).eval()
    with torch.no_grad():
        for p in model.parameters():
            # diffusers starts norms at 1 and some layers at 0: randomise all, keeping scales sane
            std = 0.3 if p.ndim == 1 else 1.0 / p.shape[1] ** 0.5
            p.copy_(torch.randn_like(p) * std + (1.0 if p.ndim == 1 else 0.0))
    return model


def bfl_state_dict(model: Flux2Transformer2DModel) -> dict[str, torch.Tensor]:
    """diffusers -> BFL names, following the key table of the FLUX.2 checkpoint conversion."""
    sd = model.state_dict()
    out = {
        "img_in.weight": sd["x_embedder.weight"],
        "txt_in.weight": sd["context_embedder.weight"],
        "time_in.in_layer.weight": sd["time_guidance_embed.timestep_embedder.linear_1.weight"],
        "time_in.out_layer.weight": sd["time_guidance_embed.timestep_embedder.linear_2.weight"],
        "double_stream_modulation_img.lin.weight": sd["double_stream_modulation_img.linear.weight"],
        "double_stream_modulation_txt.lin.weight": sd["double_stream_modulation_txt.linear.weight"],
        "single_stream_modulation.lin.weight": sd["single_stream_modulation.linear.weight"],
        "final_layer.linear.weight": sd["proj_out.weight"],
    }
    scale, shift = sd["norm_out.linear.weight"].chunk(2)
    out["final_layer.adaLN_modulation.1.weight"] = torch.cat([shift, scale])
    if "time_guidance_embed.guidance_embedder.linear_1.weight" in sd:
        out["guidance_in.in_layer.weight"] = sd["time_guidance_embed.guidance_embedder.linear_1.weight"]
        out["guidance_in.out_layer.weight"] = sd["time_guidance_embed.guidance_embedder.linear_2.weight"]
    for i in range(model.config.num_layers):
        d, b = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        out[b + "img_attn.qkv.weight"] = torch.cat([sd[d + f"attn.to_{c}.weight"] for c in "qkv"])
        out[b + "txt_attn.qkv.weight"] = torch.cat([sd[d + f"attn.add_{c}_proj.weight"] for c in "qkv"])
        out[b + "img_attn.norm.query_norm.scale"] = sd[d + "attn.norm_q.weight"]
        out[b + "img_attn.norm.key_norm.scale"] = sd[d + "attn.norm_k.weight"]
        out[b + "txt_attn.norm.query_norm.scale"] = sd[d + "attn.norm_added_q.weight"]
        out[b + "txt_attn.norm.key_norm.scale"] = sd[d + "attn.norm_added_k.weight"]
        out[b + "img_attn.proj.weight"] = sd[d + "attn.to_out.0.weight"]
        out[b + "txt_attn.proj.weight"] = sd[d + "attn.to_add_out.weight"]
        out[b + "img_mlp.0.weight"] = sd[d + "ff.linear_in.weight"]
        out[b + "img_mlp.2.weight"] = sd[d + "ff.linear_out.weight"]
        out[b + "txt_mlp.0.weight"] = sd[d + "ff_context.linear_in.weight"]
        out[b + "txt_mlp.2.weight"] = sd[d + "ff_context.linear_out.weight"]
    for i in range(model.config.num_single_layers):
        d, b = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        out[b + "linear1.weight"] = sd[d + "attn.to_qkv_mlp_proj.weight"]
        out[b + "linear2.weight"] = sd[d + "attn.to_out.weight"]
        out[b + "norm.query_norm.scale"] = sd[d + "attn.norm_q.weight"]
        out[b + "norm.key_norm.scale"] = sd[d + "attn.norm_k.weight"]
    return {k: v.contiguous().clone() for k, v in out.items()}


def write_bfl_file(model, path: Path, prefix: str = "", metadata: dict | None = None) -> Path:
    sd = {prefix + k: v for k, v in bfl_state_dict(model).items()}
    save_file(sd, str(path), metadata=metadata)
    return path


def write_diffusers_folder(model, root: Path, is_distilled: bool | None = True, kv: bool = False) -> Path:
    """A diffusers repository root: model_index.json + transformer/ (sharded, to exercise the index)."""
    root.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(root / "transformer", max_shard_size="200KB", safe_serialization=True)
    index = {"_class_name": "Flux2KleinKVPipeline" if kv else "Flux2KleinPipeline"}
    if is_distilled is not None:
        index["is_distilled"] = is_distilled
    (root / "model_index.json").write_text(json.dumps(index))
    return root
