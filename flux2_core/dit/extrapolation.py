"""Position extrapolation: RoPE frequencies for images larger than the grid the DiT was trained on (DyPE).

FLUX.2 [klein] is trained up to about 4 MP, so a side of up to ``base`` pixels (default 2048, 128 tokens)
keeps today's positions exactly. Past it, each image axis (h and w, on its own) of ``N`` tokens against a base
of ``B`` tokens, scale ``s = N / B``, gets DyPE's blend of three frequency sets for its ``D / 2`` pairs (pair
``j`` rotates by ``theta ** (-2j / D)`` natively; a higher ``j`` is a lower frequency):

- native ``f_base``, NTK-scaled ``f_ntk`` (base ``theta * s ** (D / (D - 2))``), position-interpolated
  ``f_lin = f_base / s``;
- ``ramp(lo, hi)[j] = clamp((j - lo) / (hi - lo), 0, 1)`` with ``lo = floor(c(r_lo))``, ``hi = ceil(c(r_hi))``
  where ``c(r) = D ln(B / (2 pi r)) / (2 ln theta)`` is the pair that turns ``r`` times over ``B`` positions;
- ``f = f_lin ramp_beta + f_ntk (1 - ramp_beta)``, then ``f = f ramp_gamma + f_base (1 - ramp_gamma)``, with
  beta = (1.25, 0.75) and gamma = (16, 2) turns: high frequencies native, the middle NTK, the low ones PI;
- cos and sin of those axes are multiplied by the attention scale ``1 + 0.1 ln s`` (q and k are both rotated,
  so those dimensions' logits scale by its square).

The schedule is the upstream DyPE one (guyyariv/DyPE, FLUX ``get_1d_rotary_pos_embed``): the four turn counts
are multiplied by ``kappa = sigma ** 2``. Fewer turns move ``lo`` up, so as the noise falls more pairs come
back to native, and at ``sigma = 0`` every pair is native (only the attention scale stays): the first, noisy
steps lay out the whole picture with positions the model knows at the large scale, the last ones refine
detail at native frequencies. (The power form ``beta ** (2 sigma ** 2)`` of other packs keeps the low pairs
interpolated at sigma 0.) ``c(0)`` is infinite: every pair is then below ``lo``, so sigma 0 is native and
never NaN. Where a ramp's ``lo`` passes the last pair (for klein at the default base: the NTK -> PI ramp
below sigma 0.09, the native one below 0.03) the upstream code's clamp of ``hi`` alone turns that ramp over
and snaps its pairs to PI; here they stay below ``lo`` (NTK, then native), the ramp's own meaning and its
limit as sigma falls. klein's schedule at 2048^2 (mu 3.23) keeps every sampled sigma above 0.3 up to 50
steps, so its runs never reach that region; above it the frequencies are the upstream ones.

Only the image tokens' h and w axes change, for the noisy target and the references alike (the references'
positions are pixel-aligned with the target, so they share its frequencies); the time axis, the text axis
and every text token keep today's table. Frequencies and angles are float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..configs import FLUX2
from ..errors import Flux2Error

DEFAULT_BASE = 2048  # pixels per side the DiT handles natively (klein: trained to about 4 MP)
MIN_BASE, MAX_BASE = 256, 8192
BETA = (1.25, 0.75)  # turns over the base grid bounding the NTK -> PI ramp
GAMMA = (16.0, 2.0)  # turns bounding the native -> blended ramp
METHODS = ("off", "dype")
KV_AND_EXTRAPOLATION = (
    "position extrapolation changes the references' positions at every step, but the 9B-KV model keeps one "
    "set of reference K/V for the whole run: set position extrapolation to off (or the extrapolation base to "
    "at least the image's longer side), or use the 9B model"
)


@dataclass(frozen=True)
class PositionExtrapolation:
    """DyPE on the image axes longer than ``base`` pixels (a multiple of 16)."""

    base: int = DEFAULT_BASE

    def __post_init__(self) -> None:
        m = FLUX2.size_multiple
        if not isinstance(self.base, int) or not MIN_BASE <= self.base <= MAX_BASE or self.base % m:
            raise Flux2Error(
                f"extrapolation base {self.base} px is not allowed: use a multiple of {m} from {MIN_BASE} to "
                f"{MAX_BASE} (2048 for klein, which is trained to about 4 MP)"
            )

    @property
    def base_tokens(self) -> int:
        return self.base // FLUX2.size_multiple

    def at(self, sigma: float, grid: tuple[int, int]) -> Positions | None:
        """The positions of one call at noise level ``sigma`` for a target of ``grid`` (rows, columns)
        tokens; None when neither side is longer than the base (today's table, bit for bit)."""
        if max(grid) <= self.base_tokens:
            return None
        return Positions(self.base_tokens, (int(grid[0]), int(grid[1])), float(sigma))


def position_extrapolation(method: str, base: int = DEFAULT_BASE) -> PositionExtrapolation | None:
    """The setting a host names (``off`` / ``dype``) -> the extrapolation, or None for off."""
    if method not in METHODS:
        raise Flux2Error(f"position extrapolation {method!r} is unknown: use one of {', '.join(METHODS)}")
    return PositionExtrapolation(base) if method == "dype" else None


@dataclass(frozen=True)
class Positions:
    """One call's extrapolated positions: the base and target grids in tokens, the noise level."""

    base_tokens: int
    grid: tuple[int, int]
    sigma: float


def native_frequencies(dim: int, theta: float) -> torch.Tensor:
    return 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def axis_frequencies(dim: int, theta: float, tokens: int, base_tokens: int, sigma: float):
    """(frequencies [dim / 2] float64, attention scale) of one axis of ``tokens`` positions."""
    base = native_frequencies(dim, theta)
    if tokens <= base_tokens:
        return base, 1.0
    s = tokens / base_tokens
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    linear = base / s
    ntk = 1.0 / (theta * s ** (dim / (dim - 2))) ** exponents
    kappa = float(sigma) ** 2
    beta = _ramp(BETA[0] * kappa, BETA[1] * kappa, dim, theta, base_tokens)
    freqs = linear * beta + ntk * (1 - beta)
    gamma = _ramp(GAMMA[0] * kappa, GAMMA[1] * kappa, dim, theta, base_tokens)
    freqs = freqs * gamma + base * (1 - gamma)
    return freqs, 1.0 + 0.1 * math.log(s)


def _turns_pair(turns: float, dim: int, theta: float, base_tokens: int) -> float:
    """The (fractional) pair index that makes ``turns`` turns over ``base_tokens`` positions; inf at 0."""
    if turns <= 0:
        return math.inf
    return dim * math.log(base_tokens / (turns * 2 * math.pi)) / (2 * math.log(theta))


def _ramp(lo_turns: float, hi_turns: float, dim: int, theta: float, base_tokens: int) -> torch.Tensor:
    half = dim // 2
    pairs = torch.arange(half, dtype=torch.float64)
    lo_at = _turns_pair(lo_turns, dim, theta, base_tokens)
    if lo_at >= half:  # every pair is below the ramp
        return torch.zeros(half, dtype=torch.float64)
    lo = max(math.floor(lo_at), 0)
    hi = min(math.ceil(_turns_pair(hi_turns, dim, theta, base_tokens)), half)
    width = (hi - lo) or 0.001  # an empty ramp: a step at lo
    return ((pairs - lo) / width).clamp(0, 1)


def extrapolated_table(ids: torch.Tensor, num_text: int, axes_dim, theta: int, positions: Positions):
    """cos/sin table [L, head_dim / 2, 2] float32 for ``ids`` whose first ``num_text`` rows are text: the
    image rows' h and w axes extrapolated for ``positions``, everything else as ``rope.rope_table``."""
    ids = ids.to("cpu", torch.float64)
    chunks = []
    for axis, dim in enumerate(axes_dim):
        omega, scale = native_frequencies(dim, theta), 1.0
        if axis in (1, 2):
            tokens = positions.grid[axis - 1]
            omega, scale = axis_frequencies(dim, theta, tokens, positions.base_tokens, positions.sigma)
        angle = ids[:, axis, None] * omega[None]
        table = torch.stack([angle.cos(), angle.sin()], dim=-1)
        if scale != 1.0:
            table[num_text:] *= scale
        chunks.append(table)
    return torch.cat(chunks, dim=1).to(torch.float32)
