"""One loading pipeline for the DiT, the text encoder and the VAE.

    load plan (``plan.py``: names and headers only) -> build on meta -> shard (tensor parallelism)
    -> choose the layers that stay quantised -> check the plan against the module -> fill, one tensor at a
    time, in the dtype policy -> attach weight sources

Each component describes itself with a ``ComponentSpec`` (its prefixes, key map, kind check, how to read its
config from shapes and how to build it); nothing else differs between them. Filling reads each tensor (or the
parts of a fused one), casts it and assigns it before reading the next: the file is never held in memory next
to the model. Every shape and dtype is checked before the first tensor is read, so a bad file fails before
any time is spent. The dtype policy is one rule: floating tensors take the requested dtype except those whose
key starts with one of the spec's ``keep_float32`` prefixes (the VAE's BatchNorm statistics); the storage of
layers staying quantised keeps its own; others keep theirs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import Flux2Error
from ..ops import PLAIN, linears
from .checkpoint import Checkpoint, open_checkpoint, read_tensor, tensor_dtype
from .keymaps import Placement
from .kitchen import QuantCompute, check_mode
from .plan import ComponentSpec, LoadPlan, plan_checkpoint, read_config
from .quant import dequantize
from .quant_source import quantize_layer

log = logging.getLogger(__name__)

# (meta module, plan) -> the plan narrowed to one process's shard (tensor parallelism)
Shard = Callable[[nn.Module, LoadPlan], LoadPlan]


@dataclass
class Loaded:
    module: nn.Module
    config: Any
    checkpoint: Checkpoint
    description: str


def load_component(
    spec: ComponentSpec,
    path: str | Path,
    dtype: torch.dtype,
    device: str | torch.device = "cpu",
    keep_quantized: bool = True,
    quant_compute: str = "auto",
) -> Loaded:
    """Open ``path`` (file, shard folder, diffusers repository or GGUF) and load the component it holds."""
    checkpoint = open_checkpoint(path, spec.component)
    return load_checkpoint(spec, checkpoint, dtype, device, keep_quantized, quant_compute=quant_compute)


def load_checkpoint(
    spec: ComponentSpec,
    checkpoint: Checkpoint,
    dtype: torch.dtype | None,
    device: str | torch.device = "cpu",
    keep_quantized: bool = True,
    shard: Shard | None = None,
    quant_compute: str = "auto",
) -> Loaded:
    """Load ``checkpoint`` into the spec's module in ``dtype`` (the compute dtype).

    Quantised linear layers stay quantised and dequantise per call when ``keep_quantized`` (memory near the
    file's size); otherwise, and for every quantised tensor that is not a linear weight (an embedding), they
    are dequantised at load, once, into ``dtype``. ``shard`` (tensor parallelism) narrows the meta-built
    module and the plan to this process's slices before anything is read. ``quant_compute`` (``auto``,
    ``dequantize`` or ``format``: ``kitchen.MODES``) says whether layers staying quantised multiply in their
    format where the device can.
    """
    check_mode(quant_compute)
    load_plan = plan_checkpoint(spec, checkpoint)
    config = read_config(spec, load_plan.shapes, checkpoint)
    description = spec.describe(config)
    with torch.device("meta"):
        module = spec.build(config)
    load_plan = replace(load_plan, what=f"{checkpoint.name} ({description})")
    if shard is not None:
        load_plan = shard(module, load_plan)
    load_plan = load_plan.only(spec.wanted).choose_stays_quantized(module, spec, keep_quantized)
    load_plan = store_quantized(module, load_plan, spec.int8_matmul, quant_compute)
    check(module, load_plan, spec)
    fill(module, load_plan, spec, dtype, device)
    if spec.sources is not None:
        for name, layer in linears(module):
            if layer.source is PLAIN:
                layer.source = spec.sources(name, layer, checkpoint)
    module.eval().requires_grad_(False)
    if hasattr(module, "compute_dtype") and dtype is not None:
        module.compute_dtype = dtype
    stays = load_plan.stays_quantized
    formats = sorted({q.label for q in stays.values()})
    stored = f", {len(stays)} layers kept as {' / '.join(formats)}" if stays else ""
    log.info("loaded %s from %s (%s%s)", description, checkpoint.name, dtype, stored)
    return Loaded(module, config, checkpoint, description)


def store_quantized(
    module: nn.Module, load_plan: LoadPlan, int8_matmul: bool, quant_compute: str = "auto"
) -> LoadPlan:
    """Give each meta layer that stays quantised its quantised storage, all sharing one compute choice
    (``kitchen.QuantCompute``); the plan gains their scales."""
    pieces = dict(load_plan.pieces)
    stays = load_plan.stays_quantized
    compute = QuantCompute(load_plan.what, {q.format for q in stays.values()}, quant_compute, int8_matmul)
    for name, q in stays.items():
        quantize_layer(module.get_submodule(name), q, load_plan.what, compute)
        for role in q.stored:
            if role != "weight":
                pieces[f"{name}.{role}"] = [(q.keys[role], Placement(f"{name}.{role}"))]
    return replace(load_plan, pieces=pieces)


def weight_bytes(spec: ComponentSpec, path: str | Path, dtype: torch.dtype) -> tuple[Any, int, Checkpoint]:
    """(config, bytes of the weights once loaded in ``dtype``, checkpoint) from the file headers alone.

    Layers staying quantised count their stored bytes, every other tensor ``dtype``'s size.
    """
    checkpoint = open_checkpoint(path, spec.component)
    load_plan = plan_checkpoint(spec, checkpoint).only(spec.wanted)
    config = read_config(spec, load_plan.shapes, checkpoint)
    if load_plan.quantized:  # which layers stay quantised depends on the module: the meta model says
        with torch.device("meta"):
            load_plan = load_plan.choose_stays_quantized(spec.build(config), spec, keep_quantized=True)
    return config, load_plan.held_bytes(dtype), checkpoint


def _defaults(module_keys, load_plan: LoadPlan, spec: ComponentSpec) -> dict[str, Callable[[], torch.Tensor]]:
    """The tensors a file may leave out that the spec makes instead."""
    return {k: f for k, f in spec.defaults.items() if k in module_keys and k not in load_plan.pieces}


def check(module: nn.Module, load_plan: LoadPlan, spec: ComponentSpec) -> None:
    """Every state-dict entry of the meta-built module planned, every planned tensor wanted, and every shape
    and dtype loadable, before the first tensor is read. Raises ``Flux2Error`` naming the tensors."""
    what, pieces, shapes = load_plan.what, load_plan.pieces, load_plan.shapes
    expected = module.state_dict(keep_vars=True)
    defaults = _defaults(expected, load_plan, spec)
    missing = sorted(set(expected) - set(pieces) - set(defaults))
    unexpected = sorted(set(pieces) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} tensors ({_summarize(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected tensors ({_summarize(unexpected)})")
        raise Flux2Error(f"{what}: the file does not match the architecture read from it: {'; '.join(parts)}")
    stored_keys, at_load = load_plan.stored_keys, load_plan.dequantized_at_load
    for key, target in expected.items():
        if key in defaults or key in stored_keys:  # quantised storage was checked when the layer took it
            continue
        shape = shapes[key]
        if key in at_load and at_load[key].format in ("nvfp4", "mxfp8"):
            shape = tuple(min(a, b) for a, b in zip(shape, target.shape))  # padded rows and columns go
        if _squeezed(tuple(target.shape)) != _squeezed(shape) or target.numel() != math.prod(shape):
            raise Flux2Error(
                f"{what}: tensor {key} has shape {list(shapes[key])}, expected {list(target.shape)}; "
                "the file is not a consistent checkpoint"
            )
        file_key = pieces[key][0][0]
        stored = tensor_dtype(load_plan.tensors, file_key)
        dequantized = key in at_load or file_key in load_plan.quantized_parts  # a part of a fused weight
        if target.is_floating_point() and not _is_float(stored) and not dequantized:
            kind = (
                "packed integer weights with no format marker" if stored in _PACKED else "not a weight dtype"
            )
            raise Flux2Error(
                f"{what} stores {file_key} as {stored}, {kind}, which cannot be loaded: use the bf16, fp8, "
                "nvfp4, int8 or GGUF release of the model"
            )


def fill(module: nn.Module, load_plan: LoadPlan, spec: ComponentSpec, dtype, device) -> None:
    """Assign every state-dict entry of the meta-built module from the file, one tensor at a time (the plan
    was ``check``ed): storage of layers staying quantised as stored, tensors dequantised at load into
    ``dtype`` as they are read, everything else cast by the dtype policy."""
    tensors, what = load_plan.tensors, load_plan.what
    expected = module.state_dict(keep_vars=True)
    defaults = _defaults(expected, load_plan, spec)
    stored_keys, at_load = load_plan.stored_keys, load_plan.dequantized_at_load
    for key, target in expected.items():
        cast = None  # the dtype a floating tensor takes (None: as stored)
        if dtype is not None and key not in stored_keys and target.is_floating_point():
            cast = torch.float32 if any(key.startswith(p) for p in spec.keep_float32) else dtype
        if key in defaults:
            tensor = defaults[key]()
        elif key in at_load:
            q = at_load[key]
            tensor = dequantize(q, {role: tensors[k] for role, k in q.keys.items()}, dtype or torch.float32)
            tensor = tensor[tuple(slice(0, n) for n in target.shape)]
        else:
            parts = load_plan.quantized_parts
            tensor = assemble(load_plan.pieces[key], tensors, key, what, cast, parts, dtype or torch.float32)
        tensor = tensor.reshape(target.shape)  # diffusers' Linear [C, C] for a 1x1 conv [C, C, 1, 1]
        if cast is not None and tensor.is_floating_point():
            tensor = tensor.to(cast)
        _assign(module, key, tensor.to(device), isinstance(target, nn.Parameter))
    release = getattr(tensors, "release_buffers", None)
    if release is not None:
        release()


def assemble(
    parts: list[tuple[str, Placement]],
    tensors: Mapping,
    key: str,
    what: str,
    dtype: torch.dtype | None = None,
    quantized_parts: Mapping | None = None,
    compute_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Our tensor ``key`` from its file pieces: one tensor as it is, or parts concatenated in order; read
    straight into ``dtype`` when one is given (a floating tensor is then never held in both dtypes). A part
    in ``quantized_parts`` (file key -> its quantised layer) is dequantised into ``compute_dtype`` first."""

    def read(file_key: str) -> torch.Tensor:
        q = (quantized_parts or {}).get(file_key)
        if q is None:
            return read_tensor(tensors, file_key, dtype)
        return dequantize(q, {role: tensors[k] for role, k in q.keys.items()}, compute_dtype)

    if len(parts) == 1 and parts[0][1].into is None:
        file_key, placement = parts[0]
        return _take(read(file_key), placement)
    blocks = {p.into.index: (file_key, p) for file_key, p in parts if p.into is not None}
    count = parts[0][1].into.count if parts[0][1].into is not None else 0
    if len(parts) != count or sorted(blocks) != list(range(count)):
        raise Flux2Error(f"{what}: {key} is missing some of its parts (e.g. q/k/v); the file is incomplete")
    return torch.cat([_take(read(blocks[i][0]), blocks[i][1]) for i in range(count)])


def _take(tensor: torch.Tensor, placement: Placement) -> torch.Tensor:
    if placement.take is None:
        return tensor
    offset, size = placement.take.rows(tensor.shape[0])
    return tensor.narrow(0, offset, size)


def _assign(module: nn.Module, key: str, tensor: torch.Tensor, parameter: bool) -> None:
    owner_name, _, name = key.rpartition(".")
    owner = module.get_submodule(owner_name)
    if parameter:
        owner._parameters[name] = nn.Parameter(tensor, requires_grad=False)
    else:
        owner._buffers[name] = tensor


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    while shape and shape[-1] == 1 and len(shape) > 1:
        shape = shape[:-1]
    return shape


_PACKED = (torch.int8, torch.uint8, "I8", "U8", "F4", "F6_E2M3", "F6_E3M2", "F8_E8M0")


def _is_float(dtype) -> bool:
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point


def _summarize(keys: list[str], limit: int = 4) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... {len(keys) - limit} more" if len(keys) > limit else "")
