"""Socket type names and the payloads that travel between our nodes.

Our objects get our own type names, so they cannot be wired into core sockets with other interfaces (a core
``VAE`` socket expects ``comfy.sd.VAE``). Loader payloads pair the core object with the ``ModelPatcher``
that lets ComfyUI's memory manager move it; the patcher manages the very module the core object uses.
Nothing here imports ComfyUI.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..flux2_core import (
    AutoEncoder,
    ControlSource,
    FillTextEncoder,
    Flux1AutoEncoder,
    Flux1FillModel,
    Flux2Error,
    Flux2Model,
    Prompt,
    RegionalPrompt,
    TextEncoder,
)

MODEL = "FLUX2_KLEIN_MODEL"
TEXT_ENCODER = "FLUX2_KLEIN_TEXT_ENCODER"
VAE = "FLUX2_KLEIN_VAE"
CONDITIONING = "FLUX2_KLEIN_CONDITIONING"
REFERENCES = "FLUX2_KLEIN_REFERENCES"  # payload: flux2_core.references.ReferenceLatents
# the key of native conditioning options holding our references' strengths (a tuple of ReferenceStrength)
REFERENCE_STRENGTHS = "flux2_klein_reference_strengths"
# ... and our regional prompt (a RegionalPrompt), which our native model joins and masks at its latent size
REGIONAL_PROMPT = "flux2_klein_regional_prompt"
REGIONS_CHANGED = (
    "the regional conditioning's text was changed by a native node after FLUX.2 to native CONDITIONING "
    "(ConditioningAverage, ConditioningConcat, ...): the regions apply to the prompts they were made from. "
    "Combine prompts before FLUX.2 Regional Prompt, or leave the regions out"
)
CONTROL_NET = "FLUX2_DEV_CONTROL_NET"  # payload: ControlNet
STITCH = "FLUX2_KLEIN_STITCH"  # payload: flux2_core.editing.Stitch (what the composite needs)
IMAGE = "IMAGE"  # core: [B, H, W, 3] float 0..1
MASK = "MASK"  # core: [B, H, W] float 0..1, 1 = repaint (as SetLatentNoiseMask and LoadImage's mask)
LATENT = "LATENT"  # core: {"samples": [B, 128, H/16, W/16]}, BN-normalised like native FLUX.2 latents
# FLUX.1 Fill [dev]: its own sockets (a T5 + CLIP encoder, a 16-channel VAE). Its LATENT is native FLUX.1's,
# {"samples": [B, 16, H/8, W/8]}, the raw VAE mean (what native VAEEncode / VAEDecode give / take with
# ae.safetensors).
FILL_MODEL = "FLUX1_FILL_MODEL"
FILL_TEXT_ENCODER = "FLUX1_FILL_TEXT_ENCODER"
FILL_VAE = "FLUX1_FILL_VAE"
FILL_CONDITIONING = "FLUX1_FILL_CONDITIONING"  # payload: flux2_core.FillConditioning (t5, pooled)


@dataclass
class KleinModel:
    """A loaded FLUX.2 DiT, klein or dev: ``core`` is the pack's model, ``core.transformer`` the module
    ``patcher`` moves between devices.

    With its blocks split across devices (the loader's ``devices``), ``patcher`` manages the parts on the
    first device (the blocks there and everything outside the blocks, where the latents live) and
    ``more_patchers`` those on each further device, in order; ``split`` describes the split.
    """

    core: Flux2Model
    patcher: Any  # comfy.model_patcher.ModelPatcher
    more_patchers: tuple = ()
    split: str = ""  # "cuda:0: blocks 0-22 and the rest, 32.06 GB; cuda:1: blocks 23-55, 32.39 GB", or empty

    @property
    def patchers(self) -> list:
        """Every patcher of the model: ComfyUI must load them all before it samples."""
        return [self.patcher, *self.more_patchers]


@dataclass
class KleinTextEncoder:
    """A loaded Qwen3 (klein) or Mistral (dev) text encoder (``encoder.model`` is what ``patcher`` moves).

    ``keep_loaded``: it stays on its device between prompts (a device chosen on the loader, which the DiT
    does not need); otherwise it leaves the device after each encode, to give the DiT the room.
    """

    encoder: TextEncoder
    patcher: Any
    keep_loaded: bool = False


@dataclass
class KleinVAE:
    """A loaded FLUX.2 autoencoder."""

    vae: AutoEncoder
    patcher: Any


@dataclass
class KleinConditioning:
    """One encoded prompt: ``embeds`` [1, 512, 3E] float32 on the intermediate device (CPU normally).

    With ``regions`` (from FLUX.2 Regional Prompt) ``embeds`` is the global prompt's ([1, 0, 3E]: none) and
    the regions' prompts join it under the regional mask when the sampler runs."""

    embeds: torch.Tensor
    encoder_name: str  # "Qwen3-4B", "Qwen3-8B", "Mistral-Small-3.2-24B" or a description of another shape
    width: int  # 3E: 7680 for Qwen3-4B (klein 4B), 12288 for Qwen3-8B (klein 9B), 15360 for Mistral (dev)
    regions: RegionalPrompt | None = None
    control: PendingControl | None = None  # FLUX.2 [dev] Apply ControlNet's, made at the sampler's size

    @property
    def prompt(self) -> Prompt:
        """The core's view of this prompt: the embedding, the regions, the ControlNet."""
        return Prompt(self.embeds, self.regions, self.control.source if self.control is not None else None)

    def to_native(self, references=None) -> list:
        """The same embedding as native ComfyUI ``CONDITIONING`` (what native Klein encoding gives for a
        512-token prompt): ``[[embeds, {"pooled_output": None}]]``; with ``references``
        (``ReferenceLatents``) also their latents, as native ``ReferenceLatent`` adds them, and, unless every
        one is plain, their strengths (``REFERENCE_STRENGTHS``, read by our native model)."""
        if self.control is not None:  # refused, never dropped: native samplers cannot run it
            raise Flux2Error(
                "the Fun ControlNet is run by the FLUX.2 Sampler only, not by native sampling nodes: connect "
                "FLUX.2 [dev] Apply ControlNet to the FLUX.2 Sampler's positive input, or take it out of "
                "this native graph"
            )
        options = {"pooled_output": None}
        if self.regions is not None:
            options[REGIONAL_PROMPT] = self.regions
        if references is not None and len(references):
            options["reference_latents"] = references.latents()
            if not references.plain:
                options[REFERENCE_STRENGTHS] = references.strengths
        return [[self.embeds, options]]


def carried_regions(embeds: torch.Tensor, options: dict) -> RegionalPrompt | None:
    """The regional prompt a native conditioning entry ``[embeds, options]`` still stands for, or None.

    Native nodes copy an entry's options and change its embedding, so the regions can arrive with another
    text than the global prompt they were made with: zeros from ``ConditioningZeroOut`` (a negative made from
    the regional prompt, which runs unmasked, without the regions), or a mix of prompts, which is refused
    rather than silently replaced by the regions' own."""
    regions = options.get(REGIONAL_PROMPT)
    if regions is None or embeds is regions.global_embeds:
        return regions
    if not bool(embeds.any()):
        return None
    raise Flux2Error(REGIONS_CHANGED)


@dataclass
class ControlNet:
    """A loaded FLUX.2 [dev] Fun ControlNet and the patcher that moves it with the DiT."""

    net: Any  # flux2_core.Flux2ControlNet
    patcher: Any


@dataclass
class PendingControl:
    """What FLUX.2 [dev] Apply ControlNet was given: the core's ``ControlSource`` (the net, the VAE, the maps;
    the sampler builds the control context at its output size, so one conditioning serves any size) and the
    patcher that loads the net beside the DiT."""

    source: ControlSource
    patcher: Any


@dataclass
class FillModel:
    """A loaded FLUX.1 Fill DiT (``core.transformer`` is what ``patcher`` moves)."""

    core: Flux1FillModel
    patcher: Any


@dataclass
class FillTextEncoderPair:
    """T5-XXL and CLIP-L with their tokenizers (``encoder.modules``, both models, is what ``patcher``
    moves)."""

    encoder: FillTextEncoder
    patcher: Any


@dataclass
class FillVAE:
    """A loaded FLUX.1 autoencoder (``ae.safetensors``)."""

    vae: Flux1AutoEncoder
    patcher: Any
