"""Reading a LoRA file: its tensors and its safetensors header metadata (never a pickle)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..errors import Flux2Error
from ..weights.checkpoint import LazyTensors, check_suffix


@dataclass
class LoraFile:
    """The tensors of a LoRA file and its safetensors header metadata."""

    name: str
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str] = field(default_factory=dict)
    path: Path | None = None


def read_lora(path: str | Path) -> LoraFile:
    """Read a ``.safetensors`` LoRA. Pickle files (.ckpt/.pt/.bin) are refused: loading them can run code."""
    path = Path(path)
    if not path.is_file():
        raise Flux2Error(f"{path} does not exist: check the path of the LoRA file")
    check_suffix(path, "LoRA", "a .safetensors file")
    lazy = LazyTensors([path])  # a truncated or corrupt file raises a Flux2Error naming it
    tensors = {key: lazy[key] for key in lazy}
    return LoraFile(path.name, tensors, dict(lazy.metadata), path)
