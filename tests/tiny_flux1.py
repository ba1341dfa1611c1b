"""Tiny random FLUX.1 Fill [dev] parts written as the files users have (test helper).

- DiT: ``flux2_core.flux1.Flux1Transformer`` of ``TINY_FILL`` (hidden 256 = 2 heads of 128, 1 + 1 blocks,
  the real 384 input channels and RoPE axes) with seeded random weights, saved under BFL names
  (``write_fill_dit``); or diffusers' own ``FluxTransformer2DModel`` of the same shape with its own random
  weights, saved under diffusers names (``write_diffusers_fill_dit``).
- VAE: the FLUX.1 layout (16 latent channels, no quant convs, no batch norm), BFL names (``write_flux1_vae``).
- T5 / CLIP: transformers' ``T5EncoderModel`` (32 wide) and ``CLIPTextModel`` (64 wide) with the real
  vocabularies (32128 / 49408 rows), saved as ComfyUI's ``t5xxl_fp16`` / ``clip_l`` files
  (``write_t5_file``: ``shared.`` + ``encoder.``; ``write_clip_file``: ``text_model.``).
- Tokenizers: ``write_tokenizer_folders`` makes a CLIP BPE folder (vocab.json + merges.txt, 49408 ids) and a
  T5 Unigram folder (tokenizer.json, 32100 pieces) in Hugging Face layout, generated here, so no ComfyUI
  checkout and no download is needed. Their segmentation is not the real one; sizes, special ids
  (CLIP 49406 / 49407, T5 pad 0 / eos 1) and padding are.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import torch
from safetensors.torch import save_file
from tiny_vae import random_vae_state_dict

from flux2_core.flux1 import Flux1Config, Flux1Transformer
from flux2_core.vae.autoencoder import VAEConfig

T5_WIDTH, CLIP_WIDTH = 32, 64
TINY_FILL = Flux1Config(
    hidden_size=256,
    num_heads=2,
    depth=1,
    depth_single_blocks=1,
    context_in_dim=T5_WIDTH,
    vec_in_dim=CLIP_WIDTH,
)
# Factor 8 (four levels), 16 latent channels, no quant convs: the FLUX.1 ae layout at 32 wide.
TINY_FLUX1_VAE = VAEConfig(ch=32, num_res_blocks=1, decoder_ch=32, z_channels=16, patch=1, quant_conv=False)
TINY_T5 = dict(vocab_size=32128, d_model=T5_WIDTH, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
               relative_attention_num_buckets=32, relative_attention_max_distance=128,
               feed_forward_proj="gated-gelu", layer_norm_epsilon=1e-6, is_encoder_decoder=False,
               pad_token_id=0, eos_token_id=1, dropout_rate=0.0)  # fmt: skip
TINY_CLIP = dict(vocab_size=49408, hidden_size=CLIP_WIDTH, num_attention_heads=1, num_hidden_layers=2,
                 intermediate_size=128, max_position_embeddings=77, hidden_act="quick_gelu",
                 layer_norm_eps=1e-5, bos_token_id=49406, eos_token_id=49407, pad_token_id=49407)  # fmt: skip


def _randomise(module: torch.nn.Module, seed: int) -> None:
    """Every weight random with sane scales: norms near 1, matrices 1/sqrt(fan-in), biases small (default
    inits leave some layers at 0, which would hide a wrong mapping or an unused prompt)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
            elif name.endswith(("scale", "norm.weight", "layer_norm.weight", "norm1.weight", "norm2.weight")):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def fill_state_dict(config: Flux1Config = TINY_FILL, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random DiT weights under BFL names (those of ``flux1-fill-dev.safetensors``)."""
    model = Flux1Transformer(config)
    _randomise(model, seed)
    return {k: v.contiguous() for k, v in model.state_dict().items()}


def write_fill_dit(path: Path, config: Flux1Config = TINY_FILL, seed: int = 0, prefix: str = "") -> Path:
    """A BFL-layout Fill DiT file (``prefix`` e.g. ``model.diffusion_model.``, as whole checkpoints have)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({prefix + k: v for k, v in fill_state_dict(config, seed).items()}, str(path))
    return path


def write_diffusers_fill_dit(path: Path, config: Flux1Config = TINY_FILL, seed: int = 0) -> Path:
    """diffusers' ``FluxTransformer2DModel`` of the same shape, its own random weights, diffusers names."""
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(
        patch_size=1,
        in_channels=config.in_channels,
        out_channels=config.out_channels,
        num_layers=config.depth,
        num_single_layers=config.depth_single_blocks,
        attention_head_dim=config.head_dim,
        num_attention_heads=config.num_heads,
        joint_attention_dim=config.context_in_dim,
        pooled_projection_dim=config.vec_in_dim,
        guidance_embeds=True,
        axes_dims_rope=config.axes_dim,
    )
    _randomise(model, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def write_flux1_vae(path: Path, config: VAEConfig = TINY_FLUX1_VAE, seed: int = 0) -> Path:
    """A FLUX.1 VAE file (BFL names, as ``ae.safetensors``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in random_vae_state_dict(config, seed, bn=False).items()}, str(path)
    )
    return path


def make_tiny_t5(seed: int = 0):
    from transformers import T5Config, T5EncoderModel

    model = T5EncoderModel(T5Config(**TINY_T5)).eval()
    _randomise(model, seed)
    return model


def make_tiny_clip(seed: int = 0):
    from transformers import CLIPTextConfig, CLIPTextModel

    model = CLIPTextModel(CLIPTextConfig(**TINY_CLIP)).eval()
    _randomise(model, seed)
    return model


def write_t5_file(model, path: Path) -> Path:
    """ComfyUI's ``t5xxl_fp16.safetensors`` layout: ``shared.weight`` and ``encoder.*`` (no tied copy)."""
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if k != "encoder.embed_tokens.weight"}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path))
    return path


