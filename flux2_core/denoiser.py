"""The klein denoiser: the velocity of one sampling step for the variant's guidance kind (see ``sampling``),
with the references as each step's strengths want them (``reference_strength``) and the positive pass under
the regional prompts' mask (``regions``)."""

from __future__ import annotations

from dataclasses import replace

import torch

from .dit.kv_cache import RefKVCache
from .dit.rope import image_ids, text_ids
from .dit.step_cache import StepCache
from .sampling_checks import batched
from .steering.reference_strength import at_step, step_of
from .steering.regions import regional_plan

PROMPTS_FOR_BATCH = (
    "the conditioning holds {given} prompts but the batch size is {batch}: encode one prompt, or as many as "
    "the batch size"
)


def dit_call(net, x, x_ids, t, ctx, ctx_ids, refs=None, kv_cache=None, **kw) -> torch.Tensor:
    """The DiT's velocity for packed tokens ``x`` [B, N, 128]: against the KV model's cached reference K/V
    (``kv_cache``), with reference tokens appended (``refs``: tokens [1 or B, R, 128] and ids [R, 4]), or
    on their own; ``kw``: the embedded guidance, the step cache, the reference keys' bias."""
    if kv_cache is not None:
        return net.forward_kv_cached(x, x_ids, t, ctx, ctx_ids, kv_cache, **kw)
    if refs is not None:
        return net(x, x_ids, t, ctx, ctx_ids, *refs, **kw)
    return net(x, x_ids, t, ctx, ctx_ids, **kw)


class KleinDenoiser:
    """The velocity of one step (see the module docstring for the guidance kinds and the KV model)."""

    def __init__(self, request, schedule: list[float], kv_cache: RefKVCache | None = None, cache=None):
        """``request``: a ``sampling.SampleRequest``; ``schedule``: its full list of sigmas (the step of each
        call is found in it)."""
        model, settings, references = request.model, request.settings, request.references
        self.net = model.transformer
        self.cache = cache or StepCache()  # one FirstBlockCache per pass (conditional, unconditional)
        self.guidance = settings.guidance
        device, dtype = self.net.device, self.net.dtype
        self.x_ids = image_ids(*settings.grid)  # ids stay on the CPU: the model turns them into a RoPE table
        conds, self.mask = list(request.conds), None
        if request.regions is not None:  # the positive pass: the joined prompts under the regional mask
            conds[0], self.mask = regional_plan(request.regions, settings.grid, dtype, device)
        self.conds = [
            (batched(c, settings.batch_size, PROMPTS_FOR_BATCH).to(device, dtype), text_ids(c.shape[1]))
            for c in conds
        ]
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
        g = self.embedded.to(x.device) if self.embedded is not None else None
        refs, kv_cache, bias = self._references_at(sigma)
        control = None
        if self.control is not None:  # every pass, as the reference pipeline's negative pass too
            steps = len(self.schedule) - 1
            control = self.control.at(step_of(self.schedule, sigma), steps, x.device, self.net.dtype)
        velocities = []
        with torch.inference_mode():
            for i, (ctx, ctx_ids) in enumerate(self.conds):
                step = self.cache.pass_cache(i)  # None when off: the call is the one without a cache
                kw = {"guidance": g} if step is None else {"guidance": g, "step_cache": step}
                if bias is not None:
                    kw["ref_bias"] = bias
                if i == 0 and self.mask is not None:
                    kw["attn_mask"] = self.mask
                if control is not None:
                    kw["control"] = control
                if self.extrapolation is not None:
                    kw["extrapolation"] = self.extrapolation
                v = dit_call(self.net, x_in, self.x_ids, t, ctx, ctx_ids, refs, kv_cache, **kw)
                velocities.append(v.float())
        if len(velocities) == 2:
            v_cond, v_uncond = velocities
            return v_uncond + self.guidance * (v_cond - v_uncond)
        return velocities[0]

    def _references_at(self, sigma: float):
        """(reference tokens, KV cache, bias of the reference keys) for the step at ``sigma``: as given with
        every strength 1 (no bias), none at all with every strength 0, else with the bias."""
        if self.strengths is None:
            return self.refs, self.kv_cache, None
        step, steps, net = step_of(self.schedule, sigma), len(self.schedule) - 1, self.net
        used, bias = at_step(self.strengths, self.token_counts, step, steps, net.dtype, net.device)
        return (self.refs, self.kv_cache, bias) if used else (None, None, None)
