"""FLUX.1's two text encoders: T5 v1.1 XXL (per-token conditioning) and CLIP-L (the pooled vector).

- T5: ``transformers.T5EncoderModel``; prompts padded or cut to 512 tokens (BFL's default and diffusers'),
  run without an attention mask as every reference does; the output is the last hidden state after the
  final norm, [B, 512, 4096].
- CLIP-L: ``transformers.CLIPTextModel``; 77 tokens; the output is the pooled, unprojected state at the
  first end-of-text token, [B, 768] (causal attention: padding after it changes nothing).

Files: ComfyUI's ``t5xxl_fp16.safetensors`` / ``t5xxl_fp8_e4m3fn_scaled.safetensors`` and
``clip_l.safetensors``, HF folders (``text_encoder_2/``, ``text_encoder/`` of a diffusers repository) and
GGUF re-packs with HF names. Every size is read from the tensors. Tokenizers are in ``tokenizers.py``.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import Flux2Error
from ..ops import adopt_linears
from ..weights.checkpoint import Checkpoint, open_checkpoint
from ..weights.keymaps import KeyMap
from ..weights.loading import load_checkpoint
from ..weights.plan import ComponentSpec, block_count, plan_checkpoint

log = logging.getLogger(__name__)

T5_FILE, CLIP_FILE = "t5xxl_fp16.safetensors", "clip_l.safetensors"
CLIP_BOS, CLIP_EOS = 49406, 49407  # <|startoftext|>, <|endoftext|> (also the pad token)
CLIP_HEAD_DIM = 64


@dataclass(frozen=True)
class T5Shape:
    d_model: int
    num_layers: int
    num_heads: int
    d_kv: int
    d_ff: int
    vocab_size: int
    num_buckets: int
    max_distance: int = 128
    gated: bool = True  # v1.1: wi_0 / wi_1 with GELU (tanh); v1.0: one wi with ReLU
    eps: float = 1e-6


@dataclass(frozen=True)
class ClipShape:
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    positions: int
    hidden_act: str = "quick_gelu"
    eps: float = 1e-5


T5_XXL = T5Shape(4096, 24, 64, 64, 10240, 32128, 32)
CLIP_L = ClipShape(768, 12, 12, 3072, 49408, 77)


def describe_t5(shape: T5Shape) -> str:
    return "T5-XXL" if shape == T5_XXL else f"T5 encoder ({shape.d_model} wide, {shape.num_layers} layers)"


def describe_clip(shape: ClipShape) -> str:
    return (
        "CLIP-L"
        if shape == CLIP_L
        else f"CLIP text encoder ({shape.hidden_size} wide, {shape.num_layers} layers)"
    )


# ---- T5 ------------------------------------------------------------------------------------------------


def t5_shape(shapes: dict[str, tuple[int, ...]], config: dict | None, name: str) -> T5Shape:
    config = config or {}
    attn = "encoder.block.0.layer.0.SelfAttention."
    try:
        vocab, d_model = shapes["shared.weight"]
        buckets, heads = shapes[attn + "relative_attention_bias.weight"]
        q_rows = shapes[attn + "q.weight"][0]
        gated = "encoder.block.0.layer.1.DenseReluDense.wi_0.weight" in shapes
        d_ff = shapes["encoder.block.0.layer.1.DenseReluDense." + ("wi_0" if gated else "wi") + ".weight"][0]
    except KeyError as e:
        raise Flux2Error(f"{name} lacks {e.args[0]}: the T5 file is incomplete, download it again") from None
    return T5Shape(
        d_model=d_model,
        num_layers=block_count(shapes, "encoder.block.", "T5 blocks", name),
        num_heads=heads,
        d_kv=q_rows // heads,
        d_ff=d_ff,
        vocab_size=vocab,
        num_buckets=buckets,
        max_distance=int(config.get("relative_attention_max_distance") or 128),
        gated=gated,
        eps=float(config.get("layer_norm_epsilon") or 1e-6),
    )


def build_t5(shape: T5Shape) -> torch.nn.Module:
    # transformers takes seconds to import: only when a model is built
    from transformers import T5Config, T5EncoderModel

    config = T5Config(
        vocab_size=shape.vocab_size,
        d_model=shape.d_model,
        d_kv=shape.d_kv,
        d_ff=shape.d_ff,
        num_layers=shape.num_layers,
        num_heads=shape.num_heads,
        relative_attention_num_buckets=shape.num_buckets,
        relative_attention_max_distance=shape.max_distance,
        feed_forward_proj="gated-gelu" if shape.gated else "relu",
        layer_norm_epsilon=shape.eps,
        dropout_rate=0.0,
        is_encoder_decoder=False,
        use_cache=False,
    )
    model = T5EncoderModel(config)
    model.encoder.embed_tokens = model.shared  # one embedding, as the files store it (``shared.weight``)
    return adopt_linears(model)


def _t5_rename(names: dict[str, str]) -> dict[str, str]:
    # HF state dicts may also carry the tied copy ``encoder.embed_tokens.weight``; ComfyUI's files do not.
    names = dict(names)
    tied = names.pop("encoder.embed_tokens.weight", None)
    if "shared.weight" not in names and tied is not None:
        names["shared.weight"] = tied
    return names


def _identify_t5(names: dict[str, str], checkpoint: Checkpoint) -> None:
    keys = set(names)
    if "shared.weight" in keys and any(k.startswith("encoder.block.") for k in keys):
        return
    raise Flux2Error(f"{checkpoint.name} is {_what(keys)}, not a T5 encoder: choose {T5_FILE} here")


T5_SPEC = ComponentSpec(
    what="T5 text encoder",
    component="text_encoder_2",
    keymap=KeyMap(
        rules=[
            (r"shared\.weight", [("shared.weight", None, None), ("encoder.embed_tokens.weight", None, None)])
        ]
    ),
    config=lambda shapes, checkpoint: t5_shape(shapes, checkpoint.config, checkpoint.name),
    build=build_t5,
    describe=describe_t5,
    prefixes=(("text_encoders.t5xxl.transformer.",),),
    identify=_identify_t5,
    rename=_t5_rename,
    wanted=lambda key: not key.startswith(("decoder.", "lm_head.")),
    dequantized=lambda name: name.endswith(".DenseReluDense.wo"),  # T5 casts its activations to wo's dtype
)

# ---- CLIP ----------------------------------------------------------------------------------------------


def clip_shape(shapes: dict[str, tuple[int, ...]], config: dict | None, name: str) -> ClipShape:
    config = config or {}
    config = config.get("text_config", config)
    try:
        vocab, hidden = shapes["embeddings.token_embedding.weight"]
        positions = shapes["embeddings.position_embedding.weight"][0]
        intermediate = shapes["encoder.layers.0.mlp.fc1.weight"][0]
    except KeyError as e:
        raise Flux2Error(
            f"{name} lacks {e.args[0]}: the CLIP file is incomplete, download it again"
        ) from None
    return ClipShape(
        hidden_size=hidden,
        num_layers=block_count(shapes, "encoder.layers.", "CLIP layers", name),
        num_heads=int(config.get("num_attention_heads") or max(1, hidden // CLIP_HEAD_DIM)),
        intermediate_size=intermediate,
        vocab_size=vocab,
        positions=positions,
        hidden_act=str(config.get("hidden_act") or "quick_gelu"),
        eps=float(config.get("layer_norm_eps") or 1e-5),
    )


def build_clip(shape: ClipShape) -> torch.nn.Module:
    # transformers takes seconds to import: only when a model is built
    from transformers import CLIPTextConfig, CLIPTextModel

    config = CLIPTextConfig(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        max_position_embeddings=shape.positions,
        hidden_act=shape.hidden_act,
        layer_norm_eps=shape.eps,
        bos_token_id=CLIP_BOS,
        eos_token_id=CLIP_EOS,
        pad_token_id=CLIP_EOS,
        attn_implementation="sdpa",
    )
    return adopt_linears(CLIPTextModel(config))


def _identify_clip(names: dict[str, str], checkpoint: Checkpoint) -> None:
    keys = set(names)
    if "embeddings.token_embedding.weight" in keys and any(k.startswith("encoder.layers.") for k in keys):
        return
    raise Flux2Error(f"{checkpoint.name} is {_what(keys)}, not a CLIP text encoder: choose {CLIP_FILE} here")


_CLIP_UNUSED = re.compile(r"^(text_projection\.|embeddings\.position_ids$|logit_scale$|vision_model\.)")

CLIP_SPEC = ComponentSpec(
    what="CLIP text encoder",
    component="text_encoder",
    keymap=KeyMap(),
    config=lambda shapes, checkpoint: clip_shape(shapes, checkpoint.config, checkpoint.name),
    build=build_clip,
    describe=describe_clip,
    prefixes=(("text_encoders.clip_l.transformer.", "cond_stage_model.transformer."), ("text_model.",)),
    identify=_identify_clip,
    wanted=lambda key: not _CLIP_UNUSED.match(key),
)


def _what(keys: set[str]) -> str:
    """What a file that is not the encoder asked for holds, for the message."""
    if any(k.startswith("encoder.block.") for k in keys):
        return "a T5 encoder"
    clip_layers = ("encoder.layers.", "text_model.encoder.layers.")  # the T5 loader keeps ComfyUI's prefix
    if any(k.startswith(clip_layers) and "self_attn" in k for k in keys):
        return "a CLIP text encoder"
    if any(k.startswith(("layers.", "model.layers.", "embed_tokens.")) for k in keys):
        return "a language model (Qwen3 / Mistral: the FLUX.2 text encoders)"
    if any(
        k.startswith(("double_blocks.", "single_blocks.", "img_in.", "transformer_blocks.")) for k in keys
    ):
        return "a diffusion model"
    if any(k.startswith(("encoder.conv_in", "decoder.")) for k in keys):
        return "a VAE"
    return "an unknown model"


# ---- loading -------------------------------------------------------------------------------------------


@dataclass
class LoadedEncoder:
    model: torch.nn.Module
    shape: T5Shape | ClipShape
    checkpoint: Checkpoint
    name: str


def load_t5(path, dtype=torch.float32, device="cpu", keep_quantized: bool = True) -> LoadedEncoder:
    """T5 from a file or folder (or an already opened ``Checkpoint``)."""
    encoder = _load(T5_SPEC, path, dtype, keep_quantized)
    encoder.model.to(device)
    return encoder


def load_clip(path, dtype=torch.float32, device="cpu", keep_quantized: bool = True) -> LoadedEncoder:
    """CLIP from a file or folder (or an already opened ``Checkpoint``)."""
    encoder = _load(CLIP_SPEC, path, dtype, keep_quantized)
    # position_ids is a buffer in no file (the meta build left it empty): 0 .. positions - 1, as transformers
    encoder.model.embeddings.register_buffer(
        "position_ids", torch.arange(encoder.shape.positions)[None], persistent=False
    )
    encoder.model.to(device)
    return encoder


def _load(spec: ComponentSpec, path, dtype, keep_quantized: bool) -> LoadedEncoder:
    checkpoint = path if isinstance(path, Checkpoint) else open_checkpoint(path, spec.component)
    loaded = load_checkpoint(spec, checkpoint, dtype, keep_quantized=keep_quantized)
    return LoadedEncoder(loaded.module, loaded.config, checkpoint, loaded.description)


def text_encoder_kind(path: str | Path) -> str:
    """ "t5" or "clip" for a text-encoder file or folder, from its key names alone (nothing is read)."""
    for kind, spec in (("t5", T5_SPEC), ("clip", CLIP_SPEC)):
        checkpoint = open_checkpoint(path, spec.component)
        try:
            plan_checkpoint(spec, checkpoint)
            return kind
        except Flux2Error:
            continue
    raise Flux2Error(
        f"{Path(path).name} is neither T5-XXL nor CLIP-L: FLUX.1 Fill [dev] takes {T5_FILE} and {CLIP_FILE}"
    )
