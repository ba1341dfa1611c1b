"""Text encoders of FLUX.2: prompts -> [B, 512, 3*E] conditioning.

klein reads Qwen3-4B / Qwen3-8B (``qwen3``: ``[h9 | h18 | h27]``), dev reads Mistral Small 3.x (``mistral``:
``[h10 | h20 | h30]``); both are decoder-only language models cut to their last tapped layer (``decoder``),
with their padding mask, pads kept. ``load_text_encoder`` tells the two apart from the file's keys and
shapes and returns one ``TextEncoder`` for either.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import Flux2Error
from ..hooks import before_each, calling
from ..lora import TE, patched
from ..weights.checkpoint import Checkpoint, open_checkpoint
from ..weights.loading import load_checkpoint
from ..weights.plan import ComponentSpec
from .mistral import MISTRAL_SPEC, MistralShape, builtin_tekken, describe_mistral, is_mistral, mistral_prompt
from .qwen3 import KLEIN_QWEN3, QWEN3_SPEC, Qwen3Shape, describe_qwen3, tokenizer_beside
from .tokenizer import (
    PromptSpec,
    TextTokenizer,
    builtin_tokenizer,
    load_tokenizer,
    tokenize_prompts,
)

log = logging.getLogger(__name__)


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
    quant_compute: str = "auto",
) -> TextEncoder:
    """Load Qwen3-4B/8B (klein) or Mistral Small 3.x (dev), told apart by the file's keys and shapes.

    Qwen3: a ComfyUI single file (bf16, fp8mixed, ...), an all-in-one file, an HF Qwen3 folder, a diffusers
    repo or a llama.cpp GGUF. Mistral: the dev repo's ``text_encoder/`` (Mistral3 weights; the vision tower
    and ``lm_head`` are not read) or ComfyUI's ``mistral_3_small_flux2_*.safetensors`` (bf16, fp8). Quantised
    layers stay quantised unless ``keep_quantized`` is off (how they multiply: ``quant_compute``, see
    ``weights.kitchen``). The tokenizer is ``tokenizer_path`` if given, else (Mistral) the one a ComfyUI file
    embeds, else a tokenizer folder beside the weights (HF / diffusers layout), else the built-in one.
    """
    ckpt = open_checkpoint(path, "text_encoder")
    spec = text_encoder_spec(ckpt)
    if spec is MISTRAL_SPEC:
        tokenizer, prompt = mistral_prompt(ckpt, tokenizer_path)
    else:
        tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path is not None else tokenizer_beside(ckpt)
        prompt = KLEIN_QWEN3
    loaded = load_checkpoint(spec, ckpt, dtype, keep_quantized=keep_quantized, quant_compute=quant_compute)
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


def _finish(loaded, tokenizer: TextTokenizer | None, device, prompt: PromptSpec) -> TextEncoder:
    model, shape = loaded.module, loaded.config
    _materialize_rotary(model)
    model.to(device)
    log.info("%s: %d of %d decoder layers built", loaded.description, prompt.layers_run, shape.num_layers)
    if tokenizer is None:
        tokenizer = builtin_tekken() if isinstance(shape, MistralShape) else builtin_tokenizer()
    return TextEncoder(model, tokenizer, shape, prompt)


def _materialize_rotary(model: torch.nn.Module) -> None:
    # inv_freq is a non-persistent buffer, in no file, so the meta build left it empty. Rebuild it on CPU; it
    # stays fp32 whatever the weights' dtype, as with transformers' from_pretrained.
    rotary_cls = type(model.rotary_emb)
    model.rotary_emb = rotary_cls(config=model.config)
