"""The weight source of a layer that stays quantised: its stored tensors, multiplied in their format or
dequantised per call.

``quantize_layer`` gives a meta-built ``Linear`` the stored tensors of a ``QuantLayer`` (weight, scales, the
activation scale) and a ``QuantWeight`` source. The source's ``linear`` multiplies in the stored format where
the model's ``kitchen.QuantCompute`` chose so for the device (comfy-kitchen's layouts; int8 W8A8 with
``torch._int_mm``); otherwise ``weight`` dequantises on the compute device (``quant.dequantize``) for a plain
matmul. Nothing is ever written back: memory stays the file's size, and patches (LoRA) go beside the matmul
or onto a float copy (``ops.Linear``).

Where the choice is ``measured`` (int8 and W4A8 on a CPU in bfloat16 or float16, ``auto``), the first call of
each shape class (device, dtype, format, widths, rows rounded up to a power of two) runs both the in-format
matmul and dequantise-then-matmul, twice each, alternating; the faster by its best time serves that class for
the rest of the process, logged once. int8 matmuls outrun 16-bit ones on some CPUs (VNNI, AMX) and not on
others, and the decoding a W4A8 weight needs per call weighs less the more rows share it.
"""

from __future__ import annotations

import logging
import time

import torch
import torch.nn.functional as F

from ..errors import Flux2Error
from ..ops import linears
from . import kitchen
from .quant import STORED_ROLES, QuantLayer, dequantize, hadamard

log = logging.getLogger(__name__)

MEASURED_DTYPES = (torch.bfloat16, torch.float16)
_FASTER: dict[tuple, bool] = {}  # shape class -> whether in format measured faster, for the process


def int_mm_takes(x: torch.Tensor, out_features: int) -> bool:
    """Whether ``torch._int_mm`` takes ``x`` [M, K] times a [K, out_features] int8 weight on ``x``'s device:
    CUDA's kernel needs more than 16 rows and both widths in multiples of 8 (the CPU's takes any shape)."""
    if x.device.type != "cuda":
        return True
    return x.shape[0] > 16 and x.shape[1] % 8 == 0 and out_features % 8 == 0


