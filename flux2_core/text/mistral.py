"""Mistral Small 3.x, the text encoder of FLUX.2 [dev]: its files, shape, 30-layer model and tokenizer.

dev conditions on the language model of Mistral-Small-3.2-24B-Instruct-2506: each token's
conditioning is ``[h10 | h20 | h30]``, the raw residual streams after 0-based layers 9, 19 and 29 (no final
norm), 3 x 5120 = 15360 wide. Only the embedding and layers 0-29 are built and run: a ``transformers``
``MistralModel`` of 30 layers whose final norm is an identity. The vision tower, projector, ``lm_head`` and
layers 30-39 are never read. Every size is read from the tensors; ``head_dim`` (not derivable from shapes,
since 32 heads x 128 != 5120) comes from ``config.json`` when there is one, else it is Mistral Small's 128.

Prompts: the BFL/diffusers template with its system message (``tekken.MISTRAL_TEMPLATE``), ``[IMG]`` deleted
from the prompt, 512 tokens, cut at the end. Padding side: what the model's tokenizer folder says
(``tokenizer_config.json`` ``padding_side``) when it says it, else **right**. Right padding is the default of
transformers' Tekken tokenizer (``TokenizersBackend``; its mistral-common backend, picked when that package is
installed and a folder holds only tekken.json, pads left, so diffusers' own choice depends on the
environment) and leaves nothing open: real tokens are the same either way (RoPE is relative), but left pads
are query rows with every key masked, whose states depend on the attention backend (sdpa and eager differ
there) and still reach the DiT. A folder that asks for left padding gets it, with
transformers' sdpa behaviour for those rows, which is what diffusers computes in the same environment.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..configs import FLUX2, preset_name
from ..errors import Flux2Error
from ..weights.checkpoint import Checkpoint, tensor_shape
from ..weights.keymaps import MISTRAL, MISTRAL_PREFIXES, strip_prefix
from ..weights.plan import ComponentSpec, block_count
from .decoder import LAYER_KEY, attention_sizes, build_decoder, layers_wanted, rope_theta
from .tekken import (
    MISTRAL_TEMPLATE,
    PAD_ID,
    TEKKEN_VOCAB_SIZE,
    TEMPLATE_CONTROLS,
    builtin_tekken,
    tekken_from_json,
)
from .tokenizer import HFTokenizer, PromptSpec, TextTokenizer

DEV_MISTRAL = PromptSpec((10, 20, 30), FLUX2.max_text_tokens, MISTRAL_TEMPLATE, PAD_ID, removed=("[IMG]",))
MISTRAL_HIDDEN_LAYERS = DEV_MISTRAL.hidden_layers
MISTRAL_LAYERS_RUN = DEV_MISTRAL.layers_run
DEFAULT_HEAD_DIM = 128  # Mistral Small 3.x; only used when no config.json says otherwise
MISTRAL_WIDTH = 5120
TEKKEN_TENSOR = "tekken_model"  # ComfyUI's single files carry tekken.json's bytes as this uint8 tensor
_LAYER_KEY = LAYER_KEY
_PROBE = ("".join(TEMPLATE_CONTROLS), list(TEMPLATE_CONTROLS.values()))


@dataclass(frozen=True)
class MistralShape:
    """Architecture of a Mistral decoder, read from its tensors (plus rope/eps/head_dim from config.json)."""

    hidden_size: int  # E
    num_layers: int  # decoder layers stored in the file (40, or 30 in ComfyUI's pruned file); 30 run
    num_heads: int
    num_kv_heads: int  # grouped-query attention
    head_dim: int
    intermediate_size: int
    vocab_size: int = TEKKEN_VOCAB_SIZE
    rope_theta: float = 1_000_000_000.0
    rms_norm_eps: float = 1e-5

    @property
    def output_dim(self) -> int:
        return len(MISTRAL_HIDDEN_LAYERS) * self.hidden_size


MISTRAL_SMALL_24B = MistralShape(
    hidden_size=MISTRAL_WIDTH,
    num_layers=40,
    num_heads=32,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=32768,
)
MISTRAL_PRESETS = {"Mistral-Small-3.2-24B": MISTRAL_SMALL_24B}  # 3.1 has the same shapes


def describe_mistral(shape: MistralShape) -> str:
    """The preset name ("Mistral-Small-3.2-24B", noting a pruned file), or a description of another shape."""
    name = preset_name(MISTRAL_PRESETS, replace(shape, num_layers=MISTRAL_SMALL_24B.num_layers))
    if name is not None:
        return (
            name
            if shape.num_layers == MISTRAL_SMALL_24B.num_layers
            else f"{name} ({shape.num_layers} layers)"
        )
    return (
        f"Mistral ({shape.hidden_size} wide, {shape.num_layers} layers, "
        f"{shape.num_heads}/{shape.num_kv_heads} heads of {shape.head_dim}, MLP {shape.intermediate_size}, "
        f"vocab {shape.vocab_size})"
    )


def build_mistral(shape: MistralShape, num_layers: int = MISTRAL_LAYERS_RUN) -> torch.nn.Module:
    """A ``transformers.MistralModel`` of ``num_layers`` layers on the meta device; final norm = Identity."""
    # transformers takes seconds to import: only when a model is built
    from transformers import MistralConfig, MistralModel

    extra = dict(max_position_embeddings=131072, sliding_window=None)
    return build_decoder(MistralConfig, MistralModel, shape, num_layers, **extra)  # h30: the raw stream


def is_mistral(checkpoint: Checkpoint) -> bool:
    """Whether a text-encoder checkpoint is Mistral (else it is taken as Qwen3): a decoder without Qwen3's
    q_norm that carries a Tekken tokenizer, says it is Mistral, or has the Tekken vocabulary or Mistral
    Small's width."""
    names = strip_prefix(checkpoint.tensors, MISTRAL_PREFIXES)
    if "layers.0.self_attn.q_norm.weight" in names or "layers.0.post_attention_layernorm.weight" not in names:
        return False
    if TEKKEN_TENSOR in checkpoint.tensors or _text_config(checkpoint.config).get("model_type") == "mistral":
        return True
    embed = names.get("embed_tokens.weight")
    rows, width = tensor_shape(checkpoint.tensors, embed) if embed is not None else (0, 0)
    return rows == TEKKEN_VOCAB_SIZE or width == MISTRAL_WIDTH


