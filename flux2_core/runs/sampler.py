"""The FLUX.2 Sampler's inputs as a host gives them -> one checked sampling run, before any model is loaded.

A host hands over what its user set: sides left at 0 (taken from the first reference, else the ControlNet's
maps, else 1024), a latent that sets the size and batch (and is the image to start from with denoise below
1 or a noise mask), prompts that may carry regions or a ControlNet, a native schedule, whether to keep the
KV model's reference K/V across runs. ``plan_sampling`` checks them all and returns a ``SamplingPlan``: the
checked ``SampleRequest``, the memory the run needs (``MemoryNeed``), and ``run``, which samples it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from ..configs import FLUX2
from ..dit.extrapolation import DEFAULT_BASE, position_extrapolation
from ..dit.kv_cache import RefKVCache
from ..dit.step_cache import StepCache
from ..dit.transformer import Flux2Model
from ..editing import latent_mask
from ..flow import SampleSettings, StepCallback, output_size
from ..kv_store import RefKVStore
from ..limits import MemoryNeed
from ..references import ReferenceLatents
from ..sampling import SampleRequest, encode_reference_kv, estimate_memory, sample
from .prompts import ControlSource, Prompt

log = logging.getLogger(__name__)

ADVICE = "lower width/height, the batch size, the number of references or their max_megapixels"


@dataclass(frozen=True)
class SamplerInputs:
    """The numbers and choices of one sampler run, named as the FLUX.2 Sampler's widgets: a side at 0 is
    taken from the run's references or ControlNet (``output_size``); ``denoise`` below 1 starts from the
    latent; ``step_cache`` is the First-Block Cache threshold; ``sigmas`` a schedule run as given."""

    seed: int
    steps: int
    guidance: float
    width: int = 0
    height: int = 0
    batch_size: int = 1
    denoise: float = 1.0
    step_cache: float = 0.0
    position_extrapolation: str = "off"
    extrapolation_base: int = DEFAULT_BASE
    sigmas: torch.Tensor | list[float] | None = None

    def output_size(
        self, references: ReferenceLatents | None, latent: torch.Tensor | None, control: ControlSource | None
    ) -> tuple[int, int, int]:
        """(width, height, batch size) to sample. A latent [B, 128, h, w] sets all three; otherwise a side
        at 0 takes the first reference's processed size, else the ControlNet maps' (``control_output_size``),
        else the family's default size."""
        if latent is not None:
            batch, _, h, w = latent.shape
            return w * FLUX2.size_multiple, h * FLUX2.size_multiple, batch
        if references is not None and len(references):
            first = references.pixel_size(0)
        else:
            first = control.output_size() if control is not None else None
        return (*output_size(self.width, self.height, first), self.batch_size)

    def settings(self, width: int, height: int, batch_size: int) -> SampleSettings:
        """The run's ``SampleSettings`` (a given schedule sets the steps), every number checked."""
        settings = SampleSettings(width, height, self.steps, self.guidance, self.seed, batch_size)
        if self.sigmas is not None:  # a native schedule, as given: its length sets the steps
            settings = settings.with_sigmas(self.sigmas)
        settings.check()
        return settings


@dataclass(frozen=True, eq=False)
class SamplingPlan:
    """A checked run: ``request`` (without its progress callback and interrupt), the memory it needs beyond
    the weights, and the store the KV model's reference K/V are kept in across runs (None: computed)."""

    request: SampleRequest
    memory: MemoryNeed
    kv_store: RefKVStore | None = None

    @property
    def steps(self) -> int:
        return self.request.settings.steps

    @property
    def step_cache(self) -> StepCache:
        return StepCache.of(self.request.step_cache)

    def run(self, callback: StepCallback | None = None, interrupt=None) -> torch.Tensor:
        """Sample the request (``sample``) with ``callback`` and ``interrupt``: latents [B, 128, h, w]."""
        request = self.request
        kv_cache = reference_kv(request.model, request.references, self.kv_store)
        return sample(replace(request, kv_cache=kv_cache, callback=callback, interrupt=interrupt))


def plan_sampling(
    model: Flux2Model,
    positive: Prompt,
    inputs: SamplerInputs,
    negative: Prompt | None = None,
    references: ReferenceLatents | None = None,
    latent: torch.Tensor | None = None,
    noise_mask: torch.Tensor | None = None,
    kv_store: RefKVStore | None = None,
) -> SamplingPlan:
    """Every input of a run checked (the numbers, the prompts and the model's text encoder, the edit inputs,
    the ControlNet's pairing) before the model is loaded; only the ControlNet's VAE runs, to build its
    context at the output size. ``latent`` [B, 128, h, w] sets the size; it is the image to start from when
    ``inputs.denoise`` < 1 or with ``noise_mask`` (pixels [B or 1, 1, H, W] or [H, W], 1 = repaint: only
    that area is repainted)."""
    if negative is not None:
        negative.check_negative()
    width, height, batch_size = inputs.output_size(references, latent, positive.control)
    settings = inputs.settings(width, height, batch_size)
    cache_rule = StepCache(inputs.step_cache)
    editing = latent is not None and (inputs.denoise < 1.0 or noise_mask is not None)
    mask = latent_mask(noise_mask, settings.grid, batch_size) if noise_mask is not None else None
    extrapolation = position_extrapolation(inputs.position_extrapolation, inputs.extrapolation_base)
    control = positive.control.applied(height, width) if positive.control is not None else None
    request = SampleRequest(
        model,
        positive.embeds,
        settings,
        regions=positive.regions,
        negative=negative.embeds if negative is not None else None,
        references=references,
        start=latent if editing else None,  # else the request says what is missing
        strength=inputs.denoise,
        mask=mask,
        step_cache=cache_rule,
        control=control,
        extrapolation=extrapolation,
    )
    net = control.net if control is not None else None
    required = estimate_memory(model, settings, references, positive.regions, net)
    return SamplingPlan(request, MemoryNeed(required, _what(width, height, references), ADVICE), kv_store)


def reference_kv(
    model: Flux2Model, references: ReferenceLatents | None, store: RefKVStore | None
) -> RefKVCache | None:
    """The KV model's reference K/V from ``store`` when these references ran before on this model (else
    computed and kept there); None for other models, without references or without a store (``sample``
    computes them then)."""
    if store is None or not model.variant.kv_cache or references is None or not len(references):
        return None
    cache, reused = store.get(model, references, lambda: encode_reference_kv(model, references))
    log.info("reference K/V %s (%d entries, %.2f GB kept)", "reused from the cache" if reused else
             "computed", len(store), store.nbytes / 2**30)  # fmt: skip
    return cache


def _what(width: int, height: int, references: ReferenceLatents | None) -> str:
    tokens = references.num_tokens if references is not None else 0
    refs = f" with {len(references)} references ({tokens} tokens)" if tokens else ""
    return f"sampling {width}x{height}{refs}"
