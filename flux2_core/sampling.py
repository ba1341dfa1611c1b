"""FLUX.2 [klein] sampling: the checked request, ``sample`` (the settings and schedule: ``flow``).

The denoiser (``denoiser.Flux2Denoiser``) gives the velocity of one step for the variant's guidance kind: one
pass (distilled, KV), true CFG ``v_u + g (v_c - v_u)`` with a negative prompt (base), or the guidance value
fed to the model (dev). The KV model runs every step, the first included, against the references' K/V,
computed once before the loop (or handed in, to reuse across runs). The loop is ``flow.euler``. The timestep
goes to the model as float32 sigma (ComfyUI's choice; BFL and diffusers round it to bf16 first, and do so
differently from each other).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .configs import FLUX2, TEXT_ENCODER_FOR_CONTEXT
from .denoiser import PROMPTS_FOR_BATCH, Flux2Denoiser
from .devices.streaming import streamer_of
from .dit.call import call_extras
from .dit.control import Flux2ControlNet, hint_bytes
from .dit.extrapolation import PositionExtrapolation
from .dit.kv_cache import RefKVCache
from .dit.rope import image_ids, reference_ids
from .dit.step_cache import StepCache, check_threshold
from .dit.transformer import Flux2Model
from .errors import Flux2Error
from .flow import (  # the run's settings and schedule: sampling's names too
    SampleSettings,
    StepCallback,
    compute_empirical_mu,  # noqa: F401
    euler,
    get_sigmas,  # noqa: F401
    inpaint_blend,
    make_noise,
    output_size,  # noqa: F401
    pack,
    skipped_steps,
    start_from,
    truncate,
    unpack,
)
from .hooks import before_each, calling, copies_released
from .lora import DIT, patched
from .references import ReferenceLatents
from .sampling_checks import activation_bytes, check_batch, check_extrapolation, check_finite, check_strength
from .steering.control_image import AppliedControl
from .steering.reference_strength import check_steps_reached
from .steering.regions import RegionalPrompt, regional_cost
from .weights.quant_source import working_bytes

log = logging.getLogger(__name__)


def check_conditioning(model: Flux2Model, conditioning: torch.Tensor, what: str = "conditioning") -> None:
    """The text encoder must match the DiT: klein 4B <-> Qwen3-4B (7680), klein 9B <-> Qwen3-8B (12288)."""
    check_text_width(model.config, model.name, conditioning.shape[-1], what)


def check_text_width(config, name: str, got: int, what: str = "conditioning") -> None:
    """The same check from shapes alone (before anything is loaded)."""
    need = config.context_in_dim
    if need != got:
        # a shape no release has (a test model): name the family the DiT pairs with
        family = "the Mistral Small 3.x text encoder" if config.guidance_embed else "a Qwen3 text encoder"
        wanted = TEXT_ENCODER_FOR_CONTEXT.get(need, f"{family} of width {need // 3}")
        given = TEXT_ENCODER_FOR_CONTEXT.get(got, f"a text encoder of width {got // 3}")
        raise Flux2Error(
            f"{name} needs {wanted}: {need}-wide conditioning, this {what} gives {got} "
            f"(made by {given}); "
            f"load {wanted} instead"
        )


def estimate_memory(
    model: Flux2Model,
    settings: SampleSettings,
    references: ReferenceLatents | int | None,
    regions: RegionalPrompt | list[int] | None = None,
    control: Flux2ControlNet | None = None,
) -> int:
    """Rough peak bytes of activations (plus the KV cache, plus the device copies of streamed blocks, plus a
    regional prompt's longer text and its grouped attention's gathers, the references' tokens among them,
    plus a control net's hints and its streamed blocks' copies) for one sampling run of a loaded model;
    ``references`` may also be just their number of tokens, ``regions`` just its prompts' token counts (the
    global prompt's first)."""
    num_ref = references if isinstance(references, int) else (references.num_tokens if references else 0)
    streamer = streamer_of(model.transformer)
    streamed = streamer.working_bytes if streamer is not None else 0
    dtype = model.transformer.dtype
    text, mask = FLUX2.max_text_tokens, 0
    if regions is not None:
        counts = regions.token_counts if isinstance(regions, RegionalPrompt) else regions
        text, mask = regional_cost(
            counts, settings.grid, model.config.hidden_size, dtype.itemsize, settings.batch_size, num_ref
        )
    activations = sampling_memory(model.config, model.variant, dtype, settings, num_ref, text)
    tokens = settings.batch_size * (text + settings.grid[0] * settings.grid[1] + num_ref)
    activations += working_bytes(model.transformer, tokens, dtype)  # an int8 / W4A8 layer's temporaries
    hints = 0
    if control is not None:
        rows, cols = settings.grid
        hints = hint_bytes(control.config, settings.batch_size, rows * cols + num_ref, dtype)
        control_streamer = streamer_of(control)
        streamed += control_streamer.working_bytes if control_streamer is not None else 0
    return activations + mask + hints + streamed