def write_clip_file(model, path: Path) -> Path:
    """ComfyUI's ``clip_l.safetensors`` layout: ``text_model.*`` (the position ids buffer left out)."""
    sd = {k: v.contiguous() for k, v in model.state_dict().items() if not k.endswith("position_ids")}
    if not next(iter(sd)).startswith("text_model."):
        sd = {"text_model." + k: v for k, v in sd.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(sd, str(path))
    return path


# ---- tokenizers --------------------------------------------------------------------------------------------

CLIP_IDS, T5_PIECES = 49408, 32100


def _byte_alphabet() -> list[str]:
    """The 256 printable characters byte-level BPE uses for the bytes (GPT-2 / CLIP convention)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [256 + i for i in range(256 - len(kept))]
    others = iter(shifted)
    return [chr(b) if b in kept else chr(next(others)) for b in range(256)]


def write_clip_tokenizer(folder: Path) -> Path:
    """A byte-level BPE folder with CLIP's 49408 ids: 512 byte symbols (with and without ``</w>``), merges
    of symbol pairs (letters first) up to id 49405, then ``<|startoftext|>`` and ``<|endoftext|>``."""
    alphabet = _byte_alphabet()
    vocab = {c: i for i, c in enumerate(alphabet)}
    vocab.update({c + "</w>": 256 + i for i, c in enumerate(alphabet)})
    first = sorted(alphabet, key=lambda c: (not c.isalpha(), not c.isascii(), c))
    merges = []
    for a in first:
        for b in first:
            for end in ("</w>", ""):
                if len(vocab) < CLIP_IDS - 2:
                    merges.append(f"{a} {b}{end}")
                    vocab[a + b + end] = len(vocab)
    vocab["<|startoftext|>"], vocab["<|endoftext|>"] = CLIP_IDS - 2, CLIP_IDS - 1
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(merges) + "\n", encoding="utf-8")
    config = {
        "tokenizer_class": "CLIPTokenizer",
        "bos_token": "<|startoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 8192,
    }  # fmt: skip  (8192 as ComfyUI's folder says: the core must ignore it)
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def write_t5_tokenizer(folder: Path) -> Path:
    """A SentencePiece-style Unigram ``tokenizer.json`` with T5's 32100 pieces: ``<pad>`` 0, ``</s>`` 1,
    ``<unk>`` 2, characters and letter pairs / triples (with and without the word marker), then
    ``<extra_id_99>`` ... ``<extra_id_0>``; ``</s>`` appended to every text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    symbols = string.ascii_letters + string.digits + string.punctuation
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [(c, -5.0) for c in symbols] + [("▁" + c, -4.0) for c in symbols]
    lower = string.ascii_lowercase
    pieces += [(p + a + b, -6.0 if p else -7.0) for a in lower for b in lower for p in ("▁", "")]
    triples = (p + a + b + c for p in ("▁", "") for a in lower for b in lower for c in lower)
    while len(pieces) < T5_PIECES - 100:
        pieces.append((next(triples), -9.0))
    extra = [f"<extra_id_{k}>" for k in range(99, -1, -1)]
    pieces += [(e, 0.0) for e in extra]
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=2))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in ["<pad>", "</s>", "<unk>", *extra]])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "T5Tokenizer", "eos_token": "</s>", "unk_token": "<unk>",
              "pad_token": "<pad>", "extra_ids": 100, "legacy": False, "model_max_length": 512}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