class QuantWeight:
    """The weight source of a quantised linear layer: its stored tensors, never written back (LoRA patches
    land on a float copy or beside the matmul, and memory stays near the file's size).

    ``linear`` multiplies in the stored format where the model's ``QuantCompute`` chose so for the device
    (comfy-kitchen's layouts, or int8 W8A8); ``weight`` dequantises on the compute device for a plain matmul.
    """

    def __init__(self, layer: QuantLayer, compute: kitchen.QuantCompute | None = None):
        self.layer = layer
        self.compute = compute

    def __repr__(self) -> str:
        return f"QuantWeight({self.layer.label})"

    def _stored(self, layer, device: torch.device) -> dict[str, torch.Tensor]:
        stored = {"weight": layer.weight}
        for role in STORED_ROLES[1:]:
            if role in layer._buffers:
                stored[role] = layer._buffers[role]
        return {role: t.to(device, non_blocking=True) for role, t in stored.items()}

    def linear(self, layer, x: torch.Tensor) -> torch.Tensor | None:
        """The layer's output computed in its stored format, or ``None`` (dequantise-then-matmul instead)."""
        if self.compute is None or x.numel() == 0:  # no rows: comfy-kitchen's int8 linear cannot take them
            return None
        choice = self.compute.choice(self.layer.format, x.device)
        if choice.path not in ("int8", "kitchen"):
            return None
        scale = layer._buffers.get("weight_scale")
        if choice.path == "kitchen" and not kitchen.fits(
            self.layer.format, layer.out_features, layer.in_features, scale
        ):
            return None
        if not choice.measured or x.dtype not in MEASURED_DTYPES:
            return self._in_format(layer, x, choice.path)
        key = shape_class(self.layer.label, x, layer.out_features)
        faster = _FASTER.get(key)
        if faster is None:
            faster, y = self._measure(layer, x, choice.path, key)
            _FASTER[key] = faster
            return y
        return self._in_format(layer, x, choice.path) if faster else None

    def _in_format(self, layer, x: torch.Tensor, path: str) -> torch.Tensor | None:
        if path == "int8":
            return self._int8(layer, x)
        return kitchen.linear(self.layer, self._stored(layer, x.device), x, layer.out_features)

    def _measure(self, layer, x: torch.Tensor, path: str, key: tuple) -> tuple[bool, torch.Tensor | None]:
        """Both paths twice, alternating: (whether in format is faster, its output or ``None``)."""
        best, out = {}, None
        for name in ("format", "dequantized", "format", "dequantized"):
            start = time.perf_counter()
            if name == "format":
                out = self._in_format(layer, x, path)
                if out is None:  # this shape has no in-format matmul here
                    return False, None
            else:
                F.linear(x, self.weight(layer, x.dtype, x.device))
            best[name] = min(best.get(name, float("inf")), time.perf_counter() - start)
        faster = best["format"] < best["dequantized"]
        log.info(
            "%s layers, %s: %s (best of 2: in format %.1f ms, dequantised %.1f ms)",
            self.layer.label, key[3:], "in format" if faster else "dequantised",
            best["format"] * 1e3, best["dequantized"] * 1e3,
        )  # fmt: skip
        return faster, out if faster else None

    def _int8(self, layer, x: torch.Tensor) -> torch.Tensor | None:
        """The dynamic W8A8 matmul ComfyUI runs for int8 layers of a diffusion model: activations quantised
        per row, int32 accumulation, both scales applied after."""
        q, scale = layer.weight.to(x.device), layer._buffers["weight_scale"].to(x.device)
        i, g = layer.in_features, self.layer.convrot
        if g:
            x = (x.reshape(-1, i // g, g) @ hadamard(g, x.device).to(x.dtype)).reshape(x.shape)
        x2 = x.reshape(-1, i)
        if not int_mm_takes(x2, q.shape[0]):
            return None  # dequantise-then-matmul instead
        # the floor stays a normal number of x's dtype (1e-30 is 0 in float16: an all-zero row gave 0 / 0)
        sx = (x2.abs().amax(-1, keepdim=True).float() / 127).clamp(min=max(1e-30, torch.finfo(x2.dtype).tiny))
        xq = (x2 / sx.to(x2.dtype)).round().clamp(-128, 127).to(torch.int8)
        acc = torch._int_mm(xq, q.t())
        y = (acc.float() * (sx * scale.float().reshape(1, -1))).to(x.dtype)
        return y.reshape(*x.shape[:-1], q.shape[0])[..., : layer.out_features]

    def weight(self, layer, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        w = dequantize(self.layer, self._stored(layer, device), dtype)
        return w[: layer.out_features, : layer.in_features]


def working_bytes(module, rows: int, dtype: torch.dtype) -> int:
    """The most one int8 or W4A8 layer of ``module`` holds beyond its input and output in one call of ``rows``
    tokens, by either path (which one runs may be measured only then): in format, the rotated and int8 input
    (K bytes plus K of ``dtype`` per row), the int32 products and their float32 scaling (8 N per row), and a
    W4A8 weight decoded to its int8 grid (int32 codes, float32 levels, the grid and its transposed copy:
    10 N K); dequantised, the weight in float32 and in ``dtype`` (W4A8: its codes and levels, 8 N K more)."""
    most = 0
    for _, layer in linears(module):
        source = getattr(layer.source, "inner", layer.source)  # a streamed layer's own source
        fmt = getattr(getattr(source, "layer", None), "format", None)
        if fmt not in ("int8_tensorwise", "asym_w4a8_int8"):
            continue
        n, k, size = layer.out_features, layer.in_features, dtype.itemsize
        w4 = fmt == "asym_w4a8_int8"
        in_format = rows * k * (size + 1) + rows * n * 8 + (10 * n * k if w4 else 0)
        dequantized = n * k * (4 + size) + (8 * n * k if w4 else 0)
        most = max(most, in_format, dequantized)
    return most


def shape_class(label: str, x: torch.Tensor, out_features: int) -> tuple:
    """What a measured choice stands for: device, dtype, format, widths, rows up to a power of two."""
    rows = x.numel() // x.shape[-1]
    return (x.device.type, x.dtype, label, out_features, x.shape[-1], 1 << max(rows - 1, 0).bit_length())


def measured() -> dict[tuple, bool]:
    """The measured choices made so far in this process (shape class -> whether in format)."""
    return dict(_FASTER)


def quantize_layer(layer, q: QuantLayer, what: str, compute: kitchen.QuantCompute | None = None) -> None:
    """Make a (meta-built) linear ``layer`` hold ``q``'s stored tensors; ``compute`` (shared by the model's
    quantised layers) says per device whether they multiply in format or dequantise per call."""
    rows, cols = q.shape[:2]
    padded = (
        q.format in ("nvfp4", "mxfp8")
        and 0 <= rows - layer.out_features < 32
        and 0 <= cols - layer.in_features < 32
    )
    if (rows, cols) != (layer.out_features, layer.in_features) and not padded:
        raise Flux2Error(
            f"{what}: {q.keys['weight']} holds a [{rows}, {cols}] weight where the model has "
            f"[{layer.out_features}, {layer.in_features}]; the file is not a consistent checkpoint"
        )
    for role, (shape, dtype) in q.stored.items():
        dtype = dtype if isinstance(dtype, torch.dtype) else torch.uint8  # bytes of a type torch lacks
        tensor = torch.empty(shape, dtype=dtype, device="meta")
        if role == "weight":
            layer.weight = torch.nn.Parameter(tensor, requires_grad=False)
        else:
            layer.register_buffer(role, tensor)
    layer.source = QuantWeight(q, compute)
