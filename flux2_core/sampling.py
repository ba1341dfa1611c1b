"""Sampling: the empirical-mu schedule, noise, packing, and the Euler loop (plain, true CFG, KV-cached).

Conventions (BFL, diffusers and ComfyUI agree): x_sigma = (1 - sigma) x0 + sigma noise, the model predicts
v = noise - x0, and each step is x <- x + (sigma_next - sigma) v, ending at sigma = 0. Latents stay float32
between steps and the timestep goes to the model as float32 sigma (ComfyUI's choice; BFL and diffusers round
it to bf16 first, and do so differently from each other). Noise is drawn on the CPU in float32 from
``torch.Generator("cpu").manual_seed(seed)``, so a seed gives the same image on every device, as in ComfyUI.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .configs import TEXT_ENCODER_FOR_CONTEXT
from .errors import Flux2Error
from .kv_cache import RefKVCache
from .loading import Flux2Model
from .references import ReferenceLatents
from .rope import image_ids, text_ids

log = logging.getLogger(__name__)

MIN_SIZE = 64
SIZE_MULTIPLE = 16  # 8x VAE downscale, then 2x2 patches
LATENT_CHANNELS = 128

StepCallback = Callable[
    [int, int, torch.Tensor], None
]  # (step done, total steps, predicted x0 [B, 128, h, w])


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
    mu = compute_empirical_mu(image_seq_len, num_steps)
    t = torch.linspace(1, 0, num_steps + 1, dtype=torch.float32)
    sigmas = math.exp(mu) / (math.exp(mu) + (1 / t[:-1] - 1))
    return torch.cat([sigmas, torch.zeros(1)])


def check_size(width: int, height: int) -> None:
    for name, value in (("width", width), ("height", height)):
        if value < MIN_SIZE or value % SIZE_MULTIPLE:
            raise Flux2Error(
                f"{name} {value} is not allowed: use a multiple of {SIZE_MULTIPLE} of at least {MIN_SIZE} "
                f"(e.g. {max(MIN_SIZE, value // SIZE_MULTIPLE * SIZE_MULTIPLE)})"
            )


def make_noise(batch_size: int, height: int, width: int, seed: int) -> torch.Tensor:
    """[B, 128, H/16, W/16] float32 CPU noise for a ``width x height`` image."""
    generator = torch.Generator("cpu").manual_seed(seed)
    shape = (batch_size, LATENT_CHANNELS, height // SIZE_MULTIPLE, width // SIZE_MULTIPLE)
    return torch.randn(shape, generator=generator, dtype=torch.float32)


def pack(latent: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] -> [B, h * w, C], row-major."""
    return latent.flatten(2).transpose(1, 2)


