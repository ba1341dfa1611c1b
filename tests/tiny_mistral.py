"""Tiny random Mistral3 text encoders in real file layouts, reference Tekken tokenizers (test helper).

The model is transformers' own ``Mistral3ForConditionalGeneration`` (a Pixtral vision tower of
one layer, a projector and ``lm_head`` beside the language model) with 32 decoder layers, so hidden states
10/20/30 exist and two layers plus the final norm lie beyond the last tap, as in the real 40-layer model. The
vocabulary is the real 131072 rows, so every Tekken id has an embedding.

The reference tokenizer is transformers' own Tekken conversion (``convert_tekken_tokenizer``: a Rust
``tokenizers`` BPE over merges it derives, its own regex engine and added-token splitting) of a v7-style
``tekken.json`` written here: mistral-common's vocabulary plus the explicit 1000-entry control-token list of
Mistral's control tokens (mistral-common's tokens/tokenizers/tekken.py:
``Tekkenizer.DEPRECATED_SPECIAL_TOKENS`` for ids 0-19, ``SPECIAL_TOKEN_TEMPLATE`` for the rest), written out
here rather than taken from the product.
"""

from __future__ import annotations

import contextlib
import functools
import json
import tempfile
from importlib.resources import files
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Mistral3Config, Mistral3ForConditionalGeneration

# A tiny text model (hidden 16, 4 heads of 4, 2 KV heads, theta 1e9), with 32 layers (see above).
TINY_TEXT = dict(
    model_type="mistral",
    vocab_size=131072,
    hidden_size=16,
    intermediate_size=37,
    num_hidden_layers=32,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=4,
    rope_theta=1_000_000_000.0,
    rms_norm_eps=1e-5,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=11,
    sliding_window=None,
    tie_word_embeddings=False,
)
# For files without config.json (ComfyUI's): the loader then assumes Mistral Small's head_dim of 128.
TINY_TEXT_HEAD_128 = dict(TINY_TEXT, num_attention_heads=2, num_key_value_heads=1, head_dim=128)
TINY_VISION = dict(
    model_type="pixtral",
    hidden_size=16,
    num_hidden_layers=1,
    num_attention_heads=4,
    intermediate_size=37,
    image_size=30,
    patch_size=6,
)

# Tekken's control ids 0-19 by name (mistral-common's Tekkenizer.DEPRECATED_SPECIAL_TOKENS), 20-999 reserved
# (its SPECIAL_TOKEN_TEMPLATE).
CONTROL_TOKENS = (
    "<unk> <s> </s> [INST] [/INST] [AVAILABLE_TOOLS] [/AVAILABLE_TOOLS] [TOOL_RESULTS] [/TOOL_RESULTS] "
    "[TOOL_CALLS] [IMG] <pad> [IMG_BREAK] [IMG_END] [PREFIX] [MIDDLE] [SUFFIX] [SYSTEM_PROMPT] "
    "[/SYSTEM_PROMPT] [TOOL_CONTENT]"
).split() + [f"<SPECIAL_{i}>" for i in range(20, 1000)]

# What the Mistral-Small-3.1 chat template renders for a system and a user message of text blocks (the full
# template adds tools, images as [IMG] and assistant turns): bos, [SYSTEM_PROMPT]...[/SYSTEM_PROMPT],
# [INST]...[/INST].
MISTRAL_CHAT_TEMPLATE_EXCERPT = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- set ns = namespace(text='') %}"
    "{%- if message['content'] is string %}{%- set ns.text = message['content'] %}"
    "{%- else %}{%- for block in message['content'] %}"
    "{%- if block['type'] == 'text' %}{%- set ns.text = ns.text + block['text'] %}"
    "{%- else %}{%- set ns.text = ns.text + '[IMG]' %}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + ns.text + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{- '[INST]' + ns.text + '[/INST]' }}{%- endif %}"
    "{%- endfor %}"
)

MISTRAL_COMMON_TEKKEN = files("mistral_common") / "data" / "tekken_240911.json"


def make_tiny_mistral3(seed: int = 0, **text_overrides) -> Mistral3ForConditionalGeneration:
    """A random Mistral3 (fp32, eval). Norm weights are randomised too, so a wrong norm shows."""
    config = Mistral3Config(
        text_config={**TINY_TEXT, **text_overrides},
        vision_config=TINY_VISION,
        image_token_index=10,
        spatial_merge_size=1,
    )
    torch.manual_seed(seed)
    model = Mistral3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(torch.randn_like(p))
            elif p.ndim == 2:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    return model


def language_model(model: Mistral3ForConditionalGeneration):
    return model.model.language_model