def sampling_memory(
    config, variant, dtype: torch.dtype, settings: SampleSettings, num_ref_tokens: int, text_tokens: int = 0
) -> int:
    """Rough peak bytes of activations (plus the KV cache) beyond the weights, from shapes alone: about
    ``ACTIVATION_ROWS`` hidden-wide rows per token at the peak (``sampling_checks``); ``text_tokens``: the
    conditioning's (default the family's 512)."""
    rows, cols = settings.grid
    tokens = (text_tokens or FLUX2.max_text_tokens) + rows * cols + num_ref_tokens
    activations = activation_bytes(settings.batch_size, tokens, config.hidden_size, dtype)
    kv_cache = 0
    if variant.kv_cache:  # K and V of every reference token in every block, kept for the whole run
        itemsize = torch.finfo(dtype).bits // 8
        kv_cache = (
            2 * num_ref_tokens * config.hidden_size * (config.depth + config.depth_single_blocks) * itemsize
        )
    return activations + kv_cache


def encode_reference_kv(model: Flux2Model, references: ReferenceLatents) -> RefKVCache:
    """The KV model's reference K/V for ``references``, shared by every batch item, prompt, seed and step."""
    net = model.transformer
    with copies_released(net), patched(net, DIT, model.loras):
        return net.encode_reference_kv(references.tokens.to(net.device, net.dtype), references.ids)


@contextlib.contextmanager
def model_run(model: Flux2Model, interrupt: Callable[[], None] | None = None) -> Iterator[None]:
    """One sampling run's setting of the model, for the body of the ``with``: its LoRAs applied, and
    ``interrupt`` called before every block (it may raise to stop the run); a streamed model's device copies
    released however the run ends."""
    net = model.transformer
    with copies_released(net), before_each(net.blocks(), calling(interrupt)), patched(net, DIT, model.loras):
        yield


NAN_CAUSES = (
    ", so the image would be garbage. Likely causes: weights holding NaN/inf (a corrupt or badly converted "
    "file: download it again), float16 overflowing (use bfloat16 or float32), or an extreme guidance value "
    "(use about 4 for base models)"
)


