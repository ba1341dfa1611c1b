"""What the samplers of both families (FLUX.2 ``sampling``, FLUX.1 Fill ``flux1.sampling``) check around the
loop and how they size a run: the strength (denoise) range, the rule that an input holds one item or one
per batch item, the finite result, and the activation rows behind the memory estimates. Each family words its
own messages; the rules are here once."""

from __future__ import annotations

import math

import torch

from .dit.extrapolation import KV_AND_EXTRAPOLATION
from .errors import Flux2Error

# Hidden-wide rows a token holds at a step's peak: a single block holds its fused input projection (9 x
# hidden per token) next to the residual stream, the modulated input, the float32 RoPE'd q and k, the
# attention output and the MLP product (FLUX.1's 12288-wide MLP of the single blocks included).
ACTIVATION_ROWS = 24


def activation_bytes(batch_size: int, tokens: int, hidden_size: int, dtype: torch.dtype) -> int:
    """Rough peak bytes of one step's activations beyond the weights: ``ACTIVATION_ROWS`` per token."""
    return batch_size * tokens * hidden_size * ACTIVATION_ROWS * (torch.finfo(dtype).bits // 8)


def check_strength(strength: float, name: str) -> None:
    """``strength`` (called ``name`` in the message) from 0 (keep the image) to 1 (repaint)."""
    if not 0.0 <= strength <= 1.0 or math.isnan(strength):
        raise Flux2Error(f"{name} is {strength}: use a value from 0 (keep the image) to 1 (repaint)")


def check_batch(tensor: torch.Tensor, batch_size: int, refusal: str) -> None:
    """``tensor`` must hold one item (shared by the batch) or ``batch_size``; ``refusal`` is the message,
    formatted with ``given`` (the items it holds) and ``batch`` (the batch size)."""
    if tensor.shape[0] not in (1, batch_size):
        raise Flux2Error(refusal.format(given=tensor.shape[0], batch=batch_size))


def batched(tensor: torch.Tensor, batch_size: int, refusal: str) -> torch.Tensor:
    """``tensor`` [1 or B, ...] as [B, ...]: itself, or its one item expanded (a view) (``check_batch``)."""
    check_batch(tensor, batch_size, refusal)
    return tensor if tensor.shape[0] == batch_size else tensor.expand(batch_size, *tensor.shape[1:])


def check_finite(latent: torch.Tensor, causes: str) -> None:
    """A sampled latent holding NaN or inf would decode to garbage: refuse it, ``causes`` saying why."""
    if not torch.isfinite(latent).all():
        raise Flux2Error("sampling produced NaN or infinite values" + causes)


def check_extrapolation(extrapolation, grid: tuple[int, int], cached_references: bool) -> None:
    """Position extrapolation (``dit.extrapolation``) moves the references with the noise level: it cannot
    extrapolate a run whose references' K/V are computed once (``cached_references``, the 9B-KV model)."""
    if cached_references and extrapolation is not None and extrapolation.at(1.0, grid) is not None:
        raise Flux2Error(KV_AND_EXTRAPOLATION)