def write_tokenizer_folders(root: Path) -> tuple[Path, Path]:
    """(CLIP folder, T5 folder) under ``root``, laid out as in a ComfyUI checkout's ``comfy`` package:
    ``sd1_tokenizer`` and ``text_encoders/t5_tokenizer``."""
    return write_clip_tokenizer(root / "sd1_tokenizer"), write_t5_tokenizer(
        root / "text_encoders" / "t5_tokenizer"
    )


# ---- diffusers / transformers references (parity tests) ----------------------------------------------------
#
# The libraries' own classes with seeded random weights, in small configurations: the real
# head size (128), RoPE axes (16, 56, 56) and 384-channel input; the FLUX.1 VAE's structure (4 levels of 2
# blocks, 16 latent channels, no quant convs, factor 8) at a quarter of its width. The text encoders differ
# from ``TINY_T5`` / ``TINY_CLIP`` where a shape-reading loader could guess: T5 d_kv * heads (64) is not
# d_model (32), CLIP has 2 heads of 64. The BFL DiT layout is made from BFL's key table, not by
# the product's loader.

PARITY_T5 = {**TINY_T5, "d_kv": 16, "d_ff": 40}
PARITY_CLIP = {**TINY_CLIP, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 256}
PARITY_FILL = dict(
    patch_size=1,
    in_channels=384,
    out_channels=64,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=128,
    num_attention_heads=2,
    joint_attention_dim=PARITY_T5["d_model"],
    pooled_projection_dim=PARITY_CLIP["hidden_size"],
    guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
PARITY_VAE = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=16,
    block_out_channels=(32, 64, 128, 128),
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    layers_per_block=2,
    norm_num_groups=32,
    use_quant_conv=False,
    use_post_quant_conv=False,
    mid_block_add_attention=True,
    scaling_factor=0.3611,
    shift_factor=0.1159,
)
# FLUX.1 Fill's scheduler config (black-forest-labs/FLUX.1-Fill-dev scheduler/scheduler_config.json, a
# FlowMatchEulerDiscreteScheduler).
FILL_SCHEDULER = dict(
    base_image_seq_len=256,
    base_shift=0.5,
    max_image_seq_len=4096,
    max_shift=1.15,
    num_train_timesteps=1000,
    shift=3.0,
    use_dynamic_shifting=True,
)


