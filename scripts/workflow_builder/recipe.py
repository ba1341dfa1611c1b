"""What one FLUX.2 workflow is made of: its files, settings, mode and note, which the graph builder
(``flux2.build``) and the note writer (``notes``) both read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Recipe:
    name: str
    title: str
    summary: str
    dit: str
    text_encoder: str
    variant: str
    steps: int
    guidance: float
    prompt: str
    negative: str | None = None  # None: no negative prompt (distilled / KV)
    references: int = 0
    width: int = 1024
    height: int = 1024
    settings: str = ""
    mode: str = "generate"  # generate / img2img / inpaint / outpaint
    denoise: float = 1.0
    lora: str | None = None  # a LoRA file in models/loras, applied by a LoRA Loader
    family: str = "klein"  # "klein" or "dev": which files and pairing the note describes
    native: str = ""  # "sampler" / "easycache": sampled by native nodes through the bridges, not our sampler
