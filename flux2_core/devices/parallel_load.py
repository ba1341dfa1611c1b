"""Loading one FLUX.2 DiT for a parallel run: each process reads only its own slices (tensor parallelism).

``load_transformer_parallel`` runs the one loading pipeline (``loading.load_checkpoint``) with a ``shard``
step between the meta build and the fill: ``TensorShard`` narrows the meta model to this rank's shapes
(``parallel.shard_module``) and rewrites the plan so that each sliced tensor is read as its rank's rows or
columns straight from the file (``LazyTensors.read_slice``): a rank holds, and reads, about ``1 / p`` of the
sharded weights plus the replicated ones. Fused parts of diffusers files (separate q, k and v) are sliced
each into their share of ours. Quantised layers: fp8 and int8 (ConvRot included, when the column cuts fall on
its groups) slice their weight; a per-tensor scale is replicated, a per-row scale is sliced with the rows of
a column-parallel weight and kept whole for a row-parallel one. nvfp4, mxfp8, convrot_w4a4 and GGUF storage
cannot be sliced here and are refused by name (sequence parallelism loads them whole).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from ..dit.files import DIT_SPEC, transformer_variant
from ..dit.transformer import Flux2Model
from ..errors import Flux2Error
from ..weights.checkpoint import LazyTensors, open_checkpoint, tensor_dtype, tensor_shape
from ..weights.keymaps import Placement
from ..weights.loading import load_checkpoint
from ..weights.plan import LoadPlan, plan_checkpoint, read_config
from ..weights.quant import FP8, QuantLayer
from .parallel import (
    MODES,
    ParallelInfo,
    SequenceComm,
    Split,
    TensorComm,
    check_world,
    held_bytes,
    shard_module,
    tensor_plan,
    use_comm,
)

log = logging.getLogger(__name__)

Slices = dict[str, tuple[int, list[tuple[int, int]]]]  # file key -> (dim, [start, stop) ranges) to read


def load_transformer_parallel(
    path: str | Path,
    mode: str = "tensor",
    variant: str = "auto",
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    group=None,
    keep_quantized: bool = True,
    quant_compute: str = "auto",
) -> Flux2Model:
    """This process's part of a FLUX.2 DiT run over ``group`` (default: every process) in ``mode``:
    ``tensor`` (weights sliced as they load) or ``sequence`` (weights whole, tokens split). Every process
    calls it with the same arguments; ``parallel.parallel_info(model)`` tells what it holds and read."""
    if mode not in MODES:
        raise Flux2Error(f"unknown parallel mode {mode!r}: choose {' or '.join(MODES)}")
    if not dist.is_available() or not dist.is_initialized():
        raise Flux2Error("a parallel model needs the process group: call parallel.init_distributed first")
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    checkpoint = open_checkpoint(path, DIT_SPEC.component)
    shard = TensorShard(rank, world) if mode == "tensor" else _check_sequence(world)
    loaded = load_checkpoint(
        DIT_SPEC, checkpoint, dtype, device, keep_quantized, shard=shard, quant_compute=quant_compute
    )
    chosen = transformer_variant(checkpoint, loaded.config, variant)
    net = loaded.module
    use_comm(net, TensorComm(group) if mode == "tensor" else SequenceComm(group))
    net.parallel_info = ParallelInfo(
        mode, rank, world, held_bytes(net), getattr(checkpoint.tensors, "bytes_read", None)
    )
    log.info("%s: %s", checkpoint.name, net.parallel_info.describe())
    return Flux2Model(net, chosen, loaded.description)


def planned_weight_bytes(path: str | Path, mode: str, world: int, dtype: torch.dtype, rank: int = 0) -> int:
    """Bytes of weights one process will hold, from the file headers alone (nothing is read)."""
    checkpoint = open_checkpoint(path, DIT_SPEC.component)
    load_plan = plan_checkpoint(DIT_SPEC, checkpoint)
    config = read_config(DIT_SPEC, load_plan.shapes, checkpoint)
    with torch.device("meta"):
        module = DIT_SPEC.build(config)
    check_world(config, world, mode)
    if mode == "tensor":
        load_plan = TensorShard(rank, world)(module, load_plan)
    return load_plan.only(DIT_SPEC.wanted).choose_stays_quantized(module, DIT_SPEC, True).held_bytes(dtype)


def _check_sequence(world: int):
    def check(module, load_plan: LoadPlan) -> LoadPlan:
        check_world(module.config, world, "sequence")
        return load_plan

    return check


class TensorShard:
    """``loading.load_checkpoint``'s ``shard`` step for rank ``rank`` of ``world``."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world

    def __call__(self, module, load_plan: LoadPlan) -> LoadPlan:
        check_world(module.config, self.world, "tensor")
        tensors, what = load_plan.tensors, load_plan.what
        if not hasattr(type(tensors), "read_slice"):
            raise Flux2Error(
                f"{what}: tensor parallelism reads each process's slices from safetensors files; this file "
                "(GGUF) cannot be read in slices: use a safetensors release or --parallel sequence"
            )
        plan = tensor_plan(module.config)
        shard_module(module, plan, self.world)
        pieces, shapes, quantized = dict(load_plan.pieces), dict(load_plan.shapes), dict(load_plan.quantized)
        slices: Slices = {}
        for name, split in plan.items():
            key = name + ".weight"
            ranges = split.ranges(self.rank, self.world)
            local = list(shapes[key])
            local[split.dim] = split.local(self.world)
            if name in quantized:
                quantized[name] = _shard_quantized(quantized[name], split, ranges, local, slices, what, name)
            pieces[key] = _shard_pieces(pieces[key], split.dim, ranges, tensors, slices)
            shapes[key] = tuple(local)
        sliced = SlicedTensors(tensors, slices)
        return replace(load_plan, pieces=pieces, shapes=shapes, quantized=quantized, tensors=sliced)


