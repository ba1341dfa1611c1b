"""Tekken, the tokenizer of Mistral Small 3.x (FLUX.2 [dev]'s text encoder), and the dev prompt template.

Tekken is a tiktoken byte-level BPE: token id = BPE rank + 1000, ids 0-999 are control tokens.
The built-in vocabulary is ``data/tekken_240911.json`` of the PyPI package ``mistral-common`` (Mistral's own
tokenizer package), found with ``importlib.resources``; its first 130,072 ranks plus the 1000 control tokens
below give the ids of Mistral-Small-3.1/3.2 (checked against their published id vectors). The encoding is a
``tiktoken.Encoding`` over those ranks rather than mistral-common's ``Tekkenizer``: the same engine the
Tekkenizer uses, no dependency on mistral-common's Python API (only its data file), the same construction as
the Qwen tokenizer of ``tokenizer.py``, and mistral-common's and transformers' own Tekken code stay free to
serve as independent oracles in the tests. A model's own ``tekken.json`` (beside the weights, or embedded in
a ComfyUI file as the ``tekken_model`` tensor) is read by the same code.

Control tokens typed in a prompt (``[INST]``, ``<s>``, ``<SPECIAL_500>``) become their control ids, as in
transformers' tokenizer of the model that diffusers and BFL run, which splits every control token out of
the raw text first; the prompt's own ``[IMG]`` is deleted before that (BFL/diffusers ``format_input``).
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Sequence

from ..errors import Flux2Error

NUM_SPECIAL_TOKENS = 1000
TEKKEN_VOCAB_SIZE = 131072  # ids 0..131071: 1000 control tokens + 130,072 BPE ranks
# Control tokens 0-19 by name (mistral-common's table for tekken files without their own list); 20-999 are
# reserved fillers named <SPECIAL_n>.
NAMED_SPECIAL_TOKENS = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)
SPECIAL_TOKENS = NAMED_SPECIAL_TOKENS + tuple(
    f"<SPECIAL_{i}>" for i in range(len(NAMED_SPECIAL_TOKENS), NUM_SPECIAL_TOKENS)
)
BOS_ID, PAD_ID = 1, 11  # <s>, <pad>
# The control ids the dev template relies on: a tokenizer that puts them elsewhere is another model's.
TEMPLATE_CONTROLS = {
    "<s>": 1,
    "[INST]": 3,
    "[/INST]": 4,
    "<pad>": 11,
    "[SYSTEM_PROMPT]": 17,
    "[/SYSTEM_PROMPT]": 18,
}

# BFL's and diffusers' SYSTEM_MESSAGE, with its literal newline between "object" and "attribution" (diffusers'
# modular pipeline has a space there, which gives other ids).
SYSTEM_MESSAGE = (
    "You are an AI that reasons about image descriptions. You give structured responses focusing on object "
    "relationships, object\nattribution and actions without speculation."
)
# The Mistral-Small-3.1 chat template for one system and one user message, no generation prompt.
MISTRAL_TEMPLATE = "<s>[SYSTEM_PROMPT]" + SYSTEM_MESSAGE + "[/SYSTEM_PROMPT][INST]{prompt}[/INST]"
BUILTIN_VOCABULARY = "tekken_240911.json"  # in mistral_common/data


class TekkenTokenizer:
    """Tekken over BPE ranks and a control-token list: text -> ids, control tokens in the text included."""

    def __init__(self, ranks: dict[bytes, int], pattern: str, specials: Sequence[str], source: str):
        # with the first tokenizer built, not when the package is imported
        import tiktoken

        if sorted(ranks.values()) != list(range(len(ranks))):
            raise Flux2Error(
                f"{source}: the BPE ranks are not 0..{len(ranks) - 1} without gaps: it is corrupt"
            )
        wrong = {t: i for t, i in TEMPLATE_CONTROLS.items() if i >= len(specials) or specials[i] != t}
        if wrong:
            raise Flux2Error(
                f"{source} is not the Tekken tokenizer of Mistral Small 3.x ({', '.join(wrong)} not at ids "
                f"{', '.join(str(i) for i in wrong.values())}): use the model's own tokenizer, or none for "
                "the built-in one"
            )
        self.source = source
        self.num_special = len(specials)
        self.vocab_size = len(specials) + len(ranks)
        self._encoding = tiktoken.Encoding(
            "tekken", pat_str=pattern, mergeable_ranks=ranks, special_tokens={}
        )
        self._specials = {token: i for i, token in enumerate(specials)}
        # Longest first, so that no control token can shadow a longer one starting at the same place.
        alternatives = sorted(self._specials, key=len, reverse=True)
        self._special_split = re.compile("(" + "|".join(re.escape(t) for t in alternatives) + ")")

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for i, piece in enumerate(self._special_split.split(text)):
            if i % 2:
                ids.append(self._specials[piece])
            elif piece:
                ids.extend(rank + self.num_special for rank in self._encoding.encode_ordinary(piece))
        return ids


def tekken_from_json(data: bytes | str, source: str) -> TekkenTokenizer:
    """A ``tekken.json`` (v3 without a control-token list, or v7 with one) as a tokenizer.

    Only the ranks below ``default_vocab_size`` count, as in mistral-common and transformers.
    """
    try:
        raw = json.loads(data)
        config = raw["config"]
        num_special = int(config.get("default_num_special_tokens", NUM_SPECIAL_TOKENS))
        listed = raw.get("special_tokens")
        if listed is None:
            specials = list(SPECIAL_TOKENS[:num_special])
        else:
            specials = [e["token_str"] for e in sorted(listed, key=lambda e: e["rank"])]
            specials += [f"<SPECIAL_{i}>" for i in range(len(specials), num_special)]
        vocab = raw["vocab"]
        vocab_size = int(config.get("default_vocab_size", len(vocab) + num_special))
        ranks = {base64.b64decode(e["token_bytes"]): e["rank"] for e in vocab[: vocab_size - num_special]}
        pattern = config["pattern"]
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise Flux2Error(
            f"{source} is not a Tekken tokenizer file (tekken.json; {type(e).__name__}: {e}): use the "
            "model's own tekken.json, or none for the built-in one"
        ) from None
    return TekkenTokenizer(ranks, pattern, specials, source)


@functools.lru_cache(maxsize=1)
def builtin_tekken() -> TekkenTokenizer:
    """The Tekken tokenizer from mistral-common's ``tekken_240911.json`` (read once per process)."""
    try:
        from importlib.resources import files

        import tiktoken  # noqa: F401  (imported here so that a missing package gets the message below)

        resource = files("mistral_common") / "data" / BUILTIN_VOCABULARY
        data = resource.read_bytes()
    except (ImportError, OSError) as e:
        raise Flux2Error(
            f"the built-in Tekken tokenizer (FLUX.2 [dev]) needs the mistral-common and tiktoken packages "
            f"({e}): run `pip install mistral-common tiktoken` (in ComfyUI's Python: `pip install --no-deps "
            "mistral-common`, which leaves its numpy alone), or give the path of the model's tokenizer folder"
        ) from None
    return tekken_from_json(data, f"mistral-common ({resource})")
