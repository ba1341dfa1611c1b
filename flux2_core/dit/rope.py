"""Position ids and the 4-axis rotary embedding of the FLUX.2 DiT.

Every token carries a position id ``(t, h, w, l)``:

    text token i                      (0, 0, 0, i)
    noisy latent cell (r, c)          (0, r, c, 0)
    cell (r, c) of reference k        (10 * (k + 1), r, c, 0)   k = 0, 1, ...

The head dimension (128) is split into one 32-wide chunk per axis; inside a chunk, adjacent pairs (2j, 2j + 1)
rotate by ``pos * theta ** (-2j / 32)`` with theta 2000. Ids are shared by the whole batch: ``[L, 4]``.
"""

from __future__ import annotations

import torch

from ..configs import FLUX2
from .extrapolation import extrapolated_table

# reference k sits at t = 10 * (k + 1): far from the output image (t = 0) on the time axis
REF_TIME_OFFSET = FLUX2.ref_time_offset


def text_ids(length: int) -> torch.Tensor:
    """[length, 4]: the text position runs along the last axis, pads included."""
    ids = torch.zeros(length, 4, dtype=torch.int64)
    ids[:, 3] = torch.arange(length)
    return ids


def image_ids(height: int, width: int, t: int = 0) -> torch.Tensor:
    """[height * width, 4] for a latent grid of ``height x width`` tokens, row-major."""
    return torch.cartesian_prod(
        torch.tensor([t]), torch.arange(height), torch.arange(width), torch.tensor([0])
    ).to(torch.int64)


def reference_ids(grid_sizes: list[tuple[int, int]]) -> torch.Tensor:
    """Ids of references laid one after another, each on its own grid starting at (0, 0)."""
    if not grid_sizes:
        return torch.zeros(0, 4, dtype=torch.int64)
    return torch.cat([image_ids(h, w, t=REF_TIME_OFFSET * (k + 1)) for k, (h, w) in enumerate(grid_sizes)])


def rope_table(ids: torch.Tensor, axes_dim: tuple[int, ...], theta: int) -> torch.Tensor:
    """cos/sin table [L, head_dim / 2, 2] for the given ids, in float32.

    Angles are computed in float64 on the CPU (as diffusers and ComfyUI do) and only then cast.
    """
    ids = ids.to("cpu", torch.float64)
    angles = []
    for axis, dim in enumerate(axes_dim):
        omega = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles.append(ids[:, axis, None] * omega[None])
    angle = torch.cat(angles, dim=-1)  # [L, head_dim / 2]
    return torch.stack([angle.cos(), angle.sin()], dim=-1).to(torch.float32)


def rotation_table(table: torch.Tensor) -> torch.Tensor:
    """[L, D / 2, 2] (cos, sin) -> [L, D / 2, 2, 2]: the columns (cos, sin) and (-sin, cos) of each pair's
    rotation, so ``apply_rope_`` needs two products and one sum."""
    cos, sin = table[..., 0], table[..., 1]
    return torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], -1)


def cached_rotation(
    cache: dict, ids: torch.Tensor, axes_dim, theta: int, device, num_text: int = 0, positions=None
) -> torch.Tensor:
    """The ``rotation_table`` for ``ids`` on ``device``, kept in ``cache`` for the last few id layouts (they
    repeat every step). ``positions`` (``extrapolation.Positions``, None for today's table) extrapolates the
    image rows, those after the first ``num_text``."""
    key = (ids.cpu().numpy().tobytes(), tuple(ids.shape), str(device))
    if positions is not None:
        key += (num_text, positions)
    if key not in cache:
        if len(cache) >= 4:
            cache.clear()
        if positions is None:
            table = rope_table(ids, axes_dim, theta)
        else:
            table = extrapolated_table(ids, num_text, axes_dim, theta, positions)
        cache[key] = rotation_table(table).to(device)
    return cache[key]


# Tokens rotated at a time: bounds the float32 temporaries of a long sequence, and keeps them in cache (and
# below the C allocator's reuse threshold) for the steps that follow on them: at klein 4B's 24 heads,
# bf16, 4.6k tokens, the norm and rotation in one pass took 19.5 ms in chunks of 128-256 tokens against 29 ms
# in chunks of 1024 (2-core AVX-512 CPU).
ROPE_CHUNK = 256


def apply_rope_(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of ``x`` [B, heads, L, D] in place by ``table``: [L, D / 2, 2] (cos, sin) or its
    ``rotation_table``; math in float32. (x0, x1) -> (cos x0 - sin x1, sin x0 + cos x1), exactly. Returns
    ``x``.

    ``x`` is attention's own copy of the queries or keys (a norm's or a concatenation's output), so it is
    overwritten: no second copy of every token's q or k is made. The float32 copy and products take 8 bytes
    a value each and are formed for ``ROPE_CHUNK`` tokens at a time (the same arithmetic per value)."""
    if table.ndim == 3:
        table = rotation_table(table)
    for start in range(0, x.shape[-2], ROPE_CHUNK):
        part = x[..., start : start + ROPE_CHUNK, :]
        part.copy_(rotated(part, table[start : start + ROPE_CHUNK]))  # the cast back is the copy
    return x


def _rotate(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return rotated(x, table).to(x.dtype)


def rotated(x: torch.Tensor, table: torch.Tensor, fused: bool | None = None) -> torch.Tensor:
    """``x`` [..., L, D] rotated by ``table`` (``rotation_table`` rows of its L tokens), in float32;
    ``fused`` (default: below float32) forms the product and sum in one op."""
    xf = x.float().unflatten(-1, (-1, 1, 2))  # [B, heads, L, D/2, 1, 2]
    if fused is None:
        fused = x.dtype != torch.float32
    if fused:  # the product and the sum as one op (both in float32)
        out = torch.addcmul(table[..., 0] * xf[..., 0], table[..., 1], xf[..., 1])
    else:
        out = table[..., 0] * xf[..., 0] + table[..., 1] * xf[..., 1]  # [B, heads, L, D/2, 2]
    return out.flatten(-2)
