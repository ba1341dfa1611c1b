"""Softmax attention [B, H, L, D]: its kernels, the bias a DiT call adds to the logits, and the measured
choice of kernel.

Kernels (``KERNELS``), each ``(q, k, v, bias=None) -> out``:

- ``sdpa``: PyTorch's ``scaled_dot_product_attention`` (flash / memory-efficient kernels on a GPU, its own
  fused kernel on a CPU). Every device runs it unless the CPU's ops choose otherwise (``block_ops``);
- ``tiled`` (and ``tiled-small``): scores, softmax and the sum over values as matrix products on tiles of
  heads and query rows whose scores fit the CPU's caches (``TILE_SCORE_BYTES``, ``SMALL_TILE_SCORE_BYTES``),
  so the scores never travel to memory and back;
- ``matmul``: the same products per chunk of queries over every head (``CPU_ATTENTION_CHUNK`` rows at most,
  fewer where the keys are many, so that one chunk's scores stay within ``CPU_SCORE_BYTES``).

Which one is fastest depends on the CPU, the dtype and the shape (``docs/benchmarks.md``), so a CPU below
float32 measures it: ``KernelChoice`` times each of ``MEASURED`` twice, alternating, on the first
``MEASURED_HEADS`` heads of the first attention of each shape class (device, dtype, heads, head size, the
query and key lengths rounded up to powers of two), and the fastest by its best time serves that class for
the rest of the process. ``FLUX2_ATTENTION=sdpa``, ``tiled``, ``tiled-small`` or ``matmul`` fixes the choice
(``auto``, the default, measures).

An optional ``bias`` (broadcast to [B, H, Lq, Lk]) is added to the scaled logits before the softmax by every
kernel: additive in the queries' dtype (``-inf`` masks a key), or boolean (False masks it).
``attention_bias`` shapes the DiT's: a value per key (reference strength) or a mask. A mask can also come
factored as a ``GroupedMask`` (regional prompts): groups of queries that each attend to one set of keys,
attended group by group, so no [Lq, Lk] matrix is formed and the masked keys cost nothing.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

CPU_ATTENTION_CHUNK = 1024  # query rows per chunk at most: bounds the [chunk, L] score matrix of each head
# One chunk's scores [B, H, rows, Lk] at most (its softmax is as large again): long sequences take fewer rows.
CPU_SCORE_BYTES = 96 * 2**20
MIN_CHUNK = 16
# One tile's scores in ``tiled_kernel``, the two sizes measured: a share of the last-level cache, and about a
# core's L2.
TILE_SCORE_BYTES = 8 * 2**20
SMALL_TILE_SCORE_BYTES = 2 * 2**20
CHOICE_ENV = "FLUX2_ATTENTION"

Kernel = Callable[..., torch.Tensor]  # (q, k, v, bias=None) -> out


def attention_bias(values: torch.Tensor) -> torch.Tensor:
    """A bias over the keys, [Lk] (the same for every query) or [Lq, Lk] (a mask), as the kernels broadcast
    it over batch and heads: [1, 1, 1 or Lq, Lk]."""
    return values.view(1, 1, *values.shape) if values.ndim == 2 else values.view(1, 1, 1, -1)


@dataclass(frozen=True, eq=False)
class KeyGroup:
    """Queries (positions [n]) that attend to the same keys: ``keys`` (positions [m], ascending; None: every
    key), ``bias`` ([m], or [Lk] with every key) added to their logits, additive (None: 0)."""

    queries: torch.Tensor
    keys: torch.Tensor | None = None
    bias: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class GroupedMask:
    """A mask over a sequence of ``length`` tokens attending to itself, in factored form: every query is in
    exactly one group of ``groups``. Attention gathers each group's queries (and its keys, where it names
    them), attends, and writes the group's rows of the output: the softmax of each query over the same keys
    with the same logits as under the dense mask (``dense``), without forming it."""

    length: int
    groups: tuple[KeyGroup, ...]

    def to(self, device=None, dtype=None) -> GroupedMask:
        """On ``device``, its biases in ``dtype``."""
        groups = []
        for g in self.groups:
            keys = None if g.keys is None else g.keys.to(device)
            bias = None if g.bias is None else g.bias.to(device=device, dtype=dtype)
            groups.append(KeyGroup(g.queries.to(device), keys, bias))
        return GroupedMask(self.length, tuple(groups))

    def arranged(self, order: torch.Tensor) -> GroupedMask:
        """The same mask over the tokens reordered so that place j holds token ``order[j]``."""
        place = torch.empty_like(order)
        place[order] = torch.arange(order.numel(), device=order.device)
        out = []
        for g in self.groups:
            keys, bias = g.keys, g.bias
            if keys is not None:  # keep the keys ascending in their new places, each with its bias
                keys, turn = place[keys.to(place.device)].sort()
                bias = None if bias is None else bias[turn.to(bias.device)]
            elif bias is not None:
                bias = bias[order.to(bias.device)]
            out.append(KeyGroup(place[g.queries.to(place.device)], keys, bias))
        return GroupedMask(self.length, tuple(out))

    def dense(self) -> torch.Tensor:
        """The [L, L] mask it stands for: boolean (True: attends) when every bias is 0 or -inf, else additive
        (-inf masks)."""
        dtype = next((g.bias.dtype for g in self.groups if g.bias is not None), torch.float32)
        out = torch.full((self.length, self.length), -torch.inf, dtype=dtype)
        for g in self.groups:
            keys = torch.arange(self.length) if g.keys is None else g.keys.cpu()
            row = torch.zeros(keys.numel(), dtype=dtype) if g.bias is None else g.bias.cpu()
            out[g.queries.cpu()[:, None], keys[None]] = row
        allowed = out > -torch.inf
        return allowed if bool((out[allowed] == 0).all()) else out

    def attend(self, q, k, v, kernel) -> torch.Tensor:
        """Attention of [B, H, L, D] q, k, v under the mask, each group by ``kernel(q, k, v, bias)``."""
        out = torch.empty_like(q)
        for g in self.groups:
            keys, values = k, v
            if g.keys is not None:
                keys, values = k.index_select(2, g.keys), v.index_select(2, g.keys)
            bias = None if g.bias is None else attention_bias(g.bias)
            out.index_copy_(2, g.queries, kernel(q.index_select(2, g.queries), keys, values, bias))
        return out


def sdpa_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias=None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


def matmul_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias=None) -> torch.Tensor:
    """Two matmuls per chunk of queries over every head (``chunk_rows``); the error stays at the dtype's
    precision."""
    return _in_tiles(q, k, v, bias, q.shape[1], chunk_rows(q, k))


def tiled_kernel(q, k, v, bias=None, score_bytes: int = TILE_SCORE_BYTES) -> torch.Tensor:
    """The matrix products of ``matmul_kernel`` on tiles sized for the CPU's caches: a group of heads and
    query rows whose scores fit ``score_bytes`` runs scores, softmax (in place) and the sum over values
    before the next tile starts, so the scores are read back from cache rather than memory, and their buffer
    is small enough for the allocator to reuse instead of asking the system for fresh pages."""
    return _in_tiles(q, k, v, bias, *tile(q, k, score_bytes))


def _in_tiles(q, k, v, bias, heads: int, rows: int) -> torch.Tensor:
    """Attention as matrix products, ``heads`` heads and ``rows`` query rows at a time."""
    out = torch.empty_like(q)
    scale, keys = q.shape[-1] ** -0.5, k.transpose(-1, -2)
    if bias is not None and bias.ndim < 4:
        bias = bias.view(*(1,) * (4 - bias.ndim), *bias.shape)  # broadcast over batch and heads
    for h in range(0, q.shape[1], heads):
        group = slice(h, h + heads)
        for start in range(0, q.shape[2], rows):
            part = slice(start, start + rows)
            scores = torch.matmul(q[:, group, part] * scale, keys[:, group])
            if bias is not None:
                b = bias if bias.shape[-2] == 1 else bias[..., part, :]
                b = b if b.shape[1] == 1 else b[:, group]
                if b.dtype == torch.bool:
                    scores.masked_fill_(~b, -torch.inf)
                else:
                    scores.add_(b)
            torch.softmax(scores, dim=-1, out=scores)
            torch.matmul(scores, v[:, group], out=out[:, group, part])
    return out


def tile(q: torch.Tensor, k: torch.Tensor, score_bytes: int = TILE_SCORE_BYTES) -> tuple[int, int]:
    """(heads, query rows) of one ``tiled_kernel`` tile: all rows of as many heads as fit ``score_bytes`` of
    scores, else one head and as many rows as fit (``MIN_CHUNK`` at least)."""
    per_row = q.shape[0] * k.shape[2] * q.element_size()  # one query row of one head, every batch item
    fit = max(score_bytes // max(per_row, 1), MIN_CHUNK)
    if fit >= q.shape[2]:
        return max(1, min(q.shape[1], fit // max(q.shape[2], 1))), q.shape[2]
    return 1, fit


def chunk_rows(q: torch.Tensor, k: torch.Tensor) -> int:
    """Query rows per chunk of ``matmul_kernel``: ``CPU_ATTENTION_CHUNK``, fewer when a chunk's scores would
    pass ``CPU_SCORE_BYTES`` (``MIN_CHUNK`` at least)."""
    per_row = q.shape[0] * q.shape[1] * k.shape[2] * q.element_size()
    return max(MIN_CHUNK, min(CPU_ATTENTION_CHUNK, CPU_SCORE_BYTES // max(per_row, 1)))


def small_tiled_kernel(q, k, v, bias=None) -> torch.Tensor:
    return tiled_kernel(q, k, v, bias, SMALL_TILE_SCORE_BYTES)


KERNELS: dict[str, Kernel] = {
    "sdpa": sdpa_kernel,
    "matmul": matmul_kernel,
    "tiled": tiled_kernel,
    "tiled-small": small_tiled_kernel,
}
MEASURED = ("sdpa", "tiled", "tiled-small")  # the candidates of ``auto`` (matmul is kept for FLUX2_ATTENTION)
MEASURED_HEADS = 8  # the choice is timed on this many heads (the time per head is the same), then run on all


def shape_class(q: torch.Tensor, k: torch.Tensor) -> tuple:
    """What a measured choice stands for: device, dtype, heads, head size, lengths up to a power of two."""
    return (
        q.device.type,
        q.dtype,
        q.shape[1],
        q.shape[-1],
        1 << max(q.shape[2] - 1, 0).bit_length(),
        1 << max(k.shape[2] - 1, 0).bit_length(),
    )


class KernelChoice:
    """The kernel of each shape class, fixed by ``FLUX2_ATTENTION`` or measured once (see the module
    docstring). ``clock`` is the timer the measurement reads."""

    def __init__(
        self, candidates: tuple[str, ...] = MEASURED, clock: Callable[[], float] = time.perf_counter
    ):
        self.candidates, self.clock = candidates, clock
        self.chosen: dict[tuple, str] = {}  # shape class -> kernel name

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias=None) -> torch.Tensor:
        fixed = os.environ.get(CHOICE_ENV, "auto")
        if fixed in KERNELS:
            return KERNELS[fixed](q, k, v, bias)
        key = shape_class(q, k)
        name = self.chosen.get(key)
        if name is not None:
            return KERNELS[name](q, k, v, bias)
        name, out, times = self._measure(q, k, v, bias)
        self.chosen[key] = name
        log.debug("attention %s: %s (best of 2: %s)", key, name,
                  ", ".join(f"{n} {t * 1e3:.1f} ms" for n, t in times.items()))  # fmt: skip
        return out

    def _measure(self, q, k, v, bias=None) -> tuple[str, torch.Tensor, dict[str, float]]:
        """Each candidate twice, alternating, on the first ``MEASURED_HEADS`` heads; the fastest by its best
        time, and its output for every head."""
        heads = slice(0, MEASURED_HEADS)
        part = (
            q[:, heads],
            k[:, heads],
            v[:, heads],
            bias if bias is None or bias.shape[1] == 1 else bias[:, heads],
        )
        best: dict[str, float] = {}
        outs: dict[str, torch.Tensor] = {}
        for name in (*self.candidates, *self.candidates):
            _synchronize(q.device)
            start = self.clock()
            outs[name] = KERNELS[name](*part)
            _synchronize(q.device)  # a GPU's kernels run after their launch returns
            best[name] = min(best.get(name, float("inf")), self.clock() - start)
        name = min(best, key=best.get)
        out = outs[name] if q.shape[1] <= MEASURED_HEADS else KERNELS[name](q, k, v, bias)
        return name, out, best


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias=None, kernel: Kernel = None
) -> torch.Tensor:
    """Softmax attention of [B, H, Lq, D] queries over [B, H, Lk, D] keys and values by ``kernel``
    (default PyTorch's), ``bias`` added to the logits: a tensor, or a ``GroupedMask`` attended group by
    group."""
    kernel = kernel or sdpa_kernel
    if isinstance(bias, GroupedMask):
        return bias.attend(q, k, v, kernel)
    return kernel(q, k, v, bias)
