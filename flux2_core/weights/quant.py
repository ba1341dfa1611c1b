"""Quantised checkpoints: which layers of a file are quantised, in which format, and their dequantisation.

A layer ``P`` is quantised exactly when the file says so, in this order (the first that applies wins):

1. ``_quantization_metadata`` in the safetensors header: ``{"layers": {"P": {"format": ...}}}``, over
2. ``P.comfy_quant`` tensors (the UTF-8 bytes of the same JSON object; a header entry overrides one);
3. the legacy ``scaled_fp8`` marker: every layer with ``P.scale_weight`` is fp8;
4. a ``P.weight`` stored as float8 with no marker: fp8 with scale 1 (plain, unscaled fp8 files);
5. a GGUF block type (Q8_0, Q4_K, ...) for ``P.weight``.

Everything else loads as stored and is cast to the compute dtype, which is what makes "mixed" files work.
Formats and their dequantisation (``W`` is [out, in]; see the formats spec for the layouts):

- ``float8_e4m3fn`` / ``float8_e5m2``: ``W = q * weight_scale`` (per tensor, or per row when it has ``out``
  entries), both cast to the compute dtype first, as ComfyUI does;
- ``int8_tensorwise``: ``W = q * weight_scale`` in float32 (per tensor or per row), then, with ConvRot, the
  block-diagonal Hadamard rotation undone: ``W = (W.reshape(o, i/g, g) @ H_g^T).reshape(o, i)``;
- ``nvfp4``: two E2M1 codes per byte, the even column in the HIGH nibble; one float8 scale per 16 inputs,
  stored in the swizzled 128x4-tile layout; times the global ``weight_scale_2``; padded rows/columns sliced;
- ``mxfp8``: float8 values times ``2^(E - 127)`` per 32 inputs (E8M0 bytes, same swizzle, E = 0 reads 0);
- ``convrot_w4a4``: signed int4 pairs in int8 [out, in/2] (low nibble first), a float32 scale per row and a
  ConvRot group size, as ComfyUI writes it; read through comfy-kitchen's layout (``kitchen.py``), and refused
  by name when the installed comfy-kitchen lacks it;
- ``asym_w4a8_int8`` (W4A8 / W6A8: packed codes, group and channel scales, optional codebook and asymmetric
  correction, ConvRot) and ``awq_w4a16`` (unsigned nibbles, transposed scales and additive zeros), and nvfp4's
  ``pre_quant_scale`` (input smoothing, folded into the weight when dequantised): ``quant_w4``;
- GGUF types: ``gguf_quants.dequantize`` (torch ports of ggml's formulas).

``input_scale`` / ``scale_input`` are activation scales for in-format matmuls (``kitchen.py``): kept with the
layer (a scalar), not needed to dequantise. How each format multiplies (in format or dequantised first) is
``kitchen.QuantCompute``'s choice, made per model and device.
An unknown format is refused by name, and so is SVDQuant W4A4 (Nunchaku's layout, which ComfyUI has no file
layout for); bytes of a quantised layer are never read as if they were weights.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..errors import Flux2Error
from . import kitchen, quant_w4
from .checkpoint import tensor_dtype, tensor_shape
from .gguf_quants import GGMLType, block_size, has_torch_kernel, type_name
from .gguf_quants import dequantize as gguf_dequantize

FP8 = {"float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
FORMATS = (*FP8, "int8_tensorwise", "nvfp4", "mxfp8", "convrot_w4a4", quant_w4.W4A8, quant_w4.AWQ, "gguf")
AUX_SUFFIXES = (
    ".comfy_quant",
    ".weight_scale",
    ".weight_scale_2",
    ".input_scale",
    ".scale_weight",
    ".scale_input",
    ".pre_quant_scale",
    *(f".{role}" for role in quant_w4.EXTRA_ROLES),
)
# what a quantised layer keeps
STORED_ROLES = (
    "weight",
    "weight_scale",
    "weight_scale_2",
    "input_scale",
    "pre_quant_scale",
    *quant_w4.EXTRA_ROLES,
)
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_REFUSED = {
    "float8_e4m3fn_rowwise": "row-wise fp8 from convert_to_quant",
    "float8_e4m3fn_blockwise": "block-wise fp8 from convert_to_quant",
    **quant_w4.REFUSED,
}


@dataclass(frozen=True)
class QuantLayer:
    """One quantised layer of a file: its format, the file keys of its tensors and their stored form."""

    format: str
    keys: dict[str, str]  # role ("weight", "weight_scale", "weight_scale_2") -> file key
    stored: dict[str, tuple[tuple[int, ...], torch.dtype]] = field(
        default_factory=dict
    )  # role -> shape, dtype
    shape: tuple[int, ...] = ()  # the logical weight shape (nvfp4 / mxfp8: padded rows and columns)
    convrot: int = 0  # ConvRot group size g (int8, convrot_w4a4), 0 without rotation
    qtype: int = -1  # the GGML type of a GGUF tensor
    linear_dtype: str = ""  # convrot_w4a4: the matmul comfy-kitchen runs ("int4", its default)
    group: int = 0  # the quantisation group along the inputs (asym_w4a8_int8, awq_w4a16)

    @property
    def label(self) -> str:
        if self.format == "gguf":
            return f"GGUF {type_name(self.qtype)}"
        if self.format == quant_w4.W4A8:
            six = self.stored["weight"][0][1] * 8 == self.shape[1] * 6
            return f"{self.format} ({'W6A8' if six else 'W4A8'})"
        return self.format + (" + ConvRot" if self.convrot and self.format == "int8_tensorwise" else "")

    @property
    def dequantizes_per_call(self) -> bool:
        """Whether a linear layer can keep this storage and dequantise at compute time."""
        return self.format != "gguf" or has_torch_kernel(self.qtype)

    def stored_bytes(self) -> int:
        return sum(math.prod(shape) * _itemsize(dtype) for shape, dtype in self.stored.values())


def find_quantized(
    names: dict[str, str], tensors: Mapping, metadata: Mapping[str, str], what: str
) -> tuple[dict[str, QuantLayer], set[str]]:
    """({layer: QuantLayer} by short layer name, the short keys that only describe quantisation)."""
    svd = next((short for short in names if short.endswith(quant_w4.SVDQUANT_KEYS)), None)
    if svd is not None:
        raise Flux2Error(
            f"{what}: {svd} belongs to an SVDQuant W4A4 (Nunchaku) layer, which ComfyUI has no file layout "
            "for and which cannot be loaded: use the bf16, fp8, int8, nvfp4, W4A8 or GGUF release"
        )
    weights = {short[: -len(".weight")]: file for short, file in names.items() if short.endswith(".weight")}
    aux = {
        short for short in names if short.endswith(AUX_SUFFIXES) or short.rsplit(".", 1)[-1] == "scaled_fp8"
    }
    markers = {}
    for short in aux:
        if short.endswith(".comfy_quant"):
            markers[short[: -len(".comfy_quant")]] = _json(bytes(tensors[names[short]].tolist()), short, what)
    header = metadata.get("_quantization_metadata")
    if header:
        layers = _json(header.encode(), "_quantization_metadata", what).get("layers", {})
        index = {file[: -len(".weight")]: short for short, file in weights.items()} | {s: s for s in weights}
        for layer, entry in layers.items():
            short = _match_layer(layer, index)
            if short is not None:
                markers[short] = entry
    legacy = not header and any(s.rsplit(".", 1)[-1] == "scaled_fp8" for s in aux)
    found = {}
    for short, file in weights.items():
        entry = markers.get(short)
        stored = tensor_dtype(tensors, file)
        if isinstance(entry, dict):
            params = entry.get("params") if isinstance(entry.get("params"), dict) else {}
            fmt = entry.get("format", params.get("format"))
            found[short] = _layer(short, str(fmt), {**params, **entry}, names, tensors, what)
        elif legacy and short + ".scale_weight" in names:
            fmt = "float8_e5m2" if stored == torch.float8_e5m2 else "float8_e4m3fn"
            found[short] = _layer(short, fmt, {}, names, tensors, what)
        elif stored in (torch.float8_e4m3fn, torch.float8_e5m2) and len(tensor_shape(tensors, file)) == 2:
            # plain fp8 (scale 1, or a scale with no marker); 1-D fp8 tensors (norms) are simply cast
            found[short] = _layer(short, str(stored).removeprefix("torch."), {}, names, tensors, what)
        elif isinstance(stored, GGMLType):
            found[short] = _gguf_layer(short, file, stored, tensors)
        elif any(f"{short}.{role}" in names for role in ("weight_scale", "scale_weight", *STORED_ROLES[4:])):
            raise Flux2Error(
                f"{what}: {short} has a weight scale but no format marker and is stored as {stored}: the "
                "file is in an unknown quantised layout; use the bf16, fp8 or GGUF release"
            )
    return found, aux


def _layer(short, fmt, params, names, tensors, what) -> QuantLayer:
    if fmt in _REFUSED or fmt not in FORMATS or fmt == "gguf":
        kind = _REFUSED.get(fmt, f"the unknown quantisation format {fmt!r}")
        raise Flux2Error(
            f"{what}: layer {short} uses {kind}, which cannot be loaded: use the bf16, fp8 (float8_e4m3fn), "
            "nvfp4, int8_tensorwise, asym_w4a8_int8 or GGUF release of the model"
        )
    keys = {"weight": names[short + ".weight"]}
    for role in STORED_ROLES[4:]:
        if f"{short}.{role}" in names:
            keys[role] = names[f"{short}.{role}"]
    for role, legacy in (
        ("weight_scale", "scale_weight"),
        ("weight_scale_2", None),
        ("input_scale", "scale_input"),
    ):
        for name in (role, legacy):
            if name and short + "." + name in names:
                keys[role] = names[short + "." + name]
                break
    stored = {role: (tensor_shape(tensors, k), tensor_dtype(tensors, k)) for role, k in keys.items()}
    shape, dtype = stored["weight"]

    def bad(problem: str) -> Flux2Error:
        return Flux2Error(f"{what}: {fmt} layer {short} {problem}: the file is corrupt or not a {fmt} file")

    if len(shape) != 2:
        raise bad(f"has a {len(shape)}-D weight {list(shape)}")
    rows, cols = shape
    scale = stored.get("weight_scale")
    if "input_scale" in stored and math.prod(stored["input_scale"][0]) != 1:
        raise bad(f"has an input_scale of shape {list(stored['input_scale'][0])} (expected one value)")
    convrot, linear_dtype, group = 0, "", 0
    if "pre_quant_scale" in stored and fmt != "nvfp4":
        raise bad("has a pre_quant_scale, which only nvfp4 layers take")
    if fmt in quant_w4.ROLES:
        logical, group, convrot = quant_w4.check_layer(fmt, params, stored, bad)
    elif fmt in FP8 or fmt == "int8_tensorwise":
        ok = (FP8[fmt], torch.uint8) if fmt in FP8 else (torch.int8,)
        if dtype not in ok:
            raise bad(f"stores its weight as {dtype}")
        if fmt == "int8_tensorwise" and scale is None:
            raise bad("has no weight_scale")
        if scale is not None and math.prod(scale[0]) not in (1, rows):
            raise bad(f"has a weight_scale of shape {list(scale[0])} (expected 1 or {rows} values)")
        if fmt == "int8_tensorwise" and params.get("convrot"):
            convrot = int(params.get("convrot_groupsize") or 256)
            if convrot < 4 or 4 ** round(math.log(convrot, 4)) != convrot or cols % convrot:
                raise bad(f"has a ConvRot group size {convrot} that is not a power of 4 dividing {cols}")
        logical = (rows, cols)
    elif fmt == "convrot_w4a4":
        _needs_kitchen(short, fmt, what)
        convrot = int(params.get("convrot_groupsize") or 256)
        linear_dtype = str(params.get("linear_dtype") or "int4")
        logical = (rows, cols * 2)
        if dtype != torch.int8 or scale is None or math.prod(scale[0]) != rows:
            raise bad(
                f"stores {dtype} {list(shape)} with a weight_scale of {list(scale[0]) if scale else None}"
            )
        if convrot < 4 or 4 ** round(math.log(convrot, 4)) != convrot:
            raise bad(f"has a ConvRot group size {convrot} that is not a power of 4")
        if logical[1] % convrot or logical[1] % 64:
            raise bad(f"has {logical[1]} inputs, not a multiple of its ConvRot group {convrot} and of 64")
    else:  # nvfp4 / mxfp8: block scales in the swizzled 128x4 layout
        block, per_byte = (16, 2) if fmt == "nvfp4" else (32, 1)
        logical = (rows, cols * per_byte)
        if scale is None or (fmt == "nvfp4" and "weight_scale_2" not in stored):
            raise bad("lacks its block scales")
        if dtype != (torch.uint8 if fmt == "nvfp4" else torch.float8_e4m3fn) or logical[1] % block:
            raise bad(f"stores its weight as {dtype} {list(shape)}")
        expected = (_roundup(rows, 128), _roundup(logical[1] // block, 4))
        if tuple(scale[0]) != expected:
            raise bad(f"has block scales of shape {list(scale[0])}, not the swizzled {list(expected)}")
        if "pre_quant_scale" in stored:
            quant_w4.check_pre_quant_scale(stored, logical, bad)
    stored = {role: value for role, value in stored.items() if role in STORED_ROLES}
    return QuantLayer(fmt, keys, stored, logical, convrot, linear_dtype=linear_dtype, group=group)


def _needs_kitchen(short: str, fmt: str, what: str) -> None:
    """Refuse a format only comfy-kitchen reads, by name, when the installed one cannot read it."""
    found = kitchen.installed()
    if found is None or kitchen.LAYOUTS[fmt] not in found.layouts:
        have = "is not installed" if found is None else f"{found.version} has no {kitchen.LAYOUTS[fmt]}"
        raise Flux2Error(
            f"{what}: layer {short} is {fmt} (packed int4 with ConvRot), which needs comfy-kitchen with its "
            f"{kitchen.LAYOUTS[fmt]} layout, and comfy-kitchen {have}: {kitchen.INSTALL}; or use the bf16, "
            "fp8 or int8 release of the model"
        )


def _gguf_layer(short: str, file: str, qtype: GGMLType, tensors) -> QuantLayer:
    shape = tensor_shape(tensors, file)
    elements, nbytes = block_size(qtype.id)
    raw = (*shape[:-1], shape[-1] // elements * nbytes)
    return QuantLayer("gguf", {"weight": file}, {"weight": (raw, torch.uint8)}, tuple(shape), qtype=qtype.id)


def dequantize(q: QuantLayer, stored: Mapping[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The layer's weight in ``dtype`` from its stored tensors (on their device), logical (padded) shape."""
    w = stored["weight"]
    scale = stored.get("weight_scale")
    if q.format in FP8:
        if w.dtype == torch.uint8:
            w = w.view(FP8[q.format])
        w = w.to(dtype)
        return w if scale is None else w * _per_row(scale.to(dtype), w.shape[0])
    if q.format == "int8_tensorwise":
        w = w.to(torch.float32) * _per_row(scale.to(torch.float32), w.shape[0])
        if q.convrot:
            o, i, g = *w.shape, q.convrot
            w = (w.reshape(o, i // g, g) @ hadamard(g, w.device).T).reshape(o, i)
        return w.to(dtype)
    if q.format == "nvfp4":
        rows, cols = w.shape[0], w.shape[1] * 2
        pairs = F.embedding(w.int(), _e2m1_pairs(dtype, w.device))  # [rows, cols/2, 2]: high nibble first
        blocks = unswizzle(scale.view(torch.float8_e4m3fn) if scale.dtype == torch.uint8 else scale)
        per_block = blocks[:rows, : cols // 16].to(dtype) * stored["weight_scale_2"].to(dtype)
        values = pairs.reshape(rows, -1, 16) * per_block.unsqueeze(-1)
        return quant_w4.smooth(values.reshape(rows, cols), stored)
    if q.format == "mxfp8":
        exponents = unswizzle(scale.view(torch.uint8) if scale.dtype != torch.uint8 else scale)
        exponents = exponents[: w.shape[0], : w.shape[1] // 32].to(torch.int32)
        factor = torch.where(exponents == 0, 0.0, torch.exp2(exponents.to(torch.float32) - 127))
        values = w.to(torch.float32).reshape(w.shape[0], -1, 32) * factor.unsqueeze(-1)
        return values.reshape(w.shape).to(dtype)
    if q.format == quant_w4.W4A8:
        return quant_w4.dequantize_w4a8(q, stored, dtype, hadamard)
    if q.format == quant_w4.AWQ:
        return quant_w4.dequantize_awq(q, stored, dtype)
    if q.format in kitchen.KITCHEN_ONLY:
        return kitchen.dequantize(q, stored, dtype)
    return gguf_dequantize(w, q.qtype, q.shape, dtype)


_PAIRS: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}


def _e2m1_pairs(dtype: torch.dtype, device) -> torch.Tensor:
    """[256, 2]: the two E2M1 values of each byte, the high nibble's first. Built once per dtype and device:
    building it on a GPU copies the table from the host, a synchronisation per layer that would stall
    streaming's overlapped copies."""
    key = (dtype, torch.device(device))
    pairs = _PAIRS.get(key)
    if pairs is None:
        lut = torch.tensor(_E2M1, dtype=dtype)
        codes = torch.arange(256)
        pairs = _PAIRS[key] = torch.stack([lut[codes >> 4], lut[codes & 0x0F]], dim=-1).to(key[1])
    return pairs


def unswizzle(stored: torch.Tensor) -> torch.Tensor:
    """Block scales from the cuBLAS 128x4-tile layout to their logical [rows, blocks] (padded) order.

    Logical S[r, k] sits at flat ``((r//128) * (K/4) + k//4) * 512 + (r%32) * 16 + ((r%128)//32) * 4 + k%4``.
    """
    rows, cols = stored.shape
    tiles = stored.reshape(rows // 128, cols // 4, 32, 4, 4)  # (r//128, k//4, r%32, (r%128)//32, k%4)
    return tiles.permute(0, 3, 2, 1, 4).reshape(rows, cols)


def swizzle(scales: torch.Tensor) -> torch.Tensor:
    """The inverse of ``unswizzle``: logical [rows, blocks] scales (zero-padded to 128 x 4) -> stored."""
    rows, cols = _roundup(scales.shape[0], 128), _roundup(scales.shape[1], 4)
    padded = scales.new_zeros(rows, cols)
    padded[: scales.shape[0], : scales.shape[1]] = scales
    tiles = padded.reshape(rows // 128, 4, 32, cols // 4, 4)  # (r//128, (r%128)//32, r%32, k//4, k%4)
    return tiles.permute(0, 3, 2, 1, 4).reshape(rows, cols)


_HADAMARD: dict[tuple[int, str], torch.Tensor] = {}


def hadamard(g: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """ConvRot's H_g = kron(H4, ..., H4) / sqrt(g) (float32): symmetric, its own inverse."""
    key = (g, str(device))
    if key not in _HADAMARD:
        h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float32)
        h = torch.ones(1, 1)
        while h.shape[0] < g:
            h = torch.kron(h, h4)
        _HADAMARD[key] = (h / math.sqrt(g)).to(device)
    return _HADAMARD[key]


def _per_row(scale: torch.Tensor, rows: int) -> torch.Tensor:
    return scale.reshape(()) if scale.numel() == 1 else scale.reshape(rows, 1)


def _match_layer(layer: str, index: dict[str, str]) -> str | None:
    """The file's layer a header entry names, with or without a prefix on either side."""
    parts = layer.split(".")
    for i in range(len(parts)):
        short = index.get(".".join(parts[i:]))
        if short is not None:
            return short
    return None


def _json(raw: bytes, where: str, what: str) -> dict:
    try:
        value = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Flux2Error(f"{what}: {where} is not valid JSON ({e}): the file is corrupt") from None
    if not isinstance(value, dict):
        raise Flux2Error(f"{what}: {where} is not a JSON object: the file is corrupt")
    return value


def _roundup(n: int, m: int) -> int:
    return -(-n // m) * m


def _itemsize(dtype) -> int:
    return dtype.itemsize if isinstance(dtype, torch.dtype) else 1  # bytes of a type torch lacks: 1 each
