"""FLUX.2 [klein] sampling: the empirical-mu schedule, input checks, the klein denoiser, ``sample``.

The denoiser gives the velocity of one step for the variant's guidance kind: one pass (distilled, KV), true
CFG ``v_u + g (v_c - v_u)`` with a negative prompt (base), or the guidance value fed to the model (dev). The
KV model runs every step, the first included, against the references' K/V, computed once before the loop (or
handed in, to reuse across runs). The loop itself is ``flow.euler``. The timestep goes to the model as float32
sigma (ComfyUI's choice; BFL and diffusers round it to bf16 first, and do so differently from each other).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from .configs import FLUX2, TEXT_ENCODER_FOR_CONTEXT
from .devices.streaming import streamer_of
from .dit.kv_cache import RefKVCache
from .dit.rope import image_ids, reference_ids, text_ids
from .dit.step_cache import StepCache
from .dit.transformer import Flux2Model
from .editing import inpaint_blend
from .errors import Flux2Error
from .flow import StepCallback, euler, make_noise, pack, shifted_sigmas, start_from, truncate, unpack
from .hooks import before_each, calling, copies_released
from .limits import check_request
from .lora import DIT, patched
from .references import ReferenceLatents

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SampleSettings:
    width: int
    height: int
    steps: int
    guidance: float
    seed: int
    batch_size: int = 1


def compute_empirical_mu(image_seq_len: int, num_steps: int) -> float:
    """Schedule shift fitted by BFL on the noisy-token count (references are not counted)."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    if image_seq_len > 4300:
        return a2 * image_seq_len + b2
    m_200 = a2 * image_seq_len + b2
    m_10 = a1 * image_seq_len + b1
    a = (m_200 - m_10) / 190.0
    return a * num_steps + (m_200 - 200.0 * a)


def get_sigmas(num_steps: int, image_seq_len: int) -> torch.Tensor:
    """[num_steps + 1] float32 sigmas from 1 to 0: exp(mu) / (exp(mu) + 1/t - 1) on t = linspace(1, 0)."""
    if num_steps < 1:
        raise Flux2Error(f"steps is {num_steps}: use at least 1 step")
    return shifted_sigmas(num_steps, compute_empirical_mu(image_seq_len, num_steps))


def output_size(width: int | None, height: int | None, reference_size: tuple[int, int] | None = None):
    """(width, height) to sample: a side left at 0/None takes the first reference's (processed) size, or
    the family's default size without references."""
    default = reference_size or (FLUX2.default_size, FLUX2.default_size)
    return width or default[0], height or default[1]


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
    model: Flux2Model, settings: SampleSettings, references: ReferenceLatents | int | None
) -> int:
    """Rough peak bytes of activations (plus the KV cache, plus the device copies of streamed blocks) for one
    sampling run of a loaded model; ``references`` may also be just their number of tokens."""
    num_ref = references if isinstance(references, int) else (references.num_tokens if references else 0)
    streamer = streamer_of(model.transformer)
    streamed = streamer.working_bytes if streamer is not None else 0
    return sampling_memory(model.config, model.variant, model.transformer.dtype, settings, num_ref) + streamed


ACTIVATION_ROWS = 24  # hidden-wide rows a token holds at a step's peak (``sampling_memory``)


