"""The Qwen3 text encoder of FLUX.2 [klein]: prompts -> [B, 512, 3*E] conditioning (spec section 5).

Qwen3-4B (klein 4B) or Qwen3-8B (klein 9B) runs through ``transformers.Qwen3Model`` cut to its first 27
decoder layers, with its padding mask. Each token's conditioning is ``[h9 | h18 | h27]``; ``hidden_states[0]``
is the embedding output, so these are the raw residual streams after 0-based layers 8, 17 and 26, WITHOUT the
final norm (replaced by an identity: transformers would otherwise hand back the normed stream as the last
hidden state). Pads stay in. Every dimension is read from tensor shapes, so the real models and a tiny test
model load through the same code; the named presets only put a name on what a file holds.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .checkpoint import Checkpoint, load_into, open_checkpoint, reject_quantized, strip_prefix
from .errors import Flux2Error
from .tokenizer import (
    TextTokenizer,
    builtin_tokenizer,
    find_tokenizer_folder,
    load_tokenizer,
    tokenize_prompts,
)

log = logging.getLogger(__name__)

# hidden_states indices (0 = embeddings): the residual stream after 9, 18 and 27 layers (BFL, diffusers).
QWEN3_HIDDEN_LAYERS = (9, 18, 27)
NUM_LAYERS_RUN = max(QWEN3_HIDDEN_LAYERS)  # the last 9 of Qwen3's 36 layers never influence the output

# Prefixes of the text encoder inside ComfyUI all-in-one checkpoints.
ALL_IN_ONE_PREFIXES = ("text_encoders.qwen3_4b.transformer.", "text_encoders.qwen3_8b.transformer.")
_LAYER_KEY = re.compile(r"^layers\.(\d+)\.")


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
    for name, preset in QWEN3_PRESETS.items():
        if preset == shape:
            return name
    return (
        f"Qwen3 ({shape.hidden_size} wide, {shape.num_layers} layers, {shape.num_heads}/{shape.num_kv_heads} "
        f"heads of {shape.head_dim}, MLP {shape.intermediate_size}, vocab {shape.vocab_size})"
    )


class TextEncoder:
    """A Qwen3 cut to 27 layers plus its tokenizer: prompts -> [B, 512, 3*E] in the model dtype and device."""

    def __init__(self, model: torch.nn.Module, tokenizer: TextTokenizer, shape: Qwen3Shape):
        self.model = model  # transformers Qwen3Model, 27 layers, norm = Identity
        self.tokenizer = tokenizer
        self.shape = shape

    @property
    def output_dim(self) -> int:
        return self.shape.output_dim  # must equal the DiT's txt_in.weight.shape[1]

    @property
    def name(self) -> str:
        return describe_qwen3(self.shape)

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
        """Prompts -> [B, 512, 3*E]: per token [h9 | h18 | h27], pads included.

        ``interrupt`` is called before each decoder layer and may raise to stop.
        """
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts:
            raise Flux2Error(
                "no prompt to encode: give at least one prompt (an empty string is a valid prompt)"
            )
        input_ids, attention_mask = tokenize_prompts(self.tokenizer, prompts)  # [B, 512] each
        hooks = []
        if interrupt is not None:
            hooks = [layer.register_forward_pre_hook(lambda *_: interrupt()) for layer in self.model.layers]
        try:
            out = self.model(
                input_ids=input_ids.to(self.device),
                attention_mask=attention_mask.to(self.device),
                output_hidden_states=True,
                use_cache=False,
            )
        finally:
            for hook in hooks:
                hook.remove()
        hidden = out.hidden_states  # 28 x [B, 512, E]; [27] is raw because the final norm is an identity
        return torch.cat([hidden[i] for i in QWEN3_HIDDEN_LAYERS], dim=-1)


def load_text_encoder(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    tokenizer_path: str | Path | None = None,
) -> TextEncoder:
    """Load Qwen3-4B/8B: a ComfyUI single file, an all-in-one file, an HF Qwen3 folder or a diffusers repo.

    The tokenizer is ``tokenizer_path`` if given, else a tokenizer folder beside the weights (HF / diffusers
    layout), else the built-in one.
    """
    ckpt = open_checkpoint(path, "text_encoder")
    tokenizer = load_tokenizer(tokenizer_path) if tokenizer_path is not None else _tokenizer_beside(ckpt)
    return text_encoder_from_state_dict(
        ckpt.tensors,
        dtype=dtype,
        device=device,
        tokenizer=tokenizer,
        config=ckpt.config,
        metadata=ckpt.metadata,
        what=ckpt.name,
    )


def text_encoder_from_state_dict(
    state_dict: dict[str, torch.Tensor],
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    tokenizer: TextTokenizer | None = None,
    config: dict | None = None,
    metadata: dict[str, str] | None = None,
    what: str = "the text encoder",
) -> TextEncoder:
    """Build the 27-layer encoder from Qwen3 tensors (HF key names, known prefixes) and load them strictly."""
    own = strip_prefix(state_dict, ALL_IN_ONE_PREFIXES)
    # An all-in-one header may describe a quantized DiT: judge the text encoder by its own tensors.
    reject_quantized(own, (metadata or {}) if own is state_dict else {}, what)
    tensors = qwen3_tensors(own, what)
    shape = qwen3_shape(tensors, config, what)
    # 1. Only what the 27 layers use: embeddings and layers 0..26. The final norm, layers 27+ and lm_head
    #    (already gone with the "model." prefix) are dropped on purpose.
    wanted = {
        k: v
        for k, v in tensors.items()
        if k == "embed_tokens.weight" or ((m := _LAYER_KEY.match(k)) and int(m.group(1)) < NUM_LAYERS_RUN)
    }
    not_float = [k for k, v in wanted.items() if not v.is_floating_point()]
    if not_float:
        raise Flux2Error(
            f"{what} stores {not_float[0]} as {wanted[not_float[0]].dtype}: it is a quantized file this "
            "version cannot load; use the bf16 or fp32 .safetensors release of the text encoder"
        )
    # 2. Meta build, strict assign in the target dtype, real RoPE tables (a non-persistent fp32 buffer).
    model = build_qwen3(shape)
    load_into(model, {k: v.to(dtype) for k, v in wanted.items()}, f"{what} ({describe_qwen3(shape)})")
    _materialize_rotary(model)
    model.requires_grad_(False).eval().to(device)
    log.info(
        "loaded %s from %s: %d of %d layers, %s",
        describe_qwen3(shape),
        what,
        NUM_LAYERS_RUN,
        shape.num_layers,
        dtype,
    )
    return TextEncoder(model, tokenizer if tokenizer is not None else builtin_tokenizer(), shape)


def build_qwen3(shape: Qwen3Shape, num_layers: int = NUM_LAYERS_RUN) -> torch.nn.Module:
    """A ``transformers.Qwen3Model`` of ``num_layers`` layers on the meta device; final norm = Identity."""
    from transformers import Qwen3Config, Qwen3Model

    config = Qwen3Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        rope_theta=shape.rope_theta,
        rms_norm_eps=shape.rms_norm_eps,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        attention_bias=False,
        use_cache=False,
        attn_implementation="sdpa",
    )
    with torch.device("meta"):
        model = Qwen3Model(config)
    model.norm = torch.nn.Identity()  # h27 must be the raw residual stream, not the final-norm output
    return model


def qwen3_tensors(state_dict: dict[str, torch.Tensor], what: str) -> dict[str, torch.Tensor]:
    """Strip known prefixes to Qwen3Model names (``embed_tokens.weight``, ``layers.N...``) or say why not."""
    tensors = strip_prefix(state_dict, ALL_IN_ONE_PREFIXES)
    keys = list(tensors)
    if any(
        k.startswith(("model.language_model.", "language_model.", "model.visual.", "visual.")) for k in keys
    ):
        raise Flux2Error(
            f"{what} is a Qwen3-VL (vision-language) model; FLUX.2 [klein] was trained with the text-only "
            "Qwen3-4B (klein 4B) or Qwen3-8B (klein 9B): use qwen_3_4b.safetensors / qwen_3_8b.safetensors"
        )
    other = sorted({k.split(".")[1] for k in keys if k.startswith("text_encoders.")})
    if other:
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
    tensors = strip_prefix(tensors, ("model.",))
    if "embed_tokens.weight" not in tensors or not any(_LAYER_KEY.match(k) for k in tensors):
        raise Flux2Error(
            f"{what} is not a language-model text encoder (no embed_tokens / layers tensors): choose the "
            "Qwen3-4B (klein 4B) or Qwen3-8B (klein 9B) text encoder file"
        )
    if "layers.0.self_attn.q_norm.weight" not in tensors:
        raise Flux2Error(
            f"{what} is not a Qwen3 model (no q_norm/k_norm, as in Qwen2.5, Llama or Mistral files): "
            "FLUX.2 [klein] needs Qwen3-4B (klein 4B) or Qwen3-8B (klein 9B), e.g. qwen_3_4b.safetensors"
        )
    return tensors


def qwen3_shape(tensors: dict[str, torch.Tensor], config: dict | None, what: str) -> Qwen3Shape:
    """Read every dimension from the tensor shapes; config.json only supplies rope_theta and rms_norm_eps."""
    vocab_size, hidden_size = tensors["embed_tokens.weight"].shape
    num_layers = 1 + max(int(m.group(1)) for k in tensors if (m := _LAYER_KEY.match(k)))
    if num_layers < NUM_LAYERS_RUN:
        raise Flux2Error(
            f"{what} has only {num_layers} decoder layers; FLUX.2 [klein] reads hidden states after layer "
            f"{NUM_LAYERS_RUN}: use the complete Qwen3-4B / Qwen3-8B text encoder (36 layers)"
        )
    attn = "layers.0.self_attn."
    head_dim = tensors[attn + "q_norm.weight"].shape[0]
    try:
        q_rows, k_rows = tensors[attn + "q_proj.weight"].shape[0], tensors[attn + "k_proj.weight"].shape[0]
        intermediate_size = tensors["layers.0.mlp.gate_proj.weight"].shape[0]
    except KeyError as e:
        raise Flux2Error(f"{what} lacks {e.args[0]}: the file is incomplete, download it again") from None
    if q_rows % head_dim or k_rows % head_dim:
        raise Flux2Error(
            f"{what}: q/k projections ({q_rows}, {k_rows} rows) are not whole heads of {head_dim}"
        )
    config = config or {}
    rope = config.get("rope_parameters") or {}  # transformers 5 nests rope_theta here
    return Qwen3Shape(
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=q_rows // head_dim,
        num_kv_heads=k_rows // head_dim,
        head_dim=head_dim,
        intermediate_size=intermediate_size,
        vocab_size=vocab_size,
        rope_theta=float(config.get("rope_theta") or rope.get("rope_theta") or 1_000_000.0),
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