def _randomise_reference(model: torch.nn.Module, seed: int) -> None:
    """Every tensor random: matrices 1/sqrt(fan-in), so modulation scales and gates are O(1) and the prompt,
    pooled vector, guidance and mask channels all move the output; norm scales near 1; biases small."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / p[0].numel() ** 0.5)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))


def make_diffusers_fill_dit(seed: int = 0, **overrides):
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(**{**PARITY_FILL, **overrides}).eval()
    _randomise_reference(model, seed)
    return model


def make_diffusers_flux1_vae(seed: int = 0):
    """diffusers' ``AutoencoderKL`` with a deterministic posterior: the log-variance half of
    ``encoder.conv_out`` sits at diffusers' clamp (-30), so its sampled latent (std 3e-7) is the mean that
    BFL and ComfyUI use."""
    from diffusers import AutoencoderKL

    model = AutoencoderKL(**PARITY_VAE).eval()
    _randomise_reference(model, seed)
    with torch.no_grad():
        model.encoder.conv_out.weight[16:] = 0.0
        model.encoder.conv_out.bias[16:] = -30.0
    return model


def make_parity_t5(seed: int = 0):
    from transformers import T5Config, T5EncoderModel

    model = T5EncoderModel(T5Config(**PARITY_T5)).eval()
    _randomise_reference(model, seed)
    return model


def make_parity_clip(seed: int = 0):
    from transformers import CLIPTextConfig, CLIPTextModel

    model = CLIPTextModel(CLIPTextConfig(**PARITY_CLIP)).eval()
    _randomise_reference(model, seed)
    return model


def fill_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(**FILL_SCHEDULER)


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, prefix: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({prefix + k: v.detach().contiguous() for k, v in tensors.items()}, str(path))
    return path


def bfl_fill_state_dict(model) -> dict[str, torch.Tensor]:
    """A diffusers ``FluxTransformer2DModel``'s weights under BFL names, by the key map of diffusers'
    ``convert_flux_transformer_checkpoint_to_diffusers`` (loaders/single_file_utils.py) inverted: q/k/v
    concatenated (weights and biases), the single blocks' q/k/v/MLP into ``linear1``, QK-norm weights as
    ``.scale``, ``norm_out``'s (scale; shift) halves swapped into (shift; scale)."""
    sd = model.state_dict()
    out: dict[str, torch.Tensor] = {}

    def linear(bfl: str, diffusers: str) -> None:
        for kind in ("weight", "bias"):
            out[f"{bfl}.{kind}"] = sd[f"{diffusers}.{kind}"]

    def fused(bfl: str, parts: list[str]) -> None:
        for kind in ("weight", "bias"):
            out[f"{bfl}.{kind}"] = torch.cat([sd[f"{p}.{kind}"] for p in parts])

    linear("img_in", "x_embedder")
    linear("txt_in", "context_embedder")
    for bfl, embedder in (("time_in", "timestep"), ("guidance_in", "guidance"), ("vector_in", "text")):
        linear(f"{bfl}.in_layer", f"time_text_embed.{embedder}_embedder.linear_1")
        linear(f"{bfl}.out_layer", f"time_text_embed.{embedder}_embedder.linear_2")
    for i in range(model.config.num_layers):
        b, d = f"double_blocks.{i}.", f"transformer_blocks.{i}."
        linear(b + "img_mod.lin", d + "norm1.linear")
        linear(b + "txt_mod.lin", d + "norm1_context.linear")
        fused(b + "img_attn.qkv", [d + f"attn.to_{c}" for c in "qkv"])
        fused(b + "txt_attn.qkv", [d + f"attn.add_{c}_proj" for c in "qkv"])
        out[b + "img_attn.norm.query_norm.scale"] = sd[d + "attn.norm_q.weight"]
        out[b + "img_attn.norm.key_norm.scale"] = sd[d + "attn.norm_k.weight"]
        out[b + "txt_attn.norm.query_norm.scale"] = sd[d + "attn.norm_added_q.weight"]
        out[b + "txt_attn.norm.key_norm.scale"] = sd[d + "attn.norm_added_k.weight"]
        linear(b + "img_attn.proj", d + "attn.to_out.0")
        linear(b + "txt_attn.proj", d + "attn.to_add_out")
        linear(b + "img_mlp.0", d + "ff.net.0.proj")
        linear(b + "img_mlp.2", d + "ff.net.2")
        linear(b + "txt_mlp.0", d + "ff_context.net.0.proj")
        linear(b + "txt_mlp.2", d + "ff_context.net.2")
    for i in range(model.config.num_single_layers):
        b, d = f"single_blocks.{i}.", f"single_transformer_blocks.{i}."
        linear(b + "modulation.lin", d + "norm.linear")
        fused(b + "linear1", [d + "attn.to_q", d + "attn.to_k", d + "attn.to_v", d + "proj_mlp"])
        linear(b + "linear2", d + "proj_out")
        out[b + "norm.query_norm.scale"] = sd[d + "attn.norm_q.weight"]
        out[b + "norm.key_norm.scale"] = sd[d + "attn.norm_k.weight"]
    for kind in ("weight", "bias"):
        scale, shift = sd[f"norm_out.linear.{kind}"].chunk(2)
        out[f"final_layer.adaLN_modulation.1.{kind}"] = torch.cat([shift, scale])
    linear("final_layer.linear", "proj_out")
    return {k: v.contiguous().clone() for k, v in out.items()}