@dataclass(frozen=True, eq=False)
class SampleRequest:
    """One sampling run of ``model``, checked whole when it is made: every number of ``settings``, the text
    encoder behind the conditioning, the number of references, the negative prompt true CFG needs, the step
    cache's threshold, the start latent and the mask. A request that exists can run (``sample``).

    ``positive`` (and ``negative``) is text conditioning [1 or B, T, C]. ``callback`` gets each finished step
    with the predicted clean latent (for previews); ``interrupt`` is called before every block and may raise
    to stop the run. ``start`` (a latent of the output's shape) and ``strength`` < 1 begin part-way down the
    schedule from that latent instead of from pure noise. ``kv_cache`` is the references' K/V from
    ``encode_reference_kv`` (KV model), computed by ``sample`` if not given. ``mask`` (packed
    [1 or B, h * w, 1] from ``editing.latent_mask``, 1 = repaint) inpaints ``start``: after every step the
    latent outside the mask is ``start`` noised to the new sigma. ``step_cache`` is the First-Block Cache
    threshold (0: off) or a ``StepCache`` to read what it did from (``dit.step_cache``). ``regions`` (a
    ``steering.regions.RegionalPrompt`` whose global prompt is ``positive``, [1, 0, C] for none) joins
    the regions' prompts to it under the regional mask, in the positive pass. What a host has only
    once the model is loaded (the K/V, a progress callback) goes into a copy: ``dataclasses.replace``.
    """

    model: Flux2Model
    positive: torch.Tensor
    settings: SampleSettings
    negative: torch.Tensor | None = None
    references: ReferenceLatents | None = None
    callback: StepCallback | None = None
    interrupt: Callable[[], None] | None = None
    start: torch.Tensor | None = None
    strength: float = 1.0
    kv_cache: RefKVCache | None = None
    mask: torch.Tensor | None = None
    step_cache: float | StepCache = 0.0
    regions: RegionalPrompt | None = None
    control: AppliedControl | None = None  # FLUX.2 [dev] with the Fun ControlNet (steering.control_image)
    extrapolation: PositionExtrapolation | None = None  # DyPE past its base size (dit.extrapolation)

    def __post_init__(self) -> None:
        model, settings = self.model, self.settings
        settings.check()
        what = "conditioning"
        if self.regions is not None:  # [1, 0, C] without a global prompt: the width is the regions' prompts'
            what = "global prompt's" if self.positive.shape[1] else "regional prompt's"
            what += " conditioning"
        check_conditioning(model, self.positive, what)
        model.variant.check_references(len(self.references) if self.references is not None else 0)
        if self.uses_cfg and self.negative is None:
            raise Flux2Error(
                f"the {model.variant.name} model with guidance {settings.guidance:g} needs a negative "
                "conditioning: connect one (an empty prompt is the usual choice) or set guidance to 1"
            )
        if self.uses_cfg:
            check_conditioning(model, self.negative, "negative conditioning")
        if not isinstance(self.step_cache, StepCache):
            check_threshold(self.step_cache)
        for conditioning in self.conds:
            check_batch(conditioning, settings.batch_size, PROMPTS_FOR_BATCH)
        _check_editing(self.start, self.strength, self.mask, settings)
        steps = settings.steps
        run = range(skipped_steps(steps, self.strength), steps)
        for k, s in enumerate(self.references.strengths if self.references is not None else ()):
            if s.strength > 0:
                check_steps_reached(f"reference {k + 1}", s.start, s.end, run, steps)
        cached = model.variant.kv_cache and bool(self.references)
        check_extrapolation(self.extrapolation, settings.grid, cached)
        if self.control is not None:
            self.control.check(model.transformer, settings.grid)
            if self.control.strength:
                check_steps_reached("the control", self.control.start, self.control.end, run, steps)
        if self.regions is not None:
            if self.regions.global_embeds is not self.positive:
                raise Flux2Error("a regional request's positive conditioning is its global prompt's: pass it")
            for region in self.regions.regions:
                check_conditioning(model, region.embeds, "region's conditioning")

    @property
    def uses_cfg(self) -> bool:
        """Whether each step runs true CFG: a base model with guidance above 1."""
        return self.model.variant.uses_cfg and self.settings.guidance > 1.0

    @property
    def conds(self) -> list[torch.Tensor]:
        """The conditioning of each pass of a step: the positive one, then the negative one with CFG."""
        return [self.positive] + ([self.negative] if self.uses_cfg else [])


def sample(request: SampleRequest) -> torch.Tensor:
    """Generate latents [B, 128, H/16, W/16] (float32, CPU) for ``request`` (its fields: what each does)."""
    model, settings, references = request.model, request.settings, request.references
    _report_guidance(request)
    net, grid, device = model.transformer, settings.grid, model.transformer.device
    # Latents stay float32 on the model's device for the whole run; the noise is drawn on the CPU.
    noise = pack(make_noise(settings.batch_size, settings.height, settings.width, settings.seed)).to(device)
    source = None if request.start is None else pack(request.start.float()).to(device).expand_as(noise)
    mask = request.mask
    blend = None if mask is None else inpaint_blend(source, mask.float().to(device), noise)
    schedule = settings.schedule()
    sigmas = truncate(schedule, request.strength)
    x = start_from(noise, source, sigmas[0])
    callback = request.callback
    report = None if callback is None else (lambda step, total, x0: callback(step, total, unpack(x0, *grid)))
    control = request.control
    if control is not None and next(control.net.parameters()).device != device:
        control.net.to(device)  # beside the DiT (a host's model manager has put it there already)
    cache = StepCache.of(request.step_cache)
    cache.start(len(request.conds))
    with model_run(model, request.interrupt):
        kv_cache = request.kv_cache if model.variant.kv_cache else None
        if model.variant.kv_cache and references is not None and len(references) and kv_cache is None:
            kv_cache = net.encode_reference_kv(references.tokens.to(device, net.dtype), references.ids)
        x = euler(Flux2Denoiser(request, schedule, kv_cache, cache), x, sigmas, report, blend)
    if cache.passes:
        log.info("%s", cache.describe())
    check_finite(x, NAN_CAUSES)
    return unpack(x, *grid).cpu()


