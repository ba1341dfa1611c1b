"""The rectified-flow sampling loop every model of the pack runs: noise, packing, Euler over sigmas.

Conventions (BFL, diffusers and ComfyUI agree): x_sigma = (1 - sigma) x0 + sigma noise, the model predicts
v = noise - x0, and each step is x <- x + (sigma_next - sigma) v, ending at sigma = 0. A *denoiser* is any
``(x, sigma) -> v`` (FLUX.2's is ``denoiser.Flux2Denoiser``, FLUX.1 Fill's
``flux1.sampling.FillDenoiser``); the loop knows nothing of models. Its hooks:

- a start latent and a truncated schedule (img2img): ``start_from`` noises the start latent to the first
  sigma, ``truncate`` keeps the last ``strength`` of the schedule;
- a schedule given as a list (``given_sigmas``), used instead of a model's own;
- ``blend(x, sigma_next)`` after every step (inpaint: keep the known region at the current noise level);
- ``callback(step, total, x0)`` after every step with the predicted clean latent (progress, previews,
  interruption); per-block interruption is a hook on the model's blocks (``hooks.before_each``).

Latents stay float32 between steps. Noise is drawn on the CPU in float32 from
``torch.Generator("cpu").manual_seed(seed)``, so a seed gives the same image on every device, as in ComfyUI.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch

from .configs import FLUX2, Family
from .errors import Flux2Error
from .limits import check_request

Denoiser = Callable[[torch.Tensor, float], torch.Tensor]  # (x [B, N, C] float32, sigma) -> v
StepCallback = Callable[[int, int, torch.Tensor], None]  # (step done, total steps, predicted x0)
Blend = Callable[[torch.Tensor, float], torch.Tensor]  # (x after a step, its sigma) -> x


def make_noise(batch_size: int, height: int, width: int, seed: int, family: Family = FLUX2) -> torch.Tensor:
    """[B, C, H/m, W/m] float32 CPU noise of the family's LATENT for a ``width x height`` image (m: pixels per
    latent cell; FLUX.2 [B, 128, H/16, W/16], FLUX.1 [B, 16, H/8, W/8])."""
    generator = torch.Generator("cpu").manual_seed(seed)
    m = family.latent_scale
    shape = (batch_size, family.noise_channels or family.latent_channels, height // m, width // m)
    return torch.randn(shape, generator=generator, dtype=torch.float32)


def pack(latent: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] -> [B, h * w, C], row-major."""
    return latent.flatten(2).transpose(1, 2)