def identify_mistral(names: dict[str, str], checkpoint: Checkpoint) -> None:
    """Raise a clear error unless the (prefix-stripped) keys are those of a Mistral language model."""
    keys, what = list(names), checkpoint.name
    dit = re.compile(r"(double_blocks|single_blocks|transformer_blocks)\.\d+\.|img_in\.|x_embedder\.")
    if any(dit.search(k) for k in keys):
        raise Flux2Error(
            f"{what} is a diffusion model (DiT), not a text encoder: load it with the model loader and "
            "choose the Mistral text encoder file (e.g. mistral_3_small_flux2_bf16.safetensors) here"
        )
    if "embed_tokens.weight" not in names or not any(_LAYER_KEY.match(k) for k in keys):
        raise Flux2Error(
            f"{what} is not a language-model text encoder (no embed_tokens / layers tensors): choose the "
            "Mistral-Small-3.2-24B text encoder (FLUX.2 [dev]) or Qwen3-4B / Qwen3-8B (klein)"
        )
    if "layers.0.self_attn.q_norm.weight" in names:
        raise Flux2Error(
            f"{what} is a Qwen3 model, the text encoder of FLUX.2 [klein]; FLUX.2 [dev] needs "
            "Mistral-Small-3.2-24B (mistral_3_small_flux2_bf16.safetensors)"
        )
    if any(_LAYER_KEY.match(k) and k.endswith(".bias") for k in keys):
        raise Flux2Error(
            f"{what} has attention biases (a Qwen2 / Qwen2.5 model), which Mistral has not: FLUX.2 [dev] "
            "needs Mistral-Small-3.2-24B (mistral_3_small_flux2_bf16.safetensors)"
        )


def mistral_shape(shapes: dict[str, tuple[int, ...]], config: dict | None, what: str) -> MistralShape:
    """Every size from the tensor shapes; config.json (its ``text_config`` for Mistral3 folders) supplies
    head_dim, rope_theta and rms_norm_eps. ``num_layers`` is the file's count, before layers are dropped."""
    vocab_size, hidden_size = shapes["embed_tokens.weight"]
    if vocab_size < TEKKEN_VOCAB_SIZE:
        raise Flux2Error(
            f"{what} has {vocab_size} token embeddings, fewer than the {TEKKEN_VOCAB_SIZE} ids of the Tekken "
            "tokenizer: it is not the Mistral Small text encoder FLUX.2 [dev] needs"
        )
    num_layers = block_count(shapes, "layers.", "decoder layers", what)
    if num_layers < MISTRAL_LAYERS_RUN:
        raise Flux2Error(
            f"{what} has only {num_layers} decoder layers; FLUX.2 [dev] reads hidden states after layer "
            f"{MISTRAL_LAYERS_RUN}: use the complete Mistral-Small-3.2-24B text encoder (40 layers) or "
            "ComfyUI's 30-layer file"
        )
    text = _text_config(config)
    head_dim = int(text.get("head_dim") or DEFAULT_HEAD_DIM)
    source = "config.json" if text.get("head_dim") else "Mistral Small's, as there is no config.json"
    mismatch = (
        f" ({source}): the file is not Mistral Small; for another Mistral, load its HF folder with its "
    )
    mismatch += "config.json"
    num_heads, num_kv_heads, intermediate_size = attention_sizes(shapes, head_dim, what, mismatch)
    return MistralShape(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        rope_theta=rope_theta(text, 1_000_000_000.0),
        rms_norm_eps=float(text.get("rms_norm_eps") or 1e-5),
    )


