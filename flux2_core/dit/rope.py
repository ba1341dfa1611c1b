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
    rotation, so a rotation is two products and one sum."""
    cos, sin = table[..., 0], table[..., 1]
    return torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], -1)


def rotation(ids: torch.Tensor, axes_dim, theta: int, device, num_text: int = 0, positions=None):
    """The ``rotation_table`` of ``ids`` on ``device``; ``positions`` (``extrapolation.Positions``, None for
    the trained table) extrapolates the image rows, those after the first ``num_text``."""
    if positions is None:
        table = rope_table(ids, axes_dim, theta)
    else:
        table = extrapolated_table(ids, num_text, axes_dim, theta, positions)
    return rotation_table(table).to(device)


class RotationCache:
    """The ``rotation`` tables of the last few id layouts (they repeat at every step: a sampling run's
    passes all share one). Under ``torch.compile`` the table is computed in the traced call instead, so the
    graph holds no lookup."""

    SIZE = 4

    def __init__(self):
        self.tables: dict[tuple, torch.Tensor] = {}

    def __call__(self, ids, axes_dim, theta: int, device, num_text: int = 0, positions=None) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return rotation(ids, axes_dim, theta, device, num_text, positions)
        key = (ids.cpu().numpy().tobytes(), tuple(ids.shape), str(device), theta, tuple(axes_dim))
        if positions is not None:
            key += (num_text, positions)
        if key not in self.tables:
            if len(self.tables) >= self.SIZE:
                self.tables.clear()
            self.tables[key] = rotation(ids, axes_dim, theta, device, num_text, positions)
        return self.tables[key]


def rotated(x: torch.Tensor, table: torch.Tensor, fused: bool = False) -> torch.Tensor:
    """``x`` [..., L, D] rotated by ``table`` (``rotation_table`` rows of its L tokens) in float32:
    (x0, x1) -> (cos x0 - sin x1, sin x0 + cos x1). ``fused`` forms the product and sum in one op."""
    xf = x.float().unflatten(-1, (-1, 1, 2))  # [B, heads, L, D/2, 1, 2]
    if fused:
        out = torch.addcmul(table[..., 0] * xf[..., 0], table[..., 1], xf[..., 1])
    else:
        out = table[..., 0] * xf[..., 0] + table[..., 1] * xf[..., 1]  # [B, heads, L, D/2, 2]
    return out.flatten(-2)


def apply_rope(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``x`` [B, heads, L, D] rotated by ``table`` ([L, D / 2, 2] (cos, sin) or its ``rotation_table``),
    math in float32, returned in ``x``'s dtype."""
    if table.ndim == 3:
        table = rotation_table(table)
    return rotated(x, table).to(x.dtype)