def comfy_tensors(model: Mistral3ForConditionalGeneration, layers: int | None = None, lm_head: bool = True):
    """ComfyUI's single-file names: ``model.embed_tokens.weight``, ``model.layers.N...``, ``model.norm``.

    ``layers`` keeps only the first ones (ComfyUI's pruned file: 30 layers, no final norm).
    """
    out = {
        f"model.{k}": v.detach().clone().contiguous() for k, v in language_model(model).state_dict().items()
    }
    if layers is not None:
        out = {
            k: v for k, v in out.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers
        }
        out.pop("model.norm.weight")
    if lm_head:
        out["lm_head.weight"] = model.lm_head.weight.detach().clone()
    return out


def tekken_tensor(data: bytes) -> torch.Tensor:
    """tekken.json's bytes as ComfyUI embeds them in its single files (the ``tekken_model`` tensor)."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def write_comfy_file(model, path: Path, tekken: bytes | None = None, layers=None, lm_head=True) -> Path:
    tensors = comfy_tensors(model, layers, lm_head)
    if tekken is not None:
        tensors["tekken_model"] = tekken_tensor(tekken)
    save_file(tensors, str(path))
    return path


def write_hf_folder(model, folder: Path, new_layout: bool = False) -> Path:
    """An HF Mistral3 folder. ``save_pretrained`` writes the older ``language_model.model.*`` names;
    ``new_layout`` writes the in-memory names (``model.language_model.*``) of transformers >= 4.52."""
    model.save_pretrained(str(folder))
    if new_layout:
        for shard in folder.glob("*.safetensors"):
            shard.unlink()
        tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


@functools.lru_cache(maxsize=1)
def v7_tekken_json() -> bytes:
    """mistral-common's vocabulary as a v7 tekken.json with an explicit control-token list."""
    source = json.loads(MISTRAL_COMMON_TEKKEN.read_bytes())
    specials = [{"rank": i, "token_str": t, "is_control": True} for i, t in enumerate(CONTROL_TOKENS)]
    config = {**source["config"], "version": "v7"}
    keep = config["default_vocab_size"] - config["default_num_special_tokens"]
    return json.dumps(
        {"config": config, "vocab": source["vocab"][:keep], "special_tokens": specials}
    ).encode()


@functools.lru_cache(maxsize=1)
def reference_tekken_folder() -> Path:
    """A folder holding the v7 tekken.json (kept for the whole test session)."""
    folder = Path(tempfile.mkdtemp(prefix="tekken_"))
    (folder / "tekken.json").write_bytes(v7_tekken_json())
    return folder


@functools.lru_cache(maxsize=1)
def reference_hf_tokenizer():
    """transformers' Tekken conversion of the v7 file, with the chat template excerpt (built once); it pads
    on the right, transformers' default."""
    from transformers.integrations.mistral import convert_tekken_tokenizer

    path = reference_tekken_folder() / "tekken.json"
    return convert_tekken_tokenizer(str(path), chat_template=MISTRAL_CHAT_TEMPLATE_EXCERPT)


def save_hf_tokenizer_folder(folder: Path) -> Path:
    """A bare ``tokenizer.json`` folder (no tekken.json, no tokenizer_config.json) of the reference."""
    folder.mkdir(parents=True, exist_ok=True)
    reference_hf_tokenizer().backend_tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def save_tekken_folder(folder: Path, padding_side: str | None = None) -> Path:
    """A tokenizer folder holding the v7 tekken.json, and a tokenizer_config.json naming ``padding_side``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tekken.json").write_bytes(v7_tekken_json())
    if padding_side is not None:
        config = {"padding_side": padding_side, "tokenizer_class": "TokenizersBackend"}
        (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@contextlib.contextmanager
def without_logits(model: Mistral3ForConditionalGeneration):
    """``lm_head`` swapped for an identity while diffusers runs the model: its 131072-wide logits (0.5 GB for
    two 512-token prompts, most of the reference's time) are never computed. The hidden states, the only
    output the pipelines read, do not depend on ``lm_head``."""
    head, model.lm_head = model.lm_head, torch.nn.Identity()
    try:
        yield model
    finally:
        model.lm_head = head


def reference_embeds(model, tokenizer, prompts: list[str], padding_side: str = "right") -> torch.Tensor:
    """diffusers' dev text conditioning: the full model, the chat template, hidden states (10, 20, 30), with
    the tokenizer padding on ``padding_side``."""
    from diffusers import Flux2Pipeline

    side, tokenizer.padding_side = tokenizer.padding_side, padding_side
    try:
        with torch.no_grad(), without_logits(model):
            return Flux2Pipeline._get_mistral_3_small_prompt_embeds(
                text_encoder=model,
                tokenizer=tokenizer,
                prompt=prompts,
                dtype=torch.float32,
                device=torch.device("cpu"),
                max_sequence_length=512,
                hidden_states_layers=(10, 20, 30),
            )
    finally:
        tokenizer.padding_side = side
