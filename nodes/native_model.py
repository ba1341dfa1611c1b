"""Our FLUX.2 model as a native ComfyUI ``MODEL``: the seam where native samplers drive our DiT.

``native_model(klein)`` builds what native nodes expect of a FLUX.2 model: a ``ModelPatcher`` around a
``comfy.model_base.Flux2`` (so native's latent format, ``model_sampling`` (flow, shift 2.02), timestep
handling, the 512-token text padding of ``extra_conds``, ``ref_latents`` from ``ReferenceLatent`` and the
guidance value of dev are native's own code), whose ``diffusion_model`` is ``NativeDiT``: a module with
native ``Flux``'s call signature that runs our DiT through ``flux2_core.latent_velocity``, inside native's
``DIFFUSION_MODEL`` wrapper chain (where EasyCache hooks in).

What stays ours:

- the weights: our loader's patchers (``KleinModel.patchers``: quantised or GGUF layers kept quantised, a
  streamed model's resident part, each device of a block split) are the MODEL's additional models, and an
  ``OUTER_SAMPLE`` wrapper loads them whole (``force_full_load``, as our sampler does: plain torch layers
  cannot be partially loaded) with our memory estimate before native sampling prepares the run;
- the LoRAs of ``Flux2KleinLoraLoader`` (applied for the whole run, as in our sampler), interruption checks
  before every block, and the KV model's reference K/V (computed once per set of references and kept in the
  sampler's store);
- the memory estimate (``memory_required``).

Native weight patches (``LoraLoaderModelOnly``, model merging) would find none of native's weight names in
this model and do nothing, so ``add_patches`` refuses them, naming our LoRA loader; block-replacement and
attention patches that native's own FLUX code reads (``patches_replace["dit"]``, ``attn1_patch``, ...) are
refused when sampling starts. The native classes themselves are in ``native_classes``.
"""

from __future__ import annotations

import functools

import torch

from ..flux2_core import (
    FLUX2,
    Flux2Error,
    ReferenceLatents,
    ReferenceStrength,
    SampleSettings,
    at_step,
    encode_reference_kv,
    estimate_memory,
    latent_velocity,
    model_run,
    regional_plan,
    step_of,
)
from . import host
from .types import REFERENCE_STRENGTHS, REGIONAL_PROMPT

WRAPPER_KEY = "flux2_klein"
EXTRAPOLATION_OPTION = "flux2_position_extrapolation"  # transformer option: a PositionExtrapolation or None