def mistral_prompt(
    checkpoint: Checkpoint, tokenizer_path: str | Path | None
) -> tuple[TextTokenizer, PromptSpec]:
    """The tokenizer and prompt spec (with the padding side) for Mistral weights: ``tokenizer_path`` if given,
    else the tokenizer embedded in a ComfyUI file, else a tokenizer folder beside the weights (HF / diffusers
    layout), else the built-in one."""
    if tokenizer_path is not None:
        tokenizer, side = load_tekken_folder(Path(tokenizer_path).expanduser())
    elif TEKKEN_TENSOR in checkpoint.tensors:
        data, source = checkpoint.tensors[TEKKEN_TENSOR], f"{checkpoint.name} ({TEKKEN_TENSOR})"
        if data.dtype != torch.uint8:
            raise Flux2Error(
                f"{source} is {data.dtype}, not the uint8 bytes of a tekken.json: repair the file"
            )
        tokenizer, side = tekken_from_json(bytes(data.reshape(-1).numpy()), source), None
    else:
        found = _folder_beside(checkpoint)
        tokenizer, side = load_tekken_folder(found) if found is not None else (builtin_tekken(), None)
    return tokenizer, replace(DEV_MISTRAL, padding_side=side or DEV_MISTRAL.padding_side)


def load_tekken_folder(path: Path) -> tuple[TextTokenizer, str | None]:
    """A ``tekken.json`` file, or a folder holding ``tekken.json`` or ``tokenizer.json`` (or a ``tokenizer/``
    subfolder that does), with the padding side its ``tokenizer_config.json`` names (None if none)."""
    if path.is_file():
        return tekken_from_json(path.read_bytes(), str(path)), _padding_side(path.parent)
    for folder in (path, path / "tokenizer"):
        if (folder / "tekken.json").is_file():
            return tekken_from_json((folder / "tekken.json").read_bytes(), str(folder / "tekken.json")), (
                _padding_side(folder)
            )
        if (folder / "tokenizer.json").is_file():
            needed = "the Tekken tokenizer of Mistral Small 3.x that FLUX.2 [dev] needs"
            return HFTokenizer(folder, probe=_PROBE, needed=needed), _padding_side(folder)
    raise Flux2Error(
        f"{path} holds no Mistral tokenizer (tekken.json or tokenizer.json): point at the model's tokenizer "
        "folder, or give none to use the built-in Tekken tokenizer"
    )


def _folder_beside(checkpoint: Checkpoint) -> Path | None:
    # Folders (HF repo, diffusers repo/text_encoder) may hold a tokenizer (itself, tokenizer/, ../tokenizer);
    # a lone file in models/text_encoders/ does not, unless that folder is laid out as HF does (config.json).
    folder = checkpoint.folder
    if folder is None or not (checkpoint.path.is_dir() or (folder / "config.json").is_file()):
        return None
    for candidate in (folder, folder / "tokenizer", folder.parent / "tokenizer"):
        if (candidate / "tekken.json").is_file() or (candidate / "tokenizer.json").is_file():
            return candidate
    return None


def _padding_side(folder: Path) -> str | None:
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    try:
        side = json.loads(config.read_text(encoding="utf-8")).get("padding_side")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as e:
        raise Flux2Error(f"{config} is not valid JSON ({e}): repair or remove it") from None
    if side not in (None, "left", "right"):
        raise Flux2Error(f"{config} names padding_side {side!r}: it must be 'left' or 'right'")
    return side


def _text_config(config: dict | None) -> dict:
    config = config or {}
    text = config.get("text_config")
    return text if isinstance(text, dict) else config


MISTRAL_SPEC = ComponentSpec(
    what="text encoder",
    component="text_encoder",
    keymap=MISTRAL,
    config=lambda shapes, checkpoint: mistral_shape(shapes, checkpoint.config, checkpoint.name),
    build=build_mistral,
    describe=describe_mistral,
    prefixes=(MISTRAL_PREFIXES,),
    identify=identify_mistral,
    wanted=layers_wanted(MISTRAL_LAYERS_RUN),
)
