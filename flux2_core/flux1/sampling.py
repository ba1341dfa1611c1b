"""FLUX.1 Fill [dev] sampling: the linear-mu schedule, the Fill denoiser and ``sample_fill``.

One model pass per step with the guidance value embedded (no CFG, no negative prompt). The loop is
``flow.euler``; noise is ComfyUI's: ``randn([B, 16, H/8, W/8])`` from ``torch.Generator("cpu")`` seeded with
the seed, in float32, so a seed gives native ComfyUI's image. The timestep goes to the model as float32
sigma (ComfyUI; BFL and diffusers round it through bfloat16). The result is ComfyUI's FLUX.1 ``LATENT``: the
raw VAE-space latent [B, 16, H/8, W/8], which native ``VAEDecode`` decodes with ``ae.safetensors``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..configs import FLUX1
from ..dit.call import call_extras
from ..dit.step_cache import StepCache
from ..errors import Flux2Error
from ..flow import StepCallback, euler, make_noise, shifted_sigmas, start_from, truncate
from ..hooks import before_each, calling, copies_released
from ..limits import MAX_FILL_GUIDANCE, check_request
from ..sampling_checks import activation_bytes, batched, check_finite, check_strength
from .config import DEFAULT_GUIDANCE, DEFAULT_STEPS, LATENT_FORMAT, schedule_shift
from .encoders import FillConditioning
from .fill import FillInputs, pack_latent, unpack_latent
from .transformer import Flux1FillModel, image_ids

log = logging.getLogger(__name__)

NAN_CAUSES = (
    ": the weights hold NaN/inf (download the file again) or the model ran in float16 (use bfloat16 or "
    "float32)"
)
PROMPTS_FOR_BATCH = "{given} prompts for a batch of {batch}: give one, or as many as the batch size"
IMAGES_FOR_BATCH = "{given} masked images for a batch of {batch}: give one, or as many as the batch size"


@dataclass(frozen=True)
class FillSettings:
    seed: int
    steps: int = DEFAULT_STEPS
    guidance: float = DEFAULT_GUIDANCE
    batch_size: int = 1
    denoise: float = 1.0  # below 1: start part-way down the schedule from the (unmasked) image


def fill_sigmas(num_steps: int, image_tokens: int) -> torch.Tensor:
    """[num_steps + 1] sigmas from 1 to 0 with mu linear in the image-token count (BFL ``get_schedule``)."""
    if num_steps < 1:
        raise Flux2Error(f"steps is {num_steps}: use at least 1 step")
    return shifted_sigmas(num_steps, schedule_shift(image_tokens))


def check_fill_conditioning(model: Flux1FillModel, positive: FillConditioning) -> None:
    """The text encoders must give what the DiT reads: T5-XXL (4096) tokens and a CLIP-L (768) vector."""
    config = model.config
    got = (positive.t5.shape[-1], positive.pooled.shape[-1])
    if got != (config.context_in_dim, config.vec_in_dim):
        raise Flux2Error(
            f"{model.name} reads {config.context_in_dim}-wide T5 states and a {config.vec_in_dim}-wide CLIP "
            f"vector, but this conditioning has {got[0]} and {got[1]}: encode the prompt with the T5-XXL and "
            "CLIP-L text encoders (t5xxl_fp16.safetensors, clip_l.safetensors)"
        )


def fill_memory(model: Flux1FillModel, width: int, height: int, batch_size: int) -> int:
    """Rough peak bytes of one step's activations beyond the weights of a loaded model."""
    return fill_activation_bytes(model.config, model.transformer.dtype, width, height, batch_size)