def _shard_pieces(parts, dim: int, ranges, tensors, slices: Slices) -> list[tuple[str, Placement]]:
    """The file pieces of one sliced tensor, each narrowed to what it contributes to this rank's share."""
    if dim == 1:  # columns: every piece gives the same columns of its rows
        for file_key, _ in parts:
            _add(slices, file_key, (1, ranges))
        return parts
    ordered = sorted(parts, key=lambda part: part[1].into.index if part[1].into is not None else 0)
    out, offset = [], 0  # offset: where the piece starts in our rows
    for file_key, placement in ordered:
        rows = tensor_shape(tensors, file_key)[0]
        start, size = placement.take.rows(rows) if placement.take is not None else (0, rows)
        wanted = [
            (start + max(a, offset) - offset, start + min(b, offset + size) - offset)
            for a, b in ranges
            if min(b, offset + size) > max(a, offset)
        ]
        _add(slices, file_key, (0, wanted))
        out.append((file_key, replace(placement, take=None)))
        offset += size
    return out


def _add(slices: Slices, file_key: str, spec) -> None:
    if slices.setdefault(file_key, spec) != spec:
        raise Flux2Error(f"{file_key} fills two sliced tensors: the file cannot be loaded in slices")


def _shard_quantized(q: QuantLayer, split: Split, ranges, local, slices: Slices, what, name) -> QuantLayer:
    """The stored form of this rank's share of a quantised layer; its per-row scale sliced along."""
    if q.format not in (*FP8, "int8_tensorwise"):
        raise Flux2Error(
            f"{what}: {name} is stored as {q.label}, which tensor parallelism cannot slice: use the bf16, "
            "fp8 or int8 release of the model, or --parallel sequence"
        )
    if q.convrot and split.dim == 1 and any(a % q.convrot or b % q.convrot for a, b in ranges):
        raise Flux2Error(
            f"{what}: {name} is rotated in groups of {q.convrot} columns (ConvRot), which this process "
            f"count does not cut along: use fewer processes or --parallel sequence"
        )
    rows = q.shape[0]
    stored = dict(q.stored)
    stored["weight"] = (tuple(local), q.stored["weight"][1])
    scale = q.stored.get("weight_scale")
    if scale is not None and split.dim == 0 and rows > 1 and math.prod(scale[0]) == rows:
        _add(slices, q.keys["weight_scale"], (0, ranges))
        stored["weight_scale"] = ((local[0], *scale[0][1:]), scale[1])
    return replace(q, stored=stored, shape=tuple(local))


class SlicedTensors(Mapping):
    """A lazy tensor mapping in which the tensors ``slices`` names are read as those rows or columns."""

    def __init__(self, tensors: LazyTensors, slices: Slices):
        self._tensors, self._slices = tensors, slices
        self.metadata = getattr(tensors, "metadata", {})

    def __getitem__(self, key: str) -> torch.Tensor:
        if key in self._slices:
            return self._tensors.read_slice(key, *self._slices[key])
        return self._tensors[key]

    def read_as(self, key: str, dtype: torch.dtype) -> torch.Tensor:
        if key in self._slices:
            tensor = self[key]
            return tensor.to(dtype) if tensor.is_floating_point() else tensor
        return self._tensors.read_as(key, dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def shape(self, key: str) -> tuple[int, ...]:
        shape = list(tensor_shape(self._tensors, key))
        if key in self._slices:
            dim, ranges = self._slices[key]
            shape[dim] = sum(b - a for a, b in ranges)
        return tuple(shape)

    def dtype(self, key: str):
        return tensor_dtype(self._tensors, key)

    def release_buffers(self) -> None:
        self._tensors.release_buffers()