class NativeDiT(torch.nn.Module):
    """Native ``Flux``'s call signature on our DiT. Holds no parameters: the weights are our patchers'."""

    def __init__(self, klein, kv_store):
        super().__init__()
        self.klein = klein  # nodes.types.KleinModel (a dataclass, so not registered as a submodule)
        self.kv_store = kv_store

    @property
    def dtype(self) -> torch.dtype:
        return self.klein.core.transformer.dtype

    def forward(self, x, timestep, context, y=None, guidance=None, ref_latents=None, control=None,
                transformer_options={}, **kwargs):  # noqa: B006  (native's signature)  # fmt: skip
        return host.diffusion_model_wrappers(self._forward, self, transformer_options)(
            x, timestep, context, y, guidance, ref_latents, control, transformer_options, **kwargs
        )

    def _forward(self, x, timestep, context, y=None, guidance=None, ref_latents=None, control=None,
                 transformer_options={}, **kwargs):  # noqa: B006  # fmt: skip
        refuse_patches(transformer_options)
        if control is not None:
            raise Flux2Error("a ControlNet cannot drive a model from FLUX.2 to native MODEL: remove it")
        method = kwargs.get("ref_latents_method")
        if ref_latents and method not in (None, "index"):
            raise Flux2Error(
                f"reference latents method {method!r} is not supported by FLUX.2 to native MODEL: FLUX.2 "
                "places references by index (remove the reference-method node, or set it to index)"
            )
        model = self.klein.core
        regions, mask = kwargs.get(REGIONAL_PROMPT), None
        if regions is not None:  # with references too: the DiT places them in the mask
            context, mask = self._regional(model, regions, x)
        bias = None
        strengths = kwargs.get(REFERENCE_STRENGTHS)
        if ref_latents and strengths:
            ref_latents, bias = self._at_step(model, ref_latents, strengths, timestep, transformer_options)
        kv = None
        if ref_latents and model.variant.kv_cache:
            kv = self._reference_kv(model, ref_latents)
        extrapolation = transformer_options.get(EXTRAPOLATION_OPTION)  # FLUX.2 Position Extrapolation's
        return latent_velocity(
            model, x, timestep, context, ref_latents or None, guidance, kv, bias, mask, extrapolation
        )

    def _regional(self, model, regions, x):
        """(the joined prompts for ``x``'s batch, the regional mask at ``x``'s latent size), built once per
        regional prompt and size (every step and block of a run reuse them)."""
        key = (id(regions), tuple(x.shape[-2:]))
        if getattr(self, "_plan_key", None) != key:
            net = model.transformer
            self._plan = regional_plan(regions, tuple(x.shape[-2:]), net.dtype, net.device)
            self._plan_key, self._plan_of = key, regions  # kept alive with the key, so the id stays its own
        context, mask = self._plan
        if context.shape[0] not in (1, x.shape[0]):
            raise Flux2Error(
                f"the regional prompt holds {context.shape[0]} global prompts for a batch of {x.shape[0]}: "
                "give one global prompt, or as many as the batch"
            )
        return context.expand(x.shape[0], -1, -1), mask

    @staticmethod
    def _at_step(model, ref_latents, strengths, timestep, transformer_options):
        """(the references, the bias of their keys) at this call's step of native's schedule: none at all when
        every strength is 0 there (``reference_strength``)."""
        if len(strengths) > len(ref_latents):
            raise Flux2Error(
                f"the conditioning carries {len(ref_latents)} reference latents but {len(strengths)} "
                "reference strengths: a native node removed references after FLUX.2 to native CONDITIONING; "
                "add every reference before it"
            )
        # native ReferenceLatent appends after ours: those count at 1, as everywhere in native graphs
        strengths = tuple(strengths) + (ReferenceStrength(),) * (len(ref_latents) - len(strengths))
        schedule = transformer_options.get("sample_sigmas")
        schedule = [1.0, 0.0] if schedule is None else schedule.tolist()
        step = step_of(schedule, float(timestep.reshape(-1)[0]))
        counts = [lat.shape[-2] * lat.shape[-1] for lat in ref_latents]
        net = model.transformer
        used, bias = at_step(strengths, counts, step, len(schedule) - 1, net.dtype, net.device)
        return (ref_latents, bias) if used else (None, None)

    def _reference_kv(self, model, ref_latents):
        if any(lat.shape[0] > 1 and not torch.equal(lat, lat[:1].expand_as(lat)) for lat in ref_latents):
            raise Flux2Error(
                "the 9B-KV model keeps one set of reference K/V for the whole batch, but the batched "
                "conditionings carry different references: sample them separately"
            )
        references = ReferenceLatents.from_latents([lat[:1] for lat in ref_latents])
        cache, _ = self.kv_store.get(model, references, lambda: encode_reference_kv(model, references))
        return cache


def refuse_patches(transformer_options: dict) -> None:
    """Patches native's own FLUX code would apply inside its blocks: ours has no such places."""
    found = [name for name in ("attn1_patch", "attn1_output_patch", "post_input")
             if transformer_options.get("patches", {}).get(name)]  # fmt: skip
    replaced = transformer_options.get("patches_replace", {}).get("dit", {})
    found += [f"{kind} replacement" for kind, _ in replaced]
    if found:
        raise Flux2Error(
            f"{', '.join(sorted(set(found)))} patches need native ComfyUI's own FLUX.2 blocks and cannot "
            "apply to a model from FLUX.2 to native MODEL: remove the patch node, or load the model with "
            "native UNETLoader instead"
        )


def run_memory(klein, latent_shape: tuple, ref_tokens: int, region_tokens: list[int] | None = None) -> int:
    """Our sampler's estimate for native's noise shape [B, 128, h, w] (B counts cond and uncond when native
    batches them), with a regional prompt's token counts (the global prompt's first) when one is sampled."""
    batch, _, h, w = latent_shape
    m = FLUX2.size_multiple
    settings = SampleSettings(w * m, h * m, 1, 1.0, 0, batch)
    return estimate_memory(klein.core, settings, ref_tokens, region_tokens)


def native_model(klein, kv_store):
    """A native ``MODEL`` (ModelPatcher) running ``klein`` (nodes.types.KleinModel)."""
    from .native_classes import native_flux2_model  # subclasses of host classes: only when converting

    config, net = klein.core.config, klein.core.transformer
    return native_flux2_model(
        NativeDiT(klein, kv_store),
        hidden_size=config.hidden_size,
        guidance_embed=config.guidance_embed,
        dtype=net.dtype,
        patchers=klein.patchers,
        memory_estimate=functools.partial(run_memory, klein),
        outer_sample=_outer_sample(klein),
    )


def _outer_sample(klein):
    """Around native's whole sampling run: our weights loaded whole (with our estimate for the noise's
    shape), our LoRAs on, a cancel check before each block."""

    def wrapper(executor, noise, *args, **kwargs):
        host.load_all(klein.patchers, run_memory(klein, tuple(noise.shape), 0))
        with model_run(klein.core, host.check_interrupt):
            return executor(noise, *args, **kwargs)

    return wrapper
