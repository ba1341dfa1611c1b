"""Qwen3, klein's text encoder: Qwen3-4B (klein 4B) or Qwen3-8B (klein 9B) through ``transformers.Qwen3Model``
cut to its first 27 decoder layers. Each token's conditioning is ``[h9 | h18 | h27]``; ``hidden_states[0]``
is the embedding output, so these are the raw residual streams after 0-based layers 8, 17 and 26, WITHOUT
the final norm (replaced by an identity: transformers would otherwise hand back the normed stream as the
last hidden state). Every dimension is read from tensor shapes, so the real models and a tiny test model
load through the same code; the named presets only put a name on what a file holds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..configs import FLUX2, preset_name
from ..errors import Flux2Error
from ..weights.checkpoint import Checkpoint
from ..weights.keymaps import QWEN3, QWEN3_ALL_IN_ONE_PREFIXES, QWEN3_PREFIXES
from ..weights.plan import ComponentSpec, block_count, plan_checkpoint, read_config
from .decoder import LAYER_KEY, attention_sizes, build_decoder, layers_wanted, rope_theta
from .tokenizer import (
    NUM_BPE_TOKENS,
    PAD_TOKEN_ID,
    QWEN_ADDED_TOKENS,
    QWEN_CHAT_TEMPLATE,
    PromptSpec,
    TextTokenizer,
    builtin_tokenizer,
    find_tokenizer_folder,
    load_tokenizer,
)

# The residual stream after 9, 18 and 27 layers (BFL, diffusers): the last 9 of Qwen3's 36 layers never run.
KLEIN_QWEN3 = PromptSpec((9, 18, 27), FLUX2.max_text_tokens, QWEN_CHAT_TEMPLATE, PAD_TOKEN_ID)


QWEN3_HIDDEN_LAYERS = KLEIN_QWEN3.hidden_layers


NUM_LAYERS_RUN = KLEIN_QWEN3.layers_run


_LAYER_KEY = LAYER_KEY


QWEN_VOCAB_SIZE = NUM_BPE_TOKENS + len(QWEN_ADDED_TOKENS)  # 151669: every id the tokenizer can give


@dataclass(frozen=True)
class Qwen3Shape:
    """Architecture of a Qwen3 decoder, as read from its tensors (plus rope/eps from config.json if any)."""

    hidden_size: int  # E
    num_layers: int  # decoder layers stored in the file; only the first 27 are run
    num_heads: int
    num_kv_heads: int  # grouped-query attention
    head_dim: int
    intermediate_size: int
    vocab_size: int = 151936
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6

    @property
    def output_dim(self) -> int:
        return len(QWEN3_HIDDEN_LAYERS) * self.hidden_size


QWEN3_4B = Qwen3Shape(
    hidden_size=2560, num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=9728
)


QWEN3_8B = Qwen3Shape(
    hidden_size=4096, num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=12288
)


QWEN3_PRESETS = {"Qwen3-4B": QWEN3_4B, "Qwen3-8B": QWEN3_8B}


def describe_qwen3(shape: Qwen3Shape) -> str:
    """The preset name ("Qwen3-4B"), or a description of any other shape (e.g. a test model)."""
    return preset_name(QWEN3_PRESETS, shape) or (
        f"Qwen3 ({shape.hidden_size} wide, {shape.num_layers} layers, {shape.num_heads}/{shape.num_kv_heads} "
        f"heads of {shape.head_dim}, MLP {shape.intermediate_size}, vocab {shape.vocab_size})"
    )


def read_qwen3_shape(state_dict: dict[str, torch.Tensor], what: str = "the text encoder") -> Qwen3Shape:
    """The Qwen3 shape of in-memory tensors (any accepted naming; meta tensors too), reading no data."""
    checkpoint = Checkpoint(Path(what), state_dict)
    return read_config(QWEN3_SPEC, plan_checkpoint(QWEN3_SPEC, checkpoint).shapes, checkpoint)


def build_qwen3(shape: Qwen3Shape, num_layers: int = NUM_LAYERS_RUN) -> torch.nn.Module:
    """A ``transformers.Qwen3Model`` of ``num_layers`` layers on the meta device; final norm = Identity."""
    # transformers takes seconds to import: only when a model is built
    from transformers import Qwen3Config, Qwen3Model

    extra = dict(max_position_embeddings=40960, attention_bias=False)
    return build_decoder(Qwen3Config, Qwen3Model, shape, num_layers, **extra)  # h27: the raw stream


def identify_qwen3(names: dict[str, str], checkpoint: Checkpoint) -> None:
    """Raise a clear error unless the (prefix-stripped) keys are those of a Qwen3 language model."""
    files, keys, what = list(checkpoint.tensors), list(names), checkpoint.name
    if any(
        k.startswith(("model.language_model.", "language_model.", "model.visual.", "visual.")) for k in keys
    ):
        raise Flux2Error(
            f"{what} is a Qwen3-VL (vision-language) model; FLUX.2 [klein] was trained with the text-only "
            "Qwen3-4B (klein 4B) or Qwen3-8B (klein 9B): use qwen_3_4b.safetensors / qwen_3_8b.safetensors"
        )
    other = sorted(
        {k.split(".")[1] for k in files if k.startswith("text_encoders.")} - {"qwen3_4b", "qwen3_8b"}
    )
    if other and not any(k.startswith(QWEN3_ALL_IN_ONE_PREFIXES) for k in files):
        raise Flux2Error(
            f"{what} is an all-in-one checkpoint whose text encoder is {', '.join(other)}, not Qwen3-4B/8B: "
            "choose the Qwen3 text encoder that matches the klein model"
        )
    dit = re.compile(r"(double_blocks|single_blocks|transformer_blocks)\.\d+\.|img_in\.|x_embedder\.")
    if any(dit.search(k) for k in keys):
        raise Flux2Error(
            f"{what} is a diffusion model (DiT), not a text encoder: load it with the model loader and "
            "choose the Qwen3 text encoder file (e.g. qwen_3_4b.safetensors) here"
        )
    flux1 = "T5-XXL" if any(k.startswith(("encoder.block.", "shared.")) for k in keys) else None
    if flux1 is None and any(k.startswith(("text_model.", "embeddings.token_embedding")) for k in keys):
        flux1 = "CLIP-L"
    if flux1 is not None:
        raise Flux2Error(
            f"{what} is {flux1}, a FLUX.1 text encoder (for FLUX.1 Fill [dev]'s text encoder loader), not a "
            "FLUX.2 one: FLUX.2 models read Qwen3 (klein 4B: qwen_3_4b.safetensors, klein 9B: "
            "qwen_3_8b.safetensors) or Mistral Small 3.x (dev: mistral_3_small_flux2_bf16.safetensors)"
        )
    if "embed_tokens.weight" not in names or not any(_LAYER_KEY.match(k) for k in keys):
        raise Flux2Error(
            f"{what} is not a language-model text encoder (no embed_tokens / layers tensors): choose the "
            "Qwen3-4B (klein 4B) or Qwen3-8B (klein 9B) text encoder file, or Mistral Small 3.x for dev"
        )
    if "layers.0.self_attn.q_norm.weight" not in names:
        raise Flux2Error(
            f"{what} is not a Qwen3 model (no q_norm/k_norm, as in Qwen2.5, Llama or Mistral files): "
            "FLUX.2 [klein] needs Qwen3-4B (klein 4B) or Qwen3-8B (klein 9B), e.g. qwen_3_4b.safetensors"
        )


def qwen3_shape(shapes: dict[str, tuple[int, ...]], config: dict | None, what: str) -> Qwen3Shape:
    """Read every dimension from the tensor shapes; config.json only supplies rope_theta and rms_norm_eps.

    ``num_layers`` is the file's layer count, read from its keys before the unused layers are dropped.
    """
    vocab_size, hidden_size = shapes["embed_tokens.weight"]
    if vocab_size < QWEN_VOCAB_SIZE:
        raise Flux2Error(
            f"{what} has {vocab_size} token embeddings, fewer than the {QWEN_VOCAB_SIZE} ids the Qwen "
            "tokenizer gives (151643 BPE tokens + 26 added ones): it is not the Qwen3 text encoder FLUX.2 "
            "[klein] needs"
        )
    num_layers = block_count(shapes, "layers.", "decoder layers", what)
    if num_layers < NUM_LAYERS_RUN:
        raise Flux2Error(
            f"{what} has only {num_layers} decoder layers; FLUX.2 [klein] reads hidden states after layer "
            f"{NUM_LAYERS_RUN}: use the complete Qwen3-4B / Qwen3-8B text encoder (36 layers)"
        )
    head_dim = shapes["layers.0.self_attn.q_norm.weight"][0]
    num_heads, num_kv_heads, intermediate_size = attention_sizes(shapes, head_dim, what)
    config = config or {}
    return Qwen3Shape(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        rope_theta=rope_theta(config, 1_000_000.0),
        rms_norm_eps=float(config.get("rms_norm_eps") or 1e-6),
    )


def tokenizer_beside(ckpt: Checkpoint) -> TextTokenizer:
    # Folders (HF Qwen3 repo, diffusers repo/text_encoder) may hold a tokenizer; a lone ComfyUI file does not,
    # and its models/text_encoders/ folder is only searched when laid out as an HF folder (config.json).
    if ckpt.folder is None or not (ckpt.path.is_dir() or (ckpt.folder / "config.json").is_file()):
        return builtin_tokenizer()
    found = find_tokenizer_folder(ckpt.folder)
    return load_tokenizer(found) if found is not None else builtin_tokenizer()


QWEN3_SPEC = ComponentSpec(
    what="text encoder",
    component="text_encoder",
    keymap=QWEN3,
    config=lambda shapes, checkpoint: qwen3_shape(shapes, checkpoint.config, checkpoint.name),
    build=build_qwen3,
    describe=describe_qwen3,
    prefixes=(QWEN3_ALL_IN_ONE_PREFIXES, QWEN3_PREFIXES),
    identify=identify_qwen3,
    wanted=layers_wanted(NUM_LAYERS_RUN),
)