def fill_activation_bytes(config, dtype: torch.dtype, width: int, height: int, batch_size: int) -> int:
    """The same from shapes alone: as the FLUX.2 estimate, about ``ACTIVATION_ROWS`` hidden-wide rows per
    token at the peak (``sampling_checks``)."""
    m = FLUX1.size_multiple  # pixels per token: 8 per latent cell, 2x2 cells per token
    tokens = FLUX1.max_text_tokens + (width // m) * (height // m)
    return activation_bytes(batch_size, tokens, config.hidden_size, dtype)


def sample_fill(
    model: Flux1FillModel,
    positive: FillConditioning,
    fill: FillInputs,
    settings: FillSettings,
    callback: StepCallback | None = None,
    interrupt: Callable[[], None] | None = None,
    step_cache: float | StepCache = 0.0,
) -> torch.Tensor:
    """Fill latents: ComfyUI's FLUX.1 ``LATENT`` [B, 16, H/8, W/8] (raw VAE space), float32 on the CPU.

    ``callback(step, total, x0)`` gets each finished step's predicted clean latent in the model's (scaled)
    space, [B, 16, H/8, W/8]; ``interrupt`` is called before every block and may raise to stop the run.
    ``step_cache``: the First-Block Cache threshold (0: off) or a ``StepCache`` (``dit.step_cache``).
    """
    width, height = fill.size
    s = settings
    check_request(width, height, s.steps, s.guidance, s.seed, s.batch_size, MAX_FILL_GUIDANCE)
    check_fill_conditioning(model, positive)
    check_strength(s.denoise, "denoise")
    if s.denoise < 1.0 and fill.source is None:
        raise Flux2Error(f"denoise {s.denoise:g} < 1 starts from the image: encode it with the fill inputs")
    net = model.transformer
    device = net.device
    rows, cols = fill.grid
    sigmas = truncate(fill_sigmas(s.steps, rows * cols).tolist(), s.denoise)
    noise = pack_latent(make_noise(s.batch_size, height, width, s.seed, FLUX1)).to(device)
    source = fill.source.to(device).expand_as(noise) if s.denoise < 1.0 else None
    x = start_from(noise, source, sigmas[0])
    cache = StepCache.of(step_cache)
    cache.start(1)
    denoise = FillDenoiser(model, positive, fill, s, cache.pass_cache(0))
    report = None
    if callback is not None:
        report = lambda step, total, x0: callback(step, total, unpack_latent(x0, fill.grid))  # noqa: E731
    with copies_released(net), before_each(net.blocks(), calling(interrupt)):
        x = euler(denoise, x, sigmas, report)
    check_finite(x, NAN_CAUSES)
    log.info("%s: %dx%d, %d steps, guidance %g, seed %d", model.name, width, height, len(sigmas) - 1,
             s.guidance, s.seed)  # fmt: skip
    if cache.passes:
        log.info("%s", cache.describe())
    return LATENT_FORMAT.from_latent(unpack_latent(x, fill.grid)).cpu()


class FillDenoiser:
    """The velocity of one step: noisy tokens | fill tokens -> the DiT, with the embedded guidance."""

    def __init__(
        self, model: Flux1FillModel, positive: FillConditioning, fill: FillInputs, s: FillSettings, cache=None
    ):
        self.net = model.transformer
        self.cache = cache  # a FirstBlockCache, or None
        device, dtype = self.net.device, self.net.dtype
        batch = s.batch_size
        self.ctx = batched(positive.t5, batch, PROMPTS_FOR_BATCH).to(device, dtype)
        self.pooled = batched(positive.pooled, batch, PROMPTS_FOR_BATCH).to(device, dtype)
        self.cond = batched(fill.tokens, batch, IMAGES_FOR_BATCH).to(device, dtype)
        self.x_ids = image_ids(*fill.grid)
        self.guidance = torch.full((batch,), s.guidance, dtype=torch.float32)

    def __call__(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        t = torch.full((x.shape[0],), sigma, dtype=torch.float32, device=x.device)
        extras = call_extras(pooled=self.pooled, guidance=self.guidance, step_cache=self.cache)
        with torch.inference_mode():
            tokens = torch.cat([x.to(self.cond.dtype), self.cond], dim=-1)
            v = self.net(tokens, self.x_ids, t, self.ctx, extras)
        return v.float()
