"""The FLUX.2 denoiser (klein and dev): the velocity of one sampling step for the variant's guidance kind
(see ``sampling``), each DiT call's ``CallExtras`` built from the request and the step: the references as
each step's strengths want them (``reference_strength``), the positive pass under the regional prompts' mask
(``regions``), the control, the extrapolated positions, the step cache."""

from __future__ import annotations

from dataclasses import replace

import torch

from .dit.call import CallExtras, call_extras
from .dit.kv_cache import RefKVCache
from .dit.rope import image_ids
from .dit.step_cache import StepCache
from .sampling_checks import batched
from .steering.reference_strength import at_step, step_of
from .steering.regions import regional_plan

PROMPTS_FOR_BATCH = (
    "the conditioning holds {given} prompts but the batch size is {batch}: encode one prompt, or as many as "
    "the batch size"
)


class Flux2Denoiser:
    """The velocity of one step (see the module docstring for the guidance kinds and the KV model)."""

    def __init__(self, request, schedule: list[float], kv_cache: RefKVCache | None = None, cache=None):
        """``request``: a ``sampling.SampleRequest``; ``schedule``: its full list of sigmas (the step of each
        call is found in it)."""
        model, settings, references = request.model, request.settings, request.references
        self.net = model.transformer
        self.cache = cache or StepCache()  # one FirstBlockCache per pass (conditional, unconditional)
        self.guidance = settings.guidance
        device, dtype = self.net.device, self.net.dtype
        self.grid = settings.grid
        self.x_ids = image_ids(*settings.grid)  # ids stay on the CPU: the model turns them into a RoPE table
        conds, self.mask = list(request.conds), None
        if request.regions is not None:  # the positive pass: the joined prompts under the regional mask
            conds[0], self.mask = regional_plan(request.regions, settings.grid, dtype, device)
        self.conds = [batched(c, settings.batch_size, PROMPTS_FOR_BATCH).to(device, dtype) for c in conds]
        self.refs = None
        if references is not None and len(references) and kv_cache is None:  # [1, R, C]: the whole batch's
            self.refs = (references.tokens.to(device, dtype), references.ids)
        self.kv_cache = kv_cache
        # Per-reference strengths (``reference_strength``): the step of each sigma of the full schedule
        self.strengths = None
        if references is not None and len(references) and not references.plain:
            self.strengths, self.token_counts = references.strengths, references.token_counts
        self.control, self.schedule = request.control, list(schedule)
        if self.control is not None:  # on the DiT's device once, not copied at every step
            self.control = replace(self.control, context=self.control.context.to(device, dtype))
        self.extrapolation = request.extrapolation  # dit.extrapolation.PositionExtrapolation or None
        self.embedded = None
        if model.variant.embeds_guidance:
            self.embedded = torch.full((settings.batch_size,), settings.guidance, dtype=torch.float32)

    def __call__(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        x_in = x.to(self.net.dtype)
        t = torch.full((x.shape[0],), sigma, dtype=torch.float32, device=x.device)
        velocities = []
        with torch.inference_mode():
            for i, ctx in enumerate(self.conds):
                velocities.append(self.net(x_in, self.x_ids, t, ctx, self.extras(sigma, i, x.device)).float())
        if len(velocities) == 2:
            v_cond, v_uncond = velocities
            return v_uncond + self.guidance * (v_cond - v_uncond)
        return velocities[0]

    def extras(self, sigma: float, index: int, device) -> CallExtras:
        """What pass ``index`` (0: the positive prompt, 1: the negative one) of the step at ``sigma``
        carries: the references as that step's strengths want them (none at all with every strength 0), the
        regional mask (positive pass), the control of that step (every pass, as the reference pipeline's
        negative pass too), the extrapolated positions, the pass's step cache, the embedded guidance."""
        step, steps = step_of(self.schedule, sigma), len(self.schedule) - 1
        refs, kv_cache, bias = self.refs, self.kv_cache, None
        if self.strengths is not None:
            net = self.net
            used, bias = at_step(self.strengths, self.token_counts, step, steps, net.dtype, net.device)
            refs, kv_cache = (refs, kv_cache) if used else (None, None)
        control = None
        if self.control is not None:
            control = self.control.at(step, steps, device, self.net.dtype)
        return call_extras(
            references=refs,
            kv_cache=kv_cache,
            reference_bias=bias,
            regions=self.mask if index == 0 else None,
            control=control,
            extrapolation=self.extrapolation,
            sigma=sigma,
            grid=self.grid,
            step_cache=self.cache.pass_cache(index),
            guidance=None if self.embedded is None else self.embedded.to(device),
        )