def unpack(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[B, h * w, C] -> [B, C, h, w] for a latent grid of ``height x width`` tokens."""
    return tokens.transpose(1, 2).reshape(tokens.shape[0], -1, height, width)


def check_conditioning(model: Flux2Model, conditioning: torch.Tensor, what: str = "conditioning") -> None:
    """The text encoder must match the DiT: klein 4B <-> Qwen3-4B (7680), klein 9B <-> Qwen3-8B (12288)."""
    need, got = model.config.context_in_dim, conditioning.shape[-1]
    if need != got:
        wanted = TEXT_ENCODER_FOR_CONTEXT.get(need, f"a text encoder of width {need // 3}")
        given = TEXT_ENCODER_FOR_CONTEXT.get(got, f"a text encoder of width {got // 3}")
        raise Flux2Error(
            f"{model.name} needs {wanted}: {need}-wide conditioning, this {what} gives {got} "
            f"(made by {given}); "
            f"load {wanted} instead"
        )


def estimate_memory(model: Flux2Model, settings: SampleSettings, references: ReferenceLatents | None) -> int:
    """Rough peak bytes of activations (plus the KV cache) for one sampling run, beyond the weights.

    A single block holds its fused input projection (9 x hidden per token) next to the residual stream, the
    modulated input, the float32 RoPE'd q and k, the attention output and the MLP product: about 24
    hidden-wide rows per token at the peak.
    """
    config = model.config
    itemsize = torch.finfo(model.transformer.dtype).bits // 8
    num_ref = references.num_tokens if references is not None else 0
    tokens = 512 + (settings.height // SIZE_MULTIPLE) * (settings.width // SIZE_MULTIPLE) + num_ref
    activations = settings.batch_size * tokens * config.hidden_size * 24 * itemsize
    kv_cache = 0
    if model.variant.kv_cache:  # K and V of every reference token in every block, kept for the whole run
        kv_cache = 2 * num_ref * config.hidden_size * (config.depth + config.depth_single_blocks) * itemsize
    return activations + kv_cache


def sample(
    model: Flux2Model,
    positive: torch.Tensor,
    settings: SampleSettings,
    negative: torch.Tensor | None = None,
    references: ReferenceLatents | None = None,
    callback: StepCallback | None = None,
    interrupt: Callable[[], None] | None = None,
) -> torch.Tensor:
    """Generate latents [B, 128, H/16, W/16] (float32, CPU) from text conditioning [1 or B, T, C].

    ``callback`` gets each finished step with the predicted clean latent (for previews); ``interrupt`` is
    called before every block and may raise to stop the run.
    """
    check_size(settings.width, settings.height)
    if settings.batch_size < 1:
        raise Flux2Error(f"batch size is {settings.batch_size}: use at least 1")
    check_conditioning(model, positive)
    use_cfg = model.variant.uses_cfg and settings.guidance > 1.0
    if use_cfg and negative is None:
        raise Flux2Error(
            f"the {model.variant.name} model with guidance {settings.guidance:g} needs a negative "
            "conditioning: connect one (an empty prompt is the usual choice) or set guidance to 1"
        )
    if use_cfg:
        check_conditioning(model, negative, "negative conditioning")
    elif settings.guidance > 1.0:
        log.warning(
            "guidance %g is ignored: %s models run without CFG", settings.guidance, model.variant.name
        )
    grid = (settings.height // SIZE_MULTIPLE, settings.width // SIZE_MULTIPLE)
    conds = [positive] + ([negative] if use_cfg else [])
    denoiser = _Denoiser(model, conds, settings, references, grid)
    sigmas = get_sigmas(settings.steps, grid[0] * grid[1]).tolist()
    # Latents stay float32 on the model's device for the whole run; the noise is drawn on the CPU.
    x = pack(make_noise(settings.batch_size, settings.height, settings.width, settings.seed)).to(
        model.transformer.device
    )
    model.transformer.on_block = interrupt
    try:
        for i in range(settings.steps):
            v = denoiser(x, sigmas[i])
            if callback is not None:
                callback(i + 1, settings.steps, unpack(x - sigmas[i] * v, *grid))
            x = x + (sigmas[i + 1] - sigmas[i]) * v
    finally:
        model.transformer.on_block = None
    return unpack(x, *grid).cpu()


class _Denoiser:
    """The velocity of one step: plain, true CFG (v_u + g (v_c - v_u)), or KV-cached.

    With the KV model the first call extracts the reference K/V; every later call, including the negative
    pass of the first step, reuses them: they depend on neither the text nor the timestep.
    """

    def __init__(self, model: Flux2Model, conds, settings: SampleSettings, references, grid):
        self.net = model.transformer
        self.guidance = settings.guidance
        device, dtype = self.net.device, self.net.dtype
        self.x_ids = image_ids(*grid)  # ids stay on the CPU: the model turns them into a cached RoPE table
        self.conds = [(_batch(c, settings.batch_size).to(device, dtype), text_ids(c.shape[1])) for c in conds]
        self.refs = None
        if references is not None and len(references):  # tokens [1, R, C]: shared by the whole batch
            self.refs = (references.tokens.to(device, dtype), references.ids)
        self.use_kv = model.variant.kv_cache and self.refs is not None
        self.cache: RefKVCache | None = None

    def __call__(self, x: torch.Tensor, sigma: float) -> torch.Tensor:
        x_in = x.to(self.net.dtype)
        t = torch.full((x.shape[0],), sigma, dtype=torch.float32, device=x.device)
        velocities = []
        with torch.inference_mode():
            for ctx, ctx_ids in self.conds:
                if self.use_kv and self.cache is None:
                    v, self.cache = self.net.forward_kv_extract(x_in, self.x_ids, t, ctx, ctx_ids, *self.refs)
                elif self.use_kv:
                    v = self.net.forward_kv_cached(x_in, self.x_ids, t, ctx, ctx_ids, self.cache)
                elif self.refs is not None:
                    v = self.net(x_in, self.x_ids, t, ctx, ctx_ids, *self.refs)
                else:
                    v = self.net(x_in, self.x_ids, t, ctx, ctx_ids)
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
