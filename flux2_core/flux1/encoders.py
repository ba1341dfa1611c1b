"""``FillTextEncoder``: T5-XXL and CLIP-L with their tokenizers, prompts -> ``FillConditioning``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import Flux2Error
from ..hooks import before_each, calling
from ..weights.checkpoint import open_checkpoint
from .config import CLIP_TOKENS, T5_TOKENS
from .text import CLIP_FILE, T5_FILE, LoadedEncoder, load_clip, load_t5
from .tokenizers import WHERE, beside, load_fill_tokenizers, tokenize

log = logging.getLogger(__name__)


@dataclass
class FillConditioning:
    """One or more encoded prompts: T5's per-token states and CLIP's pooled vector, float32 on the CPU."""

    t5: torch.Tensor  # [B, 512, 4096]
    pooled: torch.Tensor  # [B, 768]

    def __len__(self) -> int:
        return self.t5.shape[0]

    def to_native(self) -> list:
        """The same conditioning as native ComfyUI ``CONDITIONING`` (what ``CLIPTextEncode`` gives with a
        FLUX.1 ``DualCLIPLoader``): ``[[t5, {"pooled_output": pooled}]]`` per prompt."""
        return [[self.t5[i : i + 1], {"pooled_output": self.pooled[i : i + 1]}] for i in range(len(self))]


class FillTextEncoder:
    """T5 (``t5.model``) and CLIP (``clip.model``) on one device, with their tokenizers."""

    def __init__(self, t5: LoadedEncoder, clip: LoadedEncoder, tokenizers: dict[str, object]):
        self.t5, self.clip = t5, clip
        self.t5_tokenizer, self.clip_tokenizer = tokenizers["t5"], tokenizers["clip"]

    @property
    def name(self) -> str:
        return f"{self.t5.name} + {self.clip.name}"

    @property
    def widths(self) -> tuple[int, int]:
        """(T5 width, CLIP width): must equal the DiT's ``txt_in`` and ``vector_in`` inputs."""
        return self.t5.shape.d_model, self.clip.shape.hidden_size

    @property
    def modules(self) -> torch.nn.ModuleList:
        """Both models as one module, for a host memory manager."""
        return torch.nn.ModuleList([self.t5.model, self.clip.model])

    @torch.no_grad()
    def encode(
        self, prompts: list[str] | str, interrupt: Callable[[], None] | None = None
    ) -> FillConditioning:
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        if not prompts:
            raise Flux2Error("no prompt to encode: give at least one prompt (an empty string is a valid one)")
        t5_ids = tokenize(self.t5_tokenizer, prompts, T5_TOKENS, "T5")
        clip_ids = tokenize(self.clip_tokenizer, prompts, CLIP_TOKENS, "CLIP")
        t5, clip = self.t5.model, self.clip.model
        with before_each(list(t5.encoder.block) + list(clip.encoder.layers), calling(interrupt)):
            device = next(t5.parameters()).device
            states = t5(input_ids=t5_ids.to(device)).last_hidden_state  # no attention mask, as the references
            device = next(clip.parameters()).device
            pooled = clip(input_ids=clip_ids.to(device)).pooler_output
        return FillConditioning(states.float().cpu(), pooled.float().cpu())


def load_fill_text_encoder(
    t5_path: str | Path,
    clip_path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    tokenizers=None,
    keep_quantized: bool = True,
) -> FillTextEncoder:
    """Load T5-XXL and CLIP-L. ``tokenizers``: folders (any order), else the diffusers folders beside the
    weights; a clear error says where to get them otherwise (before any weight is read)."""
    t5_file, clip_file = (
        open_checkpoint(t5_path, "text_encoder_2"),
        open_checkpoint(clip_path, "text_encoder"),
    )
    folders = list(tokenizers or [])
    if not folders:
        beside_weights = (beside(t5_file.folder, "text_encoder_2"), beside(clip_file.folder, "text_encoder"))
        folders = [f for f in beside_weights if f is not None]
    found = load_fill_tokenizers(folders)
    missing = [kind.upper() for kind in ("t5", "clip") if kind not in found]
    if missing:
        raise Flux2Error(f"no {' and no '.join(missing)} tokenizer for {T5_FILE} / {CLIP_FILE}: {WHERE}")
    t5 = load_t5(t5_file, dtype, device, keep_quantized)
    clip = load_clip(clip_file, dtype, device, keep_quantized)
    return FillTextEncoder(t5, clip, found)
