"""What loading one checkpoint into one module reads, and where each tensor goes: the load plan.

    open lazily -> strip prefixes -> identify the kind -> map keys -> shapes and quantised layers -> LoadPlan

Everything here comes from the file's names and headers (nothing is read but the small ``comfy_quant``
markers), so the config, the memory a model will hold and whether a file is the right kind are all known
before a tensor is read. ``loading.py`` builds the module on the meta device from the plan's shapes and
fills it.

A quantised layer of the file ends up one of two ways, and the plan says which:

- it **stays quantised** (``LoadPlan.stays_quantized``): its stored tensors are assigned as they are and
  dequantised per call (fp8, int8, nvfp4, mxfp8 and GGUF linear layers with a torch kernel);
- it is **dequantised at load** (``LoadPlan.dequantized_at_load``): read, dequantised once into the compute
  dtype, and held like any other weight (an embedding, a GGUF type without a kernel, a layer the spec's model
  reads the dtype of, or every layer when the caller turned ``keep_quantized`` off).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import nn

from ..errors import Flux2Error
from ..ops import Linear, WeightSource, linears
from .checkpoint import Checkpoint, tensor_shape
from .keymaps import KeyMap, Placement, plan, strip_prefix
from .quant import QuantLayer, find_quantized

Pieces = dict[str, list[tuple[str, Placement]]]  # our key -> (file key, placement) pieces
Quantized = dict[str, QuantLayer]  # our layer name -> how the file quantised it
Shapes = dict[str, tuple[int, ...]]


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


@dataclass(frozen=True)
class LoadPlan:
    """One checkpoint's tensors mapped onto one module.

    ``pieces``: our key -> its file pieces (a fused weight has several); ``shapes``: our key -> its logical
    shape; ``quantized``: the layers the file stores quantised; ``tensors``: the file's (lazy) tensors;
    ``stays_quantized``: those of ``quantized`` that keep their stored form (chosen once the module is built:
    ``choose_stays_quantized``); ``what``: the file (and, once known, the model) for messages.
    """

    what: str
    pieces: Pieces
    shapes: Shapes
    quantized: Quantized
    tensors: Mapping
    stays_quantized: Quantized = field(default_factory=dict)
    # file weight key -> its quantised layer, for the parts of a fused weight (diffusers' separate q / k / v,
    # each with its own scale): dequantised as read, then joined, so that weight is held in the load dtype
    quantized_parts: dict[str, QuantLayer] = field(default_factory=dict)

    @property
    def dequantized_at_load(self) -> dict[str, QuantLayer]:
        """Our weight key -> its quantised layer, for every quantised tensor dequantised as it is read."""
        return {name + ".weight": q for name, q in self.quantized.items() if name not in self.stays_quantized}

    @property
    def stored_keys(self) -> set[str]:
        """Our keys whose tensors are assigned exactly as stored (the storage of layers staying quantised)."""
        return {f"{name}.{role}" for name, q in self.stays_quantized.items() for role in q.stored}

    def only(self, wanted: Callable[[str], bool]) -> LoadPlan:
        """The plan narrowed to the keys ``wanted`` (the rest of the file is never read)."""
        return replace(
            self,
            pieces={key: parts for key, parts in self.pieces.items() if wanted(key)},
            quantized={name: q for name, q in self.quantized.items() if wanted(name + ".weight")},
        )

    def choose_stays_quantized(
        self, module: nn.Module, spec: ComponentSpec, keep_quantized: bool = True
    ) -> LoadPlan:
        """The plan with its layers that stay quantised chosen: linear layers of ``module`` (built on meta)
        whose format dequantises per call and which the spec does not want dequantised; none when
        ``keep_quantized`` is off."""
        if not keep_quantized:
            return replace(self, stays_quantized={})
        layers = dict(linears(module))
        stays = {
            name: q
            for name, q in self.quantized.items()
            if name in layers and q.dequantizes_per_call and not spec.dequantized(name)
        }
        return replace(self, stays_quantized=stays)

    def held_bytes(self, dtype: torch.dtype) -> int:
        """Bytes of the weights once loaded in ``dtype``: layers staying quantised count their stored bytes,
        every other tensor ``dtype``'s size."""
        total = 0
        for key, shape in self.shapes.items():
            if key in self.pieces:
                q = self.stays_quantized.get(key.removesuffix(".weight")) if key.endswith(".weight") else None
                total += q.stored_bytes() if q is not None else math.prod(shape) * dtype.itemsize
        return total


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


def plan_checkpoint(spec: ComponentSpec, checkpoint: Checkpoint) -> LoadPlan:
    """The load plan of ``checkpoint`` for ``spec``, from names and headers alone. Raises ``Flux2Error``
    when the file is not the spec's kind, mixes two namings, or lacks a part of a fused tensor."""
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
    # the quantised parts of a fused weight (diffusers' q / k / v, each with its own scale): dequantised and
    # joined at load, so they count with their logical shapes
    fused = {file_key for parts in pieces.values() if len(parts) > 1 for file_key, _ in parts}
    parts_quantized = {q.keys["weight"]: q for q in found.values() if q.keys["weight"] in fused}
    shapes = {
        key: _joined_shape(parts, checkpoint.tensors, key, checkpoint.name, parts_quantized)
        for key, parts in pieces.items()
    }
    quantized = {}
    ours = {
        parts[0][0]: key for key, parts in pieces.items() if len(parts) == 1 and parts[0][1] == Placement(key)
    }
    for q in found.values():
        if q.keys["weight"] in parts_quantized:
            continue
        key = ours.get(q.keys["weight"])
        if key is None or not key.endswith(".weight"):
            raise Flux2Error(
                f"{checkpoint.name}: the quantised tensor {q.keys['weight']} has no place in the "
                f"{spec.what}: the file is not of this kind"
            )
        shapes[key] = q.shape  # the logical shape (a packed nvfp4 row holds two values per byte)
        quantized[key.removesuffix(".weight")] = q
    return LoadPlan(
        checkpoint.name, pieces, shapes, quantized, checkpoint.tensors, quantized_parts=parts_quantized
    )


def _joined_shape(parts, tensors, key: str, name: str, quantized: Mapping | None = None) -> tuple[int, ...]:
    """The shape of our ``key`` from its parts; a part in ``quantized`` counts with its logical shape (a
    packed nvfp4 row holds two values per byte)."""
    shapes = []
    for file_key, placement in parts:
        q = (quantized or {}).get(file_key)
        shape = tuple(q.shape) if q is not None else tensor_shape(tensors, file_key)
        if placement.take is not None:
            shape = (placement.take.rows(shape[0])[1], *shape[1:])
        shapes.append(shape)
    if len(shapes) == 1:
        return shapes[0]
    if len({s[1:] for s in shapes}) != 1:
        raise Flux2Error(f"{name}: the parts of {key} do not fit together; the file is not consistent")
    return (sum(s[0] for s in shapes), *shapes[0][1:])
