"""One loading pipeline for the DiT, the text encoder and the VAE.

    open lazily -> strip prefixes -> identify the kind -> map keys -> config from shapes -> build on meta
    -> fill strictly, one tensor at a time, in the dtype policy -> attach weight sources

Each component describes itself with a ``ComponentSpec`` (its prefixes, key map, kind check, how to read its
config from shapes and how to build it); nothing else differs between them. Shapes come from the file
headers, so the config is known before a single tensor is read. Filling reads each tensor (or the parts of a
fused one), casts it and assigns it before reading the next: the file is never held in memory next to the
model. The dtype policy is one rule: floating tensors take the requested dtype except those whose key starts
with one of the spec's ``keep_float32`` prefixes (the VAE's BatchNorm statistics); others keep theirs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import Flux2Error
from ..ops import PLAIN, Linear, WeightSource, linears
from .checkpoint import Checkpoint, open_checkpoint, read_tensor, tensor_dtype, tensor_shape
from .keymaps import KeyMap, Placement, plan, strip_prefix
from .quant import QuantLayer, dequantize, find_quantized, quantize_layer

log = logging.getLogger(__name__)

Plan = dict[str, list[tuple[str, Placement]]]  # our key -> (file key, placement) pieces
Quantized = dict[str, QuantLayer]  # our layer name -> how the file quantised it
Shapes = dict[str, tuple[int, ...]]
# (meta module, plan, shapes, quantised layers, tensors, what) -> the same, narrowed to one process's shard
Shard = Callable[[nn.Module, Plan, Shapes, Quantized, Mapping, str], tuple[Plan, Shapes, Quantized, Mapping]]


@dataclass(frozen=True)
class ComponentSpec:
    """What differs between loading one kind of component and another."""

    what: str  # "diffusion model", "text encoder", "VAE": for messages
    component: str  # its subfolder in a diffusers repository
    keymap: KeyMap
    config: Callable[[dict[str, tuple[int, ...]], Checkpoint], Any]  # our key -> shape, file -> config
    build: Callable[[Any], nn.Module]  # config -> module (called on the meta device)
    describe: Callable[[Any], str]
    prefixes: tuple[tuple[str, ...], ...] = ()  # groups, stripped in order (first match of each group)
    identify: Callable[[dict[str, str], Checkpoint], None] = lambda names, ckpt: None  # raises: wrong file
    rename: Callable[[dict[str, str]], dict[str, str]] = lambda names: names  # before the key map
    wanted: Callable[[str], bool] = lambda key: True  # our keys to load; the rest of the file is skipped
    keep_float32: tuple[str, ...] = ()
    int8_matmul: bool = False  # int8 layers multiply in int8 (ComfyUI: diffusion models; encoders dequantise)
    # layers a file may store quantised that are loaded in the compute dtype (their model reads the weight's
    # dtype: transformers' T5 casts its activations to ``wo.weight.dtype``)
    dequantized: Callable[[str], bool] = lambda name: False
    defaults: Mapping[str, Callable[[], torch.Tensor]] = field(default_factory=dict)  # optional in files
    # The weight source of each linear layer, given its name and the checkpoint (default: plain weights).
    sources: Callable[[str, Linear, Checkpoint], WeightSource] | None = None


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
) -> Loaded:
    """Open ``path`` (file, shard folder, diffusers repository or GGUF) and load the component it holds."""
    return load_checkpoint(spec, open_checkpoint(path, spec.component), dtype, device, keep_quantized)


def load_checkpoint(
    spec: ComponentSpec,
    checkpoint: Checkpoint,
    dtype: torch.dtype | None,
    device: str | torch.device = "cpu",
    keep_quantized: bool = True,
    shard: Shard | None = None,
) -> Loaded:
    """Load ``checkpoint`` into the spec's module in ``dtype`` (the compute dtype).

    Quantised linear layers keep their stored form and dequantise per call when ``keep_quantized`` (memory
    near the file's size); otherwise, and for every quantised tensor that is not a linear weight (an
    embedding), they are dequantised once, here, into ``dtype``. ``shard`` (tensor parallelism) narrows the
    meta-built module and the plan to this process's slices before anything is read.
    """
    pieces, shapes, quantized = plan_checkpoint(spec, checkpoint)
    config = read_config(spec, shapes, checkpoint)
    description = spec.describe(config)
    with torch.device("meta"):
        module = spec.build(config)
    what = f"{checkpoint.name} ({description})"
    tensors = checkpoint.tensors
    if shard is not None:
        pieces, shapes, quantized, tensors = shard(module, pieces, shapes, quantized, tensors, what)
    wanted = {key: parts for key, parts in pieces.items() if spec.wanted(key)}
    quantized = {name: q for name, q in quantized.items() if spec.wanted(name + ".weight")}
    keep = {name: q for name, q in quantized.items() if not spec.dequantized(name)} if keep_quantized else {}
    kept = _keep_quantized(module, wanted, keep, what, spec.int8_matmul) if keep else {}
    eager = {name + ".weight": q for name, q in quantized.items() if name not in kept}
    fill(module, wanted, tensors, shapes, dtype, device, spec, what, kept, eager)
    if spec.sources is not None:
        for name, layer in linears(module):
            if layer.source is PLAIN:
                layer.source = spec.sources(name, layer, checkpoint)
    module.eval().requires_grad_(False)
    if hasattr(module, "compute_dtype") and dtype is not None:
        module.compute_dtype = dtype
    formats = sorted({q.label for q in quantized.values()})
    stored = f", {len(kept)} layers kept as {' / '.join(formats)}" if kept else ""
    log.info("loaded %s from %s (%s%s)", description, checkpoint.name, dtype, stored)
    return Loaded(module, config, checkpoint, description)


def kept_quantized(module, quantized: Quantized) -> Quantized:
    """The quantised layers that stay quantised: linear layers whose format dequantises per call. The rest
    (an embedding, a GGUF type without a torch kernel) are dequantised once, at load."""
    layers = dict(linears(module))
    return {name: q for name, q in quantized.items() if name in layers and q.dequantizes_per_call}


def _keep_quantized(module, pieces: Plan, quantized: Quantized, what: str, int8_matmul: bool) -> Quantized:
    """Turn the meta module's quantised linear layers into quantised storage; add their scales to the plan."""
    kept = kept_quantized(module, quantized)
    for name, q in kept.items():
        quantize_layer(module.get_submodule(name), q, what, int8_matmul)
        for role in q.stored:
            if role != "weight":
                pieces[f"{name}.{role}"] = [(q.keys[role], Placement(f"{name}.{role}"))]
    return kept