def sampling_memory(
    config, variant, dtype: torch.dtype, settings: SampleSettings, num_ref_tokens: int
) -> int:
    """Rough peak bytes of activations (plus the KV cache) beyond the weights, from shapes alone.

    A single block holds its fused input projection (9 x hidden per token) next to the residual stream, the
    modulated input, the float32 RoPE'd q and k, the attention output and the MLP product: about 24
    hidden-wide rows per token at the peak.
    """
    m = FLUX2.size_multiple
    itemsize = torch.finfo(dtype).bits // 8
    tokens = FLUX2.max_text_tokens + (settings.height // m) * (settings.width // m) + num_ref_tokens
    activations = settings.batch_size * tokens * config.hidden_size * ACTIVATION_ROWS * itemsize
    kv_cache = 0
    if variant.kv_cache:  # K and V of every reference token in every block, kept for the whole run
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


def sample(
    model: Flux2Model,
    positive: torch.Tensor,
    settings: SampleSettings,
    negative: torch.Tensor | None = None,
    references: ReferenceLatents | None = None,
    callback: StepCallback | None = None,
    interrupt: Callable[[], None] | None = None,
    start: torch.Tensor | None = None,
    strength: float = 1.0,
    kv_cache: RefKVCache | None = None,
    mask: torch.Tensor | None = None,
    step_cache: float | StepCache = 0.0,
) -> torch.Tensor:
    """Generate latents [B, 128, H/16, W/16] (float32, CPU) from text conditioning [1 or B, T, C].

    ``callback`` gets each finished step with the predicted clean latent (for previews); ``interrupt`` is
    called before every block and may raise to stop the run. ``start`` (a latent of the output's shape) and
    ``strength`` < 1 begin part-way down the schedule from that latent instead of from pure noise.
    ``kv_cache`` is the references' K/V from ``encode_reference_kv`` (KV model), computed here if not given.
    ``mask`` (packed [1 or B, h * w, 1] from ``editing.latent_mask``, 1 = repaint) inpaints ``start``: after
    every step the latent outside the mask is ``start`` noised to the new sigma. ``step_cache`` is the
    First-Block Cache threshold (0: off) or a ``StepCache`` to read what it did from (``dit.step_cache``).
    """
    check_request(*settings_numbers(settings))
    check_conditioning(model, positive)
    model.variant.check_references(len(references) if references is not None else 0)
    use_cfg = model.variant.uses_cfg and settings.guidance > 1.0
    if use_cfg and negative is None:
        raise Flux2Error(
            f"the {model.variant.name} model with guidance {settings.guidance:g} needs a negative "
            "conditioning: connect one (an empty prompt is the usual choice) or set guidance to 1"
        )
    if use_cfg:
        check_conditioning(model, negative, "negative conditioning")
    elif model.variant.guidance == "none" and settings.guidance > 1.0:
        log.warning(
            "guidance %g is ignored: %s models run without CFG", settings.guidance, model.variant.name
        )
    elif model.variant.uses_cfg:
        log.info(
            "guidance %g: CFG is off for this %s model (one pass per step, the negative prompt unused); "
            "use guidance > 1 (about 4) for true CFG",
            settings.guidance,
            model.variant.name,
        )
    m = FLUX2.size_multiple
    grid = (settings.height // m, settings.width // m)
    conds = [positive] + ([negative] if use_cfg else [])
    if model.variant.kv_cache and references is not None and len(references) and kv_cache is None:
        kv_cache = encode_reference_kv(model, references)
    cache = StepCache.of(step_cache)
    cache.start(len(conds))
    denoise = KleinDenoiser(
        model, conds, settings, references, grid, kv_cache if model.variant.kv_cache else None, cache
    )
    _check_editing(start, strength, mask, settings, grid)
    sigmas = truncate(get_sigmas(settings.steps, grid[0] * grid[1]).tolist(), strength)
    # Latents stay float32 on the model's device for the whole run; the noise is drawn on the CPU.
    device = model.transformer.device
    noise = pack(make_noise(settings.batch_size, settings.height, settings.width, settings.seed)).to(device)
    source = pack(start.float()).to(device).expand_as(noise) if start is not None else None
    x = start_from(noise, source, sigmas[0])
    blend = None if mask is None else inpaint_blend(source, mask.float().to(device), noise)
    report = None if callback is None else (lambda step, total, x0: callback(step, total, unpack(x0, *grid)))
    with model_run(model, interrupt):
        x = euler(denoise, x, sigmas, report, blend)
    if cache.passes:
        log.info("%s", cache.describe())
    if not torch.isfinite(x).all():
        raise Flux2Error(
            "sampling produced NaN or infinite values, so the image would be garbage. Likely causes: weights "
            "holding NaN/inf (a corrupt or badly converted file: download it again), float16 overflowing "
            "(use bfloat16 or float32), or an extreme guidance value (use about 4 for base models)"
        )
    return unpack(x, *grid).cpu()


def latent_velocity(
    model: Flux2Model,
    x: torch.Tensor,
    sigma: torch.Tensor,
    context: torch.Tensor,
    references: list[torch.Tensor] | None = None,
    guidance: torch.Tensor | None = None,
    kv_cache: RefKVCache | None = None,
) -> torch.Tensor:
    """One DiT call on latents, the way native ComfyUI calls its FLUX.2 model: ``x`` [B, 128, h, w] at noise
    level ``sigma`` [B] -> the velocity (noise - x0) [B, 128, h, w], float32, on ``x``'s device.

    ``context`` [B, L, C] (any L), ``references`` [B or 1, 128, h_k, w_k] latents at time offsets 10, 20,
    ... (native's "index" method, ours), ``guidance`` [B] the embedded value (dev; ignored by klein),
    ``kv_cache`` the KV model's reference K/V (``references`` then unused). LoRAs, streaming and interrupt
    hooks are the caller's, for the whole run."""
    net = model.transformer
    device, dtype = net.device, net.dtype
    b, _, h, w = x.shape
    tokens, x_ids = pack(x).to(device, dtype), image_ids(h, w)
    t = sigma.float().to(device).reshape(-1).expand(b)
    ctx = context.to(device, dtype)
    kw = {}
    if guidance is not None and net.config.guidance_embed:
        kw["guidance"] = guidance.float().to(device).reshape(-1).expand(b)
    ctx_ids = text_ids(ctx.shape[1])
    with torch.inference_mode():
        if kv_cache is not None:
            v = net.forward_kv_cached(tokens, x_ids, t, ctx, ctx_ids, kv_cache, **kw)
        elif references:
            refs = torch.cat([pack(lat) for lat in references], dim=1).to(device, dtype)
            ids = reference_ids([tuple(lat.shape[-2:]) for lat in references])
            v = net(tokens, x_ids, t, ctx, ctx_ids, refs, ids, **kw)
        else:
            v = net(tokens, x_ids, t, ctx, ctx_ids, **kw)
    return unpack(v.float(), h, w).to(x.device)


def _check_editing(start, strength, mask, settings: SampleSettings, grid) -> None:
    if not 0.0 <= strength <= 1.0 or math.isnan(strength):
        raise Flux2Error(
            f"strength (denoise) is {strength}: use a value from 0 (keep the image) to 1 (repaint)"
        )
    if start is None:
        if mask is not None:
            raise Flux2Error("an inpaint mask needs the source image's latent to start from: connect it")
        if strength < 1.0:
            raise Flux2Error(f"strength {strength:g} < 1 needs an image (latent) to start from: connect one")
        return
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


def settings_numbers(settings: SampleSettings) -> tuple:
    """(width, height, steps, guidance, seed, batch size) in the order ``limits.check_request`` takes."""
    s = settings
    return s.width, s.height, s.steps, s.guidance, s.seed, s.batch_size


class KleinDenoiser:
    """The velocity of one step (see the module docstring for the guidance kinds and the KV model)."""

    def __init__(
        self, model: Flux2Model, conds, settings: SampleSettings, references, grid, kv_cache=None, cache=None
    ):
        self.net = model.transformer
        self.cache = cache or StepCache()  # one FirstBlockCache per pass (conditional, unconditional)
        self.guidance = settings.guidance
        device, dtype = self.net.device, self.net.dtype
        self.x_ids = image_ids(*grid)  # ids stay on the CPU: the model turns them into a cached RoPE table
        self.conds = [(_batch(c, settings.batch_size).to(device, dtype), text_ids(c.shape[1])) for c in conds]
        self.refs = None
        if references is not None and len(references) and kv_cache is None:  # [1, R, C]: the whole batch's
            self.refs = (references.tokens.to(device, dtype), references.ids)
        self.kv_cache = kv_cache
        self.embedded = None
        if model.variant.embeds_guidance:
            self.embedded = torch.full((settings.batch_size,), settings.guidance, dtype=torch.float32)

    def __call__(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        x_in = x.to(self.net.dtype)
        t = torch.full((x.shape[0],), sigma, dtype=torch.float32, device=x.device)
        g = self.embedded.to(x.device) if self.embedded is not None else None
        velocities = []
        with torch.inference_mode():
            for i, (ctx, ctx_ids) in enumerate(self.conds):
                step = self.cache.pass_cache(i)  # None when off: the call is the one without a cache
                kw = {"guidance": g} if step is None else {"guidance": g, "step_cache": step}
                if self.kv_cache is not None:
                    v = self.net.forward_kv_cached(x_in, self.x_ids, t, ctx, ctx_ids, self.kv_cache, **kw)
                elif self.refs is not None:
                    v = self.net(x_in, self.x_ids, t, ctx, ctx_ids, *self.refs, **kw)
                else:
                    v = self.net(x_in, self.x_ids, t, ctx, ctx_ids, **kw)
                velocities.append(v.float())
        if len(velocities) == 2:
            v_cond, v_uncond = velocities
            return v_uncond + self.guidance * (v_cond - v_uncond)
        return velocities[0]


def _batch(conditioning: torch.Tensor, batch_size: int) -> torch.Tensor:
    if conditioning.shape[0] == batch_size:
        return conditioning
    if conditioning.shape[0] == 1:
        return conditioning.expand(batch_size, -1, -1)
    raise Flux2Error(
        f"the conditioning holds {conditioning.shape[0]} prompts but the batch size is {batch_size}: "
        "encode one prompt, or as many as the batch size"
    )
