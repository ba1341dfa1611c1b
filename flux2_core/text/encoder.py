"""Text encoders of FLUX.2: prompts -> [B, 512, 3*E] conditioning.

klein: Qwen3-4B (klein 4B) or Qwen3-8B (klein 9B) runs through ``transformers.Qwen3Model`` cut to its first 27
decoder layers, with its padding mask. Each token's conditioning is ``[h9 | h18 | h27]``; ``hidden_states[0]``
is the embedding output, so these are the raw residual streams after 0-based layers 8, 17 and 26, WITHOUT the
final norm (replaced by an identity: transformers would otherwise hand back the normed stream as the last
hidden state). Pads stay in. dev: Mistral Small 3.x cut to 30 layers, ``[h10 | h20 | h30]`` (``mistral.py``).
``load_text_encoder`` tells the two apart from the file's keys and shapes. Every dimension is read from tensor
shapes, so the real models and a tiny test model load through the same code; the named presets only put a
name on what a file holds.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..configs import FLUX2, preset_name
from ..errors import Flux2Error
from ..hooks import before_each, calling
from ..lora import TE, patched
from ..weights.checkpoint import Checkpoint, open_checkpoint
from ..weights.keymaps import QWEN3, QWEN3_ALL_IN_ONE_PREFIXES, QWEN3_PREFIXES
from ..weights.loading import ComponentSpec, block_count, load_checkpoint, plan_checkpoint, read_config
from .decoder import LAYER_KEY, attention_sizes, build_decoder, layers_wanted, rope_theta
from .mistral import MISTRAL_SPEC, MistralShape, builtin_tekken, describe_mistral, is_mistral, mistral_prompt
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
    tokenize_prompts,
)

log = logging.getLogger(__name__)


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


class TextEncoder:
    """A language model cut to its last tapped layer plus its tokenizer: prompts -> [B, 512, 3*E] in the model
    dtype and device (Qwen3 for klein with ``KLEIN_QWEN3``, Mistral for dev with ``mistral.DEV_MISTRAL``)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: TextTokenizer,
        shape: Qwen3Shape | MistralShape,
        spec: PromptSpec = KLEIN_QWEN3,
    ):
        self.model = model  # transformers Qwen3Model (27 layers) / MistralModel (30), norm = Identity
        self.tokenizer = tokenizer
        self.shape = shape
        self.spec = spec
        self.loras: tuple = ()  # lora.Lora objects whose text-encoder part applies while encoding

    def with_lora(self, lora) -> TextEncoder:
        """The same encoder (its weights shared) with ``lora``'s text-encoder part added after the others."""
        other = copy.copy(self)
        other.loras = (*self.loras, lora)
        return other

    @property
    def output_dim(self) -> int:
        return self.shape.output_dim  # must equal the DiT's txt_in.weight.shape[1]

    @property
    def name(self) -> str:
        return (
            describe_mistral(self.shape)
            if isinstance(self.shape, MistralShape)
            else describe_qwen3(self.shape)
        )

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    def to(self, device: torch.device | str) -> TextEncoder:
        self.model.to(device)  # moves only: the weights keep their dtype and RoPE keeps fp32
        return self

    @torch.no_grad()
    def encode(self, prompts: list[str] | str, interrupt: Callable[[], None] | None = None) -> torch.Tensor:
        """Prompts -> [B, 512, 3*E]: per token the chosen hidden states ([h9 | h18 | h27] for klein), pads
        included.

        ``interrupt`` is called before each decoder layer and may raise to stop.
        """
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts:
            raise Flux2Error(
                "no prompt to encode: give at least one prompt (an empty string is a valid prompt)"
            )
        spec = self.spec
        input_ids, attention_mask = tokenize_prompts(
            self.tokenizer,
            [spec.prepare(p) for p in prompts],
            spec.max_tokens,
            spec.template,
            spec.pad_id,
            spec.padding_side,
        )  # [B, 512] each
        with before_each(self.model.layers, calling(interrupt)), patched(self.model, TE, self.loras):
            out = self.model(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                output_hidden_states=True,
                use_cache=False,
            )
        hidden = out.hidden_states  # layers_run + 1 tensors [B, 512, E]; the last is raw (norm = identity)
        return torch.cat([hidden[i] for i in spec.hidden_layers], dim=-1)


