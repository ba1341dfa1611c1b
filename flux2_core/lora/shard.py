"""A LoRA on a tensor-parallel DiT: matched against the whole model's shapes, then each patch of a sliced
layer cut to this process's share of the weight.

Under tensor parallelism (``devices.parallel``) a process holds, of each column-parallel layer (``qkv``,
``mlp.0``, ``linear1``), its rows of every block (``[q_r; k_r; v_r]``), and of each row-parallel layer
(``proj``, ``mlp.2``, ``linear2``) its columns. A patch's change is cut the same way: the rows of its delta
that fall in this process's rows (a q-only patch of a diffusers file keeps its q_r rows, at q_r's place), or
the columns it holds, so every process adds exactly its slice of the whole delta and the sum over processes
is the one-process result. Low-rank patches are cut in their factors (the up rows, or the down columns);
other kinds in their delta. DoRA renormalises over whole rows or columns of the weight, which no process
holds, so it is refused on the sliced layers.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
from torch import nn

from ..devices.parallel import Split, tensor_plan
from ..errors import Flux2Error
from ..ops import LowRankPatch, WeightPatch, linears
from .patches import DoRAPatch


def _tensor_parallel(transformer: nn.Module):
    """(plan, rank, world) of a tensor-parallel DiT, None for any other."""
    comm = getattr(transformer, "comm", None)
    if getattr(comm, "mode", None) != "tensor":
        return None
    return tensor_plan(transformer.config), comm.rank, comm.world


def whole_layers(transformer: nn.Module) -> dict:
    """Every linear of ``transformer`` by name, with the whole model's ``out_features`` / ``in_features``
    (a tensor-parallel process's layers are its slices)."""
    layers = dict(linears(transformer))
    sharded = _tensor_parallel(transformer)
    if sharded is None:
        return layers
    plan, _, world = sharded
    out = dict(layers)
    for name, split in plan.items():
        shape = [layers[name].out_features, layers[name].in_features]
        shape[split.dim] = sum(split.blocks)
        out[name] = SimpleNamespace(out_features=shape[0], in_features=shape[1])
    return out


def shard_patches(patches: dict[str, list[WeightPatch]], transformer: nn.Module, name: str) -> dict:
    """``patches`` (layer -> patches, made for the whole model) as this process of a tensor-parallel
    ``transformer`` applies them; unchanged for any other model."""
    sharded = _tensor_parallel(transformer)
    if sharded is None:
        return patches
    plan, rank, world = sharded
    out = {}
    for target, items in patches.items():
        split = plan.get(target)
        if split is None:
            out[target] = items
            continue
        local = [p for p in (_cut(patch, split, rank, world, target, name) for patch in items) if p]
        if local:
            out[target] = local
    return out


def _cut(patch, split: Split, rank: int, world: int, target: str, name: str):
    if isinstance(patch, DoRAPatch):
        raise Flux2Error(
            f"{name} is a DoRA on {target}, which tensor parallelism holds in slices: DoRA renormalises "
            "whole rows or columns of the weight; use sequence parallelism (--parallel sequence) for it"
        )
    ranges = split.ranges(rank, world)
    if split.dim == 1:  # row-parallel: this process's columns, every row
        index = torch.cat([torch.arange(a, b) for a, b in ranges])
        if isinstance(patch, LowRankPatch):
            return LowRankPatch(patch.up, patch.down[:, index], patch.strength, patch.rows)
        return SlicedPatch(patch, 1, index, patch.rows)
    offset, size = patch.rows or (0, sum(split.blocks))
    pieces, held = [], 0  # (local row, delta row, count) of this process's rows the patch covers
    for a, b in ranges:
        lo, hi = max(a, offset), min(b, offset + size)
        if lo < hi:
            pieces.append((held + lo - a, lo - offset, hi - lo))
        held += b - a
    if not pieces:
        return None
    first, count = pieces[0][0], sum(n for _, _, n in pieces)
    if any(p[0] + p[2] != q[0] for p, q in zip(pieces, pieces[1:])):
        raise AssertionError(f"{target}: a patch's rows are not contiguous in this process's share")
    index = torch.cat([torch.arange(d, d + n) for _, d, n in pieces])
    rows = None if (first, count) == (0, held) else (first, count)
    if isinstance(patch, LowRankPatch):
        return LowRankPatch(patch.up[index], patch.down, patch.strength, rows)
    return SlicedPatch(patch, 0, index, rows)


@dataclass(frozen=True, eq=False)
class SlicedPatch:
    """The rows (``dim`` 0) or columns (``dim`` 1) ``index`` of another patch's change."""

    inner: object  # a patch with .delta(device) and .shape
    dim: int
    index: torch.Tensor
    rows: tuple[int, int] | None

    @property
    def shape(self) -> tuple[int, int]:
        rows, cols = self.inner.shape
        return (len(self.index), cols) if self.dim == 0 else (rows, len(self.index))

    def delta(self, device: torch.device) -> torch.Tensor:
        return self.inner.delta(device).index_select(self.dim, self.index.to(device))

    def apply(self, w: torch.Tensor) -> None:
        w.add_(self.delta(w.device))

    def output(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.delta(x.device).T