def unpack(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """[B, h * w, C] -> [B, C, h, w] for a latent grid of ``height x width`` tokens."""
    return tokens.transpose(1, 2).reshape(tokens.shape[0], -1, height, width)


def shifted_sigmas(num_steps: int, mu: float) -> torch.Tensor:
    """[num_steps + 1] float32 sigmas from 1 to 0: exp(mu) / (exp(mu) + 1/t - 1) on t = linspace(1, 0), the
    time shift of BFL's ``get_schedule`` (exponent 1); ``mu`` is the family's shift for the image size."""
    t = torch.linspace(1, 0, num_steps + 1, dtype=torch.float32)
    sigmas = math.exp(mu) / (math.exp(mu) + (1 / t[:-1] - 1))
    return torch.cat([sigmas, torch.zeros(1)])


def given_sigmas(values, what: str = "sigmas") -> tuple[float, ...]:
    """A schedule given as a list of sigmas, used as given (as ComfyUI's ManualSigmas with
    SamplerCustomAdvanced): float32 values, a final 0 appended when the list does not end there. Refused by
    name: fewer than two values, a value outside [0, 1], a list that does not decrease."""
    listed = [float(v) for v in (values.flatten().tolist() if isinstance(values, torch.Tensor) else values)]
    example = "e.g. 1.0, 0.75, 0.5, 0.25, 0"
    if len(listed) < 2:
        raise Flux2Error(
            f"{what} {listed}: give at least two values, from the level the run starts at down to 0 "
            f"({example})"
        )
    for v in listed:
        if not (math.isfinite(v) and 0.0 <= v <= 1.0):
            raise Flux2Error(
                f"{what}: {v:g} is outside [0, 1]: every sigma is a noise level from 1 to 0 ({example})"
            )
    for above, below in zip(listed, listed[1:]):
        if not below < above:
            raise Flux2Error(
                f"{what} are not decreasing ({above:g} then {below:g}): each value must be below the one "
                f"before it ({example})"
            )
    sigmas = torch.tensor(listed, dtype=torch.float32).tolist()
    return tuple(sigmas + ([0.0] if sigmas[-1] != 0.0 else []))


def skipped_steps(steps: int, strength: float) -> int:
    """How many of ``steps`` img2img at ``strength`` skips: ``int(steps - steps * strength)``, the formula of
    diffusers' ``get_timesteps``."""
    return int(max(steps - min(steps * strength, steps), 0))


def truncate(sigmas: list[float], strength: float) -> list[float]:
    """The last ``strength`` of a schedule (img2img): its first ``skipped_steps`` steps left out (the schedule
    itself is the full one's)."""
    return sigmas[skipped_steps(len(sigmas) - 1, strength) :]


def start_from(noise: torch.Tensor, start: torch.Tensor | None, sigma: float) -> torch.Tensor:
    """The latent at ``sigma`` on the way from ``start`` to ``noise``; pure noise without a start."""
    if start is None:
        return noise
    return (1.0 - sigma) * start.to(noise) + sigma * noise


def euler(
    denoise: Denoiser,
    x: torch.Tensor,
    sigmas: list[float],
    callback: StepCallback | None = None,
    blend: Blend | None = None,
) -> torch.Tensor:
    """Integrate from ``sigmas[0]`` to ``sigmas[-1]``: one denoiser call per step."""
    steps = len(sigmas) - 1
    for i in range(steps):
        v = denoise(x, sigmas[i])
        if callback is not None:
            callback(i + 1, steps, x - sigmas[i] * v)
        x = x + (sigmas[i + 1] - sigmas[i]) * v
        if blend is not None:
            x = blend(x, sigmas[i + 1])
    return x


# The settings of one run and its schedule: BFL's empirical-mu shift on the image's token count, or a list of
# sigmas given as is.


@dataclass(frozen=True)
class SampleSettings:
    width: int
    height: int
    steps: int
    guidance: float
    seed: int
    batch_size: int = 1
    sigmas: tuple[float, ...] | None = None  # a given schedule (``with_sigmas``), else the empirical-mu one

    def check(self) -> None:
        """Every number, with the limit and what to change in the message (``limits.check_request``)."""
        check_request(self.width, self.height, self.steps, self.guidance, self.seed, self.batch_size)
        if self.sigmas is not None and (
            given_sigmas(self.sigmas) != tuple(self.sigmas) or len(self.sigmas) != self.steps + 1
        ):
            raise Flux2Error(
                "a given schedule sets sigmas and steps together: use SampleSettings.with_sigmas()"
            )

    def with_sigmas(self, sigmas) -> SampleSettings:
        """These settings running ``sigmas`` as given (``flow.given_sigmas``: checked, a final 0 appended):
        steps becomes its number of steps, so img2img's strength and step ranges count the list's steps."""
        given = given_sigmas(sigmas)
        return replace(self, steps=len(given) - 1, sigmas=given)

    def schedule(self) -> list[float]:
        """The sigmas of a run from pure noise, ``steps + 1`` values ending at 0."""
        if self.sigmas is not None:
            return list(self.sigmas)
        return get_sigmas(self.steps, self.grid[0] * self.grid[1]).tolist()

    @property
    def grid(self) -> tuple[int, int]:
        """(rows, columns) of the latent grid."""
        m = FLUX2.size_multiple
        return self.height // m, self.width // m


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


def inpaint_blend(source: torch.Tensor, mask: torch.Tensor, noise: torch.Tensor) -> Blend:
    """After a step to ``sigma``: keep the sampled latent inside the mask, the source noised to ``sigma``
    outside it (packed tokens: source and noise [B, N, C], mask [B, N, 1])."""

    def blend(x: torch.Tensor, sigma: float) -> torch.Tensor:
        known = (1.0 - sigma) * source + sigma * noise
        return (1.0 - mask) * known + mask * x

    return blend