def load_text_encoder(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    tokenizer_path: str | Path | None = None,
    keep_quantized: bool = True,
) -> TextEncoder:
    """Load Qwen3-4B/8B (klein) or Mistral Small 3.x (dev), told apart by the file's keys and shapes.

    Qwen3: a ComfyUI single file (bf16, fp8mixed, ...), an all-in-one file, an HF Qwen3 folder, a diffusers
    repo or a llama.cpp GGUF. Mistral: the dev repo's ``text_encoder/`` (Mistral3 weights; the vision tower
    and ``lm_head`` are not read) or ComfyUI's ``mistral_3_small_flux2_*.safetensors`` (bf16, fp8). Quantised
    layers stay quantised unless ``keep_quantized`` is off. The tokenizer is ``tokenizer_path`` if given, else
    (Mistral) the one a ComfyUI file embeds, else a tokenizer folder beside the weights (HF / diffusers
    layout), else the built-in one.
    """
    ckpt = open_checkpoint(path, "text_encoder")
    spec = text_encoder_spec(ckpt)
    if spec is MISTRAL_SPEC:
        tokenizer, prompt = mistral_prompt(ckpt, tokenizer_path)
    else:
        tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path is not None else _tokenizer_beside(ckpt)
        prompt = KLEIN_QWEN3
    loaded = load_checkpoint(spec, ckpt, dtype, keep_quantized=keep_quantized)
    return _finish(loaded, tokenizer, device, prompt)


def text_encoder_spec(checkpoint: Checkpoint) -> ComponentSpec:
    """The loading spec of an opened text-encoder checkpoint: ``MISTRAL_SPEC`` or ``QWEN3_SPEC``."""
    return MISTRAL_SPEC if is_mistral(checkpoint) else QWEN3_SPEC


def text_encoder_spec_for(path: str | Path) -> ComponentSpec:
    """The loading spec of the text encoder at ``path``, from its headers alone, for ``weight_bytes``:
    ``spec = text_encoder_spec_for(p); shape, nbytes, _ = weight_bytes(spec, p, dtype)``; then
    ``shape.output_dim`` and ``spec.describe(shape)`` serve the width check before anything is loaded."""
    return text_encoder_spec(open_checkpoint(path, "text_encoder"))


def text_encoder_from_state_dict(
    state_dict: dict[str, torch.Tensor],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    tokenizer: TextTokenizer | None = None,
    config: dict | None = None,
    metadata: dict[str, str] | None = None,
    what: str = "the text encoder",
) -> TextEncoder:
    """Build the encoder from in-memory Qwen3 or Mistral tensors (HF key names, known prefixes)."""
    ckpt = Checkpoint(Path(what), state_dict, metadata or {}, config)
    spec = text_encoder_spec(ckpt)
    prompt = KLEIN_QWEN3
    if spec is MISTRAL_SPEC:
        builtin, prompt = mistral_prompt(ckpt, None)
        tokenizer = tokenizer or builtin
    return _finish(load_checkpoint(spec, ckpt, dtype), tokenizer, device, prompt)


def read_qwen3_shape(state_dict: dict[str, torch.Tensor], what: str = "the text encoder") -> Qwen3Shape:
    """The Qwen3 shape of in-memory tensors (any accepted naming; meta tensors too), reading no data."""
    checkpoint = Checkpoint(Path(what), state_dict)
    return read_config(QWEN3_SPEC, plan_checkpoint(QWEN3_SPEC, checkpoint)[1], checkpoint)


def _finish(loaded, tokenizer: TextTokenizer | None, device, prompt: PromptSpec) -> TextEncoder:
    model, shape = loaded.module, loaded.config
    _materialize_rotary(model)
    model.to(device)
    log.info("%s: %d of %d decoder layers built", loaded.description, prompt.layers_run, shape.num_layers)
    if tokenizer is None:
        tokenizer = builtin_tekken() if isinstance(shape, MistralShape) else builtin_tokenizer()
    return TextEncoder(model, tokenizer, shape, prompt)


def build_qwen3(shape: Qwen3Shape, num_layers: int = NUM_LAYERS_RUN) -> torch.nn.Module:
    """A ``transformers.Qwen3Model`` of ``num_layers`` layers on the meta device; final norm = Identity."""
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


def _materialize_rotary(model: torch.nn.Module) -> None:
    # inv_freq is a non-persistent buffer, in no file, so the meta build left it empty. Rebuild it on CPU; it
    # stays fp32 whatever the weights' dtype, as with transformers' from_pretrained.
    rotary_cls = type(model.rotary_emb)
    model.rotary_emb = rotary_cls(config=model.config)


def _tokenizer_beside(ckpt: Checkpoint) -> TextTokenizer:
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