MAX_BLOCKS = 512  # far beyond any model of the family (FLUX.2 [dev]: 48 single blocks; Qwen3: 36 layers)


def block_count(keys, prefix: str, what: str, name: str, limit: int = MAX_BLOCKS) -> int:
    """How many numbered blocks ``prefix{i}.`` the keys hold, checked before anything is built: indices
    must run from 0 without a gap and stay under ``limit`` (a corrupt or hostile index cannot make the
    loader build a million blocks)."""
    indices = set()
    for key in keys:
        if key.startswith(prefix):
            head = key[len(prefix) :].split(".", 1)[0]
            if not (head.isascii() and head.isdigit()):
                raise Flux2Error(f"{name}: {key} has no valid block number: the file is corrupt")
            indices.add(int(head))
    if not indices:
        return 0
    count = max(indices) + 1
    if count > limit:
        raise Flux2Error(
            f"{name} names {what} up to number {count - 1}, more than any model of this family has "
            f"({limit}): the file is corrupt or not this kind of model"
        )
    if len(indices) != count:
        gaps = sorted(set(range(count)) - indices)
        raise Flux2Error(
            f"{name} lacks {what} {', '.join(map(str, gaps[:4]))}{' ...' if len(gaps) > 4 else ''} of "
            f"0..{count - 1}: the file is incomplete, download it again"
        )
    return count


