"""What one FLUX.2 workflow is made of: its files, settings, mode and note, which the graph builder
(``flux2.build``) and the note writer (``notes``) both read."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class _Named(str, Enum):
    def __str__(self) -> str:  # "inpaint", not "Mode.INPAINT", in titles and notes
        return self.value


class Mode(_Named):
    """What the workflow starts from."""

    GENERATE = "generate"  # noise: text to image, or an edit of references
    IMG2IMG = "img2img"  # an image, partly noised (denoise < 1)
    INPAINT = "inpaint"  # an image and its mask (the transparent pixels)
    OUTPAINT = "outpaint"  # an image padded by FLUX.2 Outpaint Pad
    UPSCALE = "upscale"  # an image enlarged (Lanczos), refined by FLUX.2 Tiled Refine


class Family(_Named):
    """Which files and pairing the note describes."""

    KLEIN = "klein"
    DEV = "dev"


class Sampling(_Named):
    """Who samples: this pack's sampler, or native nodes through the bridges."""

    OURS = ""
    NATIVE = "sampler"  # SamplerCustomAdvanced with a guider
    NATIVE_EASYCACHE = "easycache"  # the same, with EasyCache on the model


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
    mode: Mode = Mode.GENERATE
    denoise: float = 1.0
    lora: str | None = None  # a LoRA file in models/loras, applied by a LoRA Loader
    lora_strength: float = 1.0
    family: Family = Family.KLEIN
    sampling: Sampling = Sampling.OURS
    # (strength, start, end) of each reference's Reference Encode; () leaves every one at its defaults
    reference_strengths: tuple[tuple[float, float, float], ...] = ()
    reference_titles: tuple[str, ...] = ()  # what each reference image is for: "(depth map)" in its title
    # two region prompts, over the left and the right half (FLUX.2 Regional Prompt, onto the prompt)
    regions: tuple[str, ...] = ()
    # the kind of control map (e.g. "pose") steering FLUX.2 [dev] through the Fun ControlNet; None: none.
    # With Mode.INPAINT the image and its mask also feed the control net's inpaint mode.
    control: str | None = None
    control_strength: float = 0.75
    position_extrapolation: str = "off"  # the sampler's option (off / dype)
    decode_tile: int = 0  # FLUX.2 Decode's tile_size (0: tiles only what does not fit)
    upscale: float = 2.0  # Mode.UPSCALE: the Lanczos factor before the tiled refine
    # a schedule as sigmas (native ManualSigmas into the sampler's sigmas input); None: the sampler's own
    sigmas: str | None = None
