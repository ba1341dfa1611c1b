"""The T5 and CLIP tokenizers of FLUX.1, from tokenizer folders in Hugging Face layout.

No tokenizer ships inside the weights: the folders come from a diffusers repository (``tokenizer/`` for CLIP,
``tokenizer_2/`` for T5, beside ``text_encoder/`` and ``text_encoder_2/``), from ComfyUI's own
(``comfy/sd1_tokenizer``, ``comfy/text_encoders/t5_tokenizer``: the node layer passes them), or from the user
(``--tokenizer DIR``, in any order: each folder is told apart by its vocabulary). Nothing is downloaded.

- T5: SentencePiece Unigram (32,100 pieces), ``</s>`` appended, padded with ``<pad>`` (0) on the right to 512.
- CLIP: byte-level BPE (49,408 ids), ``<|startoftext|>`` ... ``<|endoftext|>``, padded with ``<|endoftext|>``
  to 77. The folders' own ``model_max_length`` is ignored (ComfyUI's says 8192): the lengths are the model's.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from ..errors import Flux2Error
from .config import CLIP_TOKENS, T5_TOKENS

log = logging.getLogger(__name__)

T5_VOCAB, CLIP_VOCAB = 32100, 49408
WHERE = (
    "give the tokenizer folders with --tokenizer DIR (repeat for both): tokenizer/ (CLIP) and tokenizer_2/ "
    "(T5) of the black-forest-labs/FLUX.1-Fill-dev repository, or ComfyUI's comfy/sd1_tokenizer and "
    "comfy/text_encoders/t5_tokenizer"
)


def tokenizer_kind(folder: Path) -> str | None:
    """ "t5", "clip" or None for a folder, from its files: the tokenizer class it names, else the model type
    of its ``tokenizer.json``, else the files a slow tokenizer needs."""
    config = _json(folder / "tokenizer_config.json")
    named = str(config.get("tokenizer_class", "")).lower()
    if "t5" in named:
        return "t5"
    if "clip" in named:
        return "clip"
    model = str(_json(folder / "tokenizer.json").get("model", {}).get("type", ""))
    if model == "Unigram" or (folder / "spiece.model").is_file():
        return "t5"
    if model == "BPE" or ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()):
        return "clip"
    return None


def load_fill_tokenizers(folders) -> dict[str, object]:
    """{"t5": tokenizer, "clip": tokenizer} from the given folders, each matched by its vocabulary."""
    found: dict[str, object] = {}
    for folder in folders:
        folder = Path(folder)
        if not folder.is_dir():
            raise Flux2Error(f"tokenizer folder {folder} does not exist: {WHERE}")
        kind = tokenizer_kind(folder)
        if kind is None:
            raise Flux2Error(f"{folder} holds no T5 or CLIP tokenizer files: {WHERE}")
        if kind in found:
            raise Flux2Error(
                f"{folder} is a second {kind.upper()} tokenizer: give one T5 and one CLIP folder"
            )
        found[kind] = _load(kind, folder)
    return found


def beside(weights: Path | None, component: str) -> Path | None:
    """The diffusers tokenizer folder of a text-encoder folder: ``tokenizer/`` for ``text_encoder/``,
    ``tokenizer_2/`` for ``text_encoder_2/`` (None when there is none)."""
    if weights is None:
        return None
    name = {"text_encoder": "tokenizer", "text_encoder_2": "tokenizer_2"}[component]
    for root in (weights, weights.parent):
        if (root / name).is_dir():
            return root / name
    return None


def _load(kind: str, folder: Path):
    try:
        if kind == "t5":
            # transformers takes seconds to import: only when a model is built
            from transformers import T5TokenizerFast

            tokenizer = T5TokenizerFast.from_pretrained(str(folder), model_max_length=T5_TOKENS)
        else:
            # transformers takes seconds to import: only when a model is built
            from transformers import CLIPTokenizer

            tokenizer = CLIPTokenizer.from_pretrained(str(folder), model_max_length=CLIP_TOKENS)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise Flux2Error(
            f"the {kind.upper()} tokenizer in {folder} could not be read ({e}): {WHERE}"
        ) from None
    expected = T5_VOCAB if kind == "t5" else CLIP_VOCAB
    if len(tokenizer) < expected:
        raise Flux2Error(
            f"the tokenizer in {folder} has {len(tokenizer)} tokens, not the {expected} of the "
            f"{kind.upper()} tokenizer FLUX.1 was trained with: {WHERE}"
        )
    return tokenizer


def tokenize(tokenizer, prompts: list[str], length: int, what: str) -> torch.Tensor:
    """[B, length] ids, padded on the right and cut to ``length`` (with a warning naming the prompt)."""
    out = tokenizer(prompts, padding="max_length", max_length=length, truncation=True, return_tensors="pt")
    full = tokenizer(prompts, padding=False, truncation=False)["input_ids"]
    for prompt, ids in zip(prompts, full):
        if len(ids) > length:
            log.warning("%s: the prompt %r is %d tokens long; only the first %d are used", what, prompt[:40],
                        len(ids), length)  # fmt: skip
    return out["input_ids"]


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