def weight_bytes(spec: ComponentSpec, path: str | Path, dtype: torch.dtype) -> tuple[Any, int, Checkpoint]:
    """(config, bytes of the weights once loaded in ``dtype``, checkpoint) from the file headers alone.

    Quantised layers count their stored bytes (they stay quantised), every other tensor ``dtype``'s size.
    """
    checkpoint = open_checkpoint(path, spec.component)
    pieces, shapes, quantized = plan_checkpoint(spec, checkpoint)
    config = read_config(spec, shapes, checkpoint)
    quantized = {name: q for name, q in quantized.items() if not spec.dequantized(name)}
    if quantized:  # which layers stay quantised depends on the module: the meta model says
        with torch.device("meta"):
            quantized = kept_quantized(spec.build(config), quantized)
    itemsize = torch.finfo(dtype).bits // 8
    total = 0
    for key, shape in shapes.items():
        if key in pieces and spec.wanted(key):
            q = quantized.get(key.removesuffix(".weight")) if key.endswith(".weight") else None
            total += q.stored_bytes() if q is not None else math.prod(shape) * itemsize
    return config, total, checkpoint


def read_config(spec: ComponentSpec, shapes: dict[str, tuple[int, ...]], checkpoint: Checkpoint):
    """The spec's config from the shapes; shapes no model has (a corrupt header) become a clear error."""
    try:
        return spec.config(shapes, checkpoint)
    except Flux2Error:
        raise
    except (ValueError, IndexError, KeyError, TypeError, ZeroDivisionError) as e:
        raise Flux2Error(
            f"{checkpoint.name}: its tensor shapes do not form a {spec.what} ({type(e).__name__}: {e}): the "
            "file is corrupt or not this kind of model"
        ) from None


def plan_checkpoint(
    spec: ComponentSpec, checkpoint: Checkpoint
) -> tuple[Plan, dict[str, tuple[int, ...]], Quantized]:
    """Our keys with their file pieces and (logical) shapes, and the quantised layers, from names and headers
    alone (nothing is read but the small ``comfy_quant`` markers)."""
    names = {k: k for k in checkpoint.tensors}
    for group in spec.prefixes:
        names = {short: names[key] for short, key in strip_prefix(names, group).items()}
    spec.identify(names, checkpoint)
    names = spec.rename(names)
    # A header's layer list may also name other components' layers (all-in-one files): only ours match.
    found, aux = find_quantized(names, checkpoint.tensors, checkpoint.metadata, checkpoint.name)
    names = {short: key for short, key in names.items() if short not in aux}
    pieces = {
        key: [(names[short], placement) for short, placement in parts]
        for key, parts in plan(names, spec.keymap, spec.keymap.up_levels(names)).items()
    }
    for key, parts in pieces.items():  # a fused tensor needs every one of its parts (q, k and v)
        count = parts[0][1].into.count if parts[0][1].into is not None else 1
        if len(parts) > count or (count > 1 and any(p.into is None for _, p in parts)):
            raise Flux2Error(
                f"{checkpoint.name} holds {key} more than once ({', '.join(k for k, _ in parts)}): the file "
                "mixes two namings; use a clean copy of the model"
            )
        if len(parts) < count:
            raise Flux2Error(
                f"{checkpoint.name}: {key} is missing some of its parts (e.g. q/k/v); the file is incomplete"
            )
    shapes = {
        key: _joined_shape(parts, checkpoint.tensors, key, checkpoint.name) for key, parts in pieces.items()
    }
    quantized = {}
    ours = {
        parts[0][0]: key for key, parts in pieces.items() if len(parts) == 1 and parts[0][1] == Placement(key)
    }
    for q in found.values():
        key = ours.get(q.keys["weight"])
        if key is None or not key.endswith(".weight"):
            raise Flux2Error(
                f"{checkpoint.name}: the quantised tensor {q.keys['weight']} is part of a fused weight in "
                "this naming, which cannot stay quantised; use the BFL-named file of the model"
            )
        shapes[key] = q.shape  # the logical shape (a packed nvfp4 row holds two values per byte)
        quantized[key.removesuffix(".weight")] = q
    return pieces, shapes, quantized