def latent_velocity(
    model: Flux2Model,
    x: torch.Tensor,
    sigma: torch.Tensor,
    context: torch.Tensor,
    references: list[torch.Tensor] | None = None,
    guidance: torch.Tensor | None = None,
    kv_cache: RefKVCache | None = None,
    ref_bias: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    extrapolation: PositionExtrapolation | None = None,
) -> torch.Tensor:
    """One DiT call on latents, the way native ComfyUI calls its FLUX.2 model: ``x`` [B, 128, h, w] at noise
    level ``sigma`` [B] -> the velocity (noise - x0) [B, 128, h, w], float32, on ``x``'s device.

    ``context`` [B, L, C] (any L), ``references`` [B or 1, 128, h_k, w_k] latents at time offsets 10, 20,
    ... (native's "index" method, ours), ``guidance`` [B] the embedded value (dev; ignored by klein),
    ``kv_cache`` the KV model's reference K/V (``references`` then unused), ``ref_bias`` the bias of the
    reference keys (``reference_strength``), ``attn_mask`` the regional prompts' mask over ``[context;
    image]`` (``steering.regions``), ``extrapolation`` the position extrapolation past its base size
    (``dit.extrapolation``). LoRAs, streaming and interrupt hooks are the caller's, for the whole run."""
    net = model.transformer
    device, dtype = net.device, net.dtype
    b, _, h, w = x.shape
    tokens = pack(x).to(device, dtype)
    t = sigma.float().to(device).reshape(-1).expand(b)
    refs = None
    if kv_cache is None and references:
        packed = torch.cat([pack(lat) for lat in references], dim=1).to(device, dtype)
        refs = (packed, reference_ids([tuple(lat.shape[-2:]) for lat in references]))
    if guidance is not None and net.config.guidance_embed:
        guidance = guidance.float().to(device).reshape(-1).expand(b)
    extras = call_extras(
        references=refs,
        kv_cache=kv_cache,
        reference_bias=ref_bias,
        regions=attn_mask,
        extrapolation=extrapolation,
        sigma=float(t.reshape(-1)[0]),
        grid=(h, w),
        guidance=guidance if net.config.guidance_embed else None,
    )
    with torch.inference_mode():
        v = net(tokens, image_ids(h, w), t, context.to(device, dtype), extras)
    return unpack(v.float(), h, w).to(x.device)


def _report_guidance(request: SampleRequest) -> None:
    """Say when the guidance value does nothing: a model without CFG, or a base model at guidance <= 1."""
    variant, guidance = request.model.variant, request.settings.guidance
    if request.uses_cfg:
        return
    if variant.guidance == "none" and guidance > 1.0:
        log.warning("guidance %g is ignored: %s models run without CFG", guidance, variant.name)
    elif variant.uses_cfg:
        log.info(
            "guidance %g: CFG is off for this %s model (one pass per step, the negative prompt unused); "
            "use guidance > 1 (about 4) for true CFG",
            guidance,
            variant.name,
        )


def _check_editing(start, strength, mask, settings: SampleSettings) -> None:
    check_strength(strength, "strength (denoise)")
    if start is None:
        if mask is not None:
            raise Flux2Error("an inpaint mask needs the source image's latent to start from: connect it")
        if strength < 1.0:
            raise Flux2Error(f"strength {strength:g} < 1 needs an image (latent) to start from: connect one")
        return
    grid = settings.grid
    expected = (FLUX2.latent_channels, *grid)
    if (
        start.ndim != 4
        or tuple(start.shape[1:]) != expected
        or start.shape[0] not in (1, settings.batch_size)
    ):
        raise Flux2Error(
            f"the start latent has shape {list(start.shape)}, not [1 or {settings.batch_size}, "
            f"{', '.join(map(str, expected))}] for {settings.width}x{settings.height}: encode the image at "
            "the output size"
        )
    tokens = grid[0] * grid[1]
    if mask is not None and (
        mask.ndim != 3
        or tuple(mask.shape[1:]) != (tokens, 1)
        or mask.shape[0] not in (1, settings.batch_size)
    ):
        raise Flux2Error(
            f"the inpaint mask has shape {list(mask.shape)}, not [1 or {settings.batch_size}, {tokens}, 1] "
            f"for the {grid[1]}x{grid[0]} latent grid: make it with editing.latent_mask"
        )