def fill(
    module,
    pieces: Plan,
    tensors,
    shapes,
    dtype,
    device,
    spec: ComponentSpec,
    what: str,
    kept: Quantized | None = None,
    eager: dict[str, QuantLayer] | None = None,
) -> None:
    """Assign every state-dict entry of a meta-built module from the file, strictly, one at a time.

    ``kept``: quantised layers whose stored tensors are assigned as they are (no cast); ``eager``: keys of
    quantised tensors dequantised into ``dtype`` as they are read.
    """
    kept, eager = kept or {}, eager or {}
    stored_keys = {f"{name}.{role}" for name, q in kept.items() for role in q.stored}
    expected = module.state_dict(keep_vars=True)
    defaults = {k: f for k, f in spec.defaults.items() if k in expected and k not in pieces}
    missing = sorted(set(expected) - set(pieces) - set(defaults))
    unexpected = sorted(set(pieces) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} tensors ({_summarize(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected tensors ({_summarize(unexpected)})")
        raise Flux2Error(f"{what}: the file does not match the architecture read from it: {'; '.join(parts)}")
    for key, target in expected.items():
        if key in defaults or key in stored_keys:  # kept storage was checked when the layer took it
            continue
        shape = shapes[key]
        if key in eager and eager[key].format in ("nvfp4", "mxfp8"):
            shape = tuple(min(a, b) for a, b in zip(shape, target.shape))  # padded rows and columns go
        if _squeezed(tuple(target.shape)) != _squeezed(shape) or target.numel() != math.prod(shape):
            raise Flux2Error(
                f"{what}: tensor {key} has shape {list(shapes[key])}, expected {list(target.shape)}; "
                "the file is not a consistent checkpoint"
            )
        file_key = pieces[key][0][0]
        stored = tensor_dtype(tensors, file_key)
        if target.is_floating_point() and not _is_float(stored) and key not in eager:
            kind = (
                "packed integer weights with no format marker" if stored in _PACKED else "not a weight dtype"
            )
            raise Flux2Error(
                f"{what} stores {file_key} as {stored}, {kind}, which cannot be loaded: use the bf16, fp8, "
                "nvfp4, int8 or GGUF release of the model"
            )
    for key, target in expected.items():
        cast = None  # the dtype a floating tensor takes (None: as stored)
        if dtype is not None and key not in stored_keys and target.is_floating_point():
            cast = torch.float32 if any(key.startswith(p) for p in spec.keep_float32) else dtype
        if key in defaults:
            tensor = defaults[key]()
        elif key in eager:
            q = eager[key]
            tensor = dequantize(q, {role: tensors[k] for role, k in q.keys.items()}, dtype or torch.float32)
            tensor = tensor[tuple(slice(0, n) for n in target.shape)]
        else:
            tensor = assemble(pieces[key], tensors, key, what, cast)
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
) -> torch.Tensor:
    """Our tensor ``key`` from its file pieces: one tensor as it is, or parts concatenated in order; read
    straight into ``dtype`` when one is given (a floating tensor is then never held in both dtypes)."""
    if len(parts) == 1 and parts[0][1].into is None:
        file_key, placement = parts[0]
        return _take(read_tensor(tensors, file_key, dtype), placement)
    blocks = {p.into.index: (file_key, p) for file_key, p in parts if p.into is not None}
    count = parts[0][1].into.count if parts[0][1].into is not None else 0
    if len(parts) != count or sorted(blocks) != list(range(count)):
        raise Flux2Error(f"{what}: {key} is missing some of its parts (e.g. q/k/v); the file is incomplete")
    return torch.cat([_take(read_tensor(tensors, blocks[i][0], dtype), blocks[i][1]) for i in range(count)])


def _take(tensor: torch.Tensor, placement: Placement) -> torch.Tensor:
    if placement.take is None:
        return tensor
    offset, size = placement.take.rows(tensor.shape[0])
    return tensor.narrow(0, offset, size)


def _joined_shape(parts, tensors, key: str, name: str) -> tuple[int, ...]:
    shapes = []
    for file_key, placement in parts:
        shape = tensor_shape(tensors, file_key)
        if placement.take is not None:
            shape = (placement.take.rows(shape[0])[1], *shape[1:])
        shapes.append(shape)
    if len(shapes) == 1:
        return shapes[0]
    if len({s[1:] for s in shapes}) != 1:
        raise Flux2Error(f"{name}: the parts of {key} do not fit together; the file is not consistent")
    return (sum(s[0] for s in shapes), *shapes[0][1:])


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
