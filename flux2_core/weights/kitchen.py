"""Quantised layers multiplied in their own format through comfy-kitchen, and the choice of when.

comfy-kitchen is the package of ComfyUI's quantisation kernels (``QuantizedTensor`` with one layout class per
format, dispatching ``F.linear`` to a backend: cuda, triton or eager). This module is the only place the core
imports it; it is optional (ComfyUI ships it, command-line users get it with the ``[gpu]`` extra), and a
missing one is a line in the log, never an error: every format but ``convrot_w4a4`` then dequantises.

What runs in format, and how (activations quantised exactly as ComfyUI 0.29 does, ``comfy/quant_ops.py``):

- ``float8_e4m3fn``: activations to fp8 with the file's ``input_scale``, else a fixed scale of 1 (values
  beyond +-448 clip, as native); ``torch._scaled_mm`` through the layout's linear. NVIDIA compute capability
  8.9 or newer (Ada, Hopper, Blackwell), as native's ``supports_fp8_compute``. Row-wise scales and widths
  that are not multiples of 16 dequantise. ``float8_e5m2`` always dequantises: there is no e5m2 x e5m2 fp8
  matmul (native tries one, fails and dequantises);
- ``nvfp4``: activations to nvfp4 per call (``input_scale`` as the per-tensor scale, else ``amax / (448 *
  6)``); ``scaled_mm_nvfp4``. Compute capability 10.0 or newer (Blackwell);
- ``mxfp8``: activations to mxfp8 per call; ``scaled_mm_mxfp8``. Compute capability 10.0 or newer and torch
  2.10 or newer;
- ``convrot_w4a4``: the layout's own linear (activations rotated and quantised to int4 inside it) on every
  device comfy-kitchen has a backend for, its eager one included: that is what the file is made for and what
  native runs; it cannot load without comfy-kitchen;
- ``int8_tensorwise`` (diffusion models): our own W8A8 matmul (``QuantWeight.linear``), the one native runs;
- ``asym_w4a8_int8``: the layout's int8 linear (activations rotated, quantised to int8 per token, int32
  accumulation; a file's asymmetric correction makes comfy-kitchen's eager and triton backends dequantise):
  on an NVIDIA GPU of compute capability 8.0 or newer;
- ``awq_w4a16``: the layout's GEMV/GEMM (activations stay 16-bit; the output in the scales' dtype) where a
  GPU backend has it (cuda, hip); its eager backend is a dequantisation and a dense matmul, so elsewhere it
  dequantises;
- nvfp4's ``pre_quant_scale`` multiplies the input before its quantisation.

On a CPU in bfloat16 or float16, ``int8_tensorwise`` and ``asym_w4a8_int8`` multiply in format only where
that measures faster than dequantise-then-matmul: ``QuantWeight`` times both on the first call of each shape
class and keeps the faster for the process (``quant_source``); in float32 they multiply in int8 as native.

``mode``: ``auto`` (the rules above), ``dequantize`` (everything dequantises before its matmul, today's
numerics bit for bit; convrot_w4a4 through comfy-kitchen's dequantisation) or ``format`` (in format wherever
torch and comfy-kitchen have a kernel for the device, its eager backend included: a CPU then reproduces the
numerics of an fp8 GPU; slow, for checking). nvfp4 and mxfp8 have no CPU kernel in torch ("CPU does not
support swizzle"), so they dequantise on a CPU in every mode.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version

import torch
import torch.nn.functional as F

from ..errors import Flux2Error

log = logging.getLogger(__name__)

MODES = ("auto", "dequantize", "format")
# format -> comfy-kitchen's layout class name (as ComfyUI registers them) and the op its matmul needs
LAYOUTS = {
    "float8_e4m3fn": "TensorCoreFP8Layout",
    "nvfp4": "TensorCoreNVFP4Layout",
    "mxfp8": "TensorCoreMXFP8Layout",
    "convrot_w4a4": "TensorCoreConvRotW4A4Layout",
    "asym_w4a8_int8": "AsymW4A8Int8Layout",
    "awq_w4a16": "TensorCoreAWQW4A16Layout",
}
OPS = {
    "float8_e4m3fn": "quantize_per_tensor_fp8",
    "nvfp4": "scaled_mm_nvfp4",
    "mxfp8": "scaled_mm_mxfp8",
    "convrot_w4a4": "convrot_w4a4_linear",
    "asym_w4a8_int8": "w4a8_int8_linear",
    "awq_w4a16": "gemv_awq_w4a16",
}
MATMUL = {
    "float8_e4m3fn": "fp8",
    "nvfp4": "nvfp4",
    "mxfp8": "mxfp8",
    "convrot_w4a4": "int4 (W4A4)",
    "asym_w4a8_int8": "int8 (W4A8)",
    "awq_w4a16": "int4 x 16-bit (AWQ)",
}
# NVIDIA compute capability
NEEDS = {
    "float8_e4m3fn": (8, 9),
    "nvfp4": (10, 0),
    "mxfp8": (10, 0),
    "asym_w4a8_int8": (8, 0),
    "awq_w4a16": (8, 0),
}
GPU_BACKENDS = {"awq_w4a16": ("cuda", "hip")}  # where a format's op is more than dequantise-then-matmul
KITCHEN_ONLY = ("convrot_w4a4",)  # formats only comfy-kitchen can read
INSTALL = "pip install -U comfy-kitchen (in ComfyUI's Python), or the [gpu] extra of this package"


@dataclass(frozen=True)
class Kitchen:
    """What the installed comfy-kitchen offers: its version, layout classes and a backend per op."""

    version: str
    layouts: frozenset[str]
    backends: Mapping[str, str]  # op -> the backend comfy-kitchen picks for it (priority, enabled, available)

    def backend(self, fmt: str) -> str | None:
        return self.backends.get(OPS.get(fmt, ""))


@lru_cache(maxsize=1)
def installed() -> Kitchen | None:
    """The installed comfy-kitchen, or ``None`` (logged once) when it is missing or cannot be imported."""
    try:
        import comfy_kitchen as ck
        import comfy_kitchen.tensor as layouts
    except Exception as e:  # an ImportError, or a broken install raising anything at import
        log.info(
            "comfy-kitchen is not available (%s): fp8, nvfp4 and mxfp8 layers dequantise before their matmul "
            "and convrot_w4a4 files cannot load; %s",
            e,
            INSTALL,
        )
        return None
    try:
        release = version("comfy-kitchen")
    except PackageNotFoundError:
        release = getattr(ck, "__version__", "unknown")
    backends = {}
    for op in OPS.values():
        try:
            backends[op] = ck.registry.get_capable_backend(op)
        except Exception:  # NoCapableBackendError: no enabled backend implements it
            continue
    names = frozenset(name for name in LAYOUTS.values() if hasattr(layouts, name))
    return Kitchen(release, names, backends)


def configure_for_command_line() -> None:
    """Apply ComfyUI's choice of backends in a process ComfyUI does not run (the command line): its
    CUDA backend needs torch built for CUDA 13 or newer, and its triton backend stays off."""
    if installed() is None:
        return
    import comfy_kitchen as ck

    cuda = torch.version.cuda
    if cuda is None or tuple(int(p) for p in cuda.split(".")[:2]) < (13, 0):
        ck.registry.disable("cuda")
    ck.registry.disable("triton")
    installed.cache_clear()


@dataclass(frozen=True)
class Device:
    """The compute device as the choice sees it: its type and, for an NVIDIA GPU, its compute capability."""

    type: str
    capability: tuple[int, int] | None = None  # NVIDIA CUDA only
    torch_version: tuple[int, int] = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])

    @property
    def label(self) -> str:
        return (
            f"compute capability {self.capability[0]}.{self.capability[1]}" if self.capability else self.type
        )


def describe(device: torch.device) -> Device:
    if device.type == "cuda" and torch.version.hip is None:
        return Device("cuda", tuple(torch.cuda.get_device_capability(device)))
    return Device(device.type)


@dataclass(frozen=True)
class Choice:
    """How the layers of one format multiply on one device."""

    path: str  # "kitchen" (in format through comfy-kitchen), "int8" (our W8A8) or "dequantize"
    how: str  # for the log line
    measured: bool = False  # a CPU in 16 bits: in format only for shapes where it measures faster

    @property
    def in_format(self) -> bool:
        return self.path != "dequantize"


def choose(fmt: str, device: Device, mode: str, kitchen: Kitchen | None, int8_matmul: bool) -> Choice:
    """The rule of the module docstring for one format on one device."""
    cpu_measures = mode == "auto" and device.type == "cpu"
    if fmt == "int8_tensorwise":
        if int8_matmul and mode != "dequantize":
            if cpu_measures:
                return Choice("int8", f"int8 matmul (torch._int_mm){MEASURED}", measured=True)
            return Choice("int8", "int8 matmul (torch._int_mm)")
        why = "--quant-compute dequantize" if int8_matmul else "encoders dequantise int8, as ComfyUI does"
        return Choice("dequantize", f"dequantised ({why})")
    if fmt not in LAYOUTS:
        reason = "no e5m2 x e5m2 fp8 matmul" if fmt == "float8_e5m2" else "no in-format matmul for it"
        return Choice("dequantize", f"dequantised ({reason})")
    if mode == "dequantize":
        return Choice("dequantize", "dequantised (--quant-compute dequantize)")
    if kitchen is None:
        return Choice("dequantize", "dequantised (comfy-kitchen is not installed)")
    if LAYOUTS[fmt] not in kitchen.layouts:
        return Choice("dequantize", f"dequantised (comfy-kitchen {kitchen.version} has no {LAYOUTS[fmt]})")
    backend = kitchen.backend(fmt)
    if backend is None:
        return Choice("dequantize", f"dequantised (no comfy-kitchen backend has {OPS[fmt]})")
    block_scaled = fmt in ("nvfp4", "mxfp8")
    if block_scaled and device.type != "cuda":
        return Choice("dequantize", f"dequantised (torch has no {MATMUL[fmt]} matmul on {device.type})")
    if fmt == "mxfp8" and device.torch_version < (2, 10):
        return Choice("dequantize", "dequantised (mxfp8 matmul needs torch 2.10 or newer)")
    if fmt == "awq_w4a16" and mode == "auto" and backend not in GPU_BACKENDS[fmt]:
        return Choice("dequantize", f"dequantised (comfy-kitchen's {backend} AWQ is dequantise-then-matmul)")
    if fmt == "asym_w4a8_int8" and cpu_measures:
        return Choice("kitchen", f"{MATMUL[fmt]} matmul via comfy-kitchen {backend}{MEASURED}", measured=True)
    needs = NEEDS.get(fmt)
    if mode == "auto" and needs is not None and (device.capability or (0, 0)) < needs:
        gpu = f"this device has {device.label}" if device.capability else f"not on {device.type}"
        return Choice(
            "dequantize",
            f"dequantised (no capable backend: {MATMUL[fmt]} matmul needs an NVIDIA GPU of compute "
            f"capability {needs[0]}.{needs[1]} or newer, {gpu})",
        )
    return Choice("kitchen", f"{MATMUL[fmt]} matmul via comfy-kitchen {backend}")


MEASURED = " where it measures faster than dequantised (bfloat16 / float16, per shape class)"


class QuantCompute:
    """The compute choice shared by the quantised layers of one model: made on the first call on each device,
    for every format the model holds, and logged there in one line."""

    def __init__(
        self,
        what: str,
        formats: Iterable[str],
        mode: str = "auto",
        int8_matmul: bool = False,
        kitchen: Callable[[], Kitchen | None] = installed,
        device_info: Callable[[torch.device], Device] = describe,
    ):
        self.what, self.formats = what, sorted(set(formats))
        self.mode = check_mode(mode)
        self.int8_matmul = int8_matmul
        self._kitchen, self._device_info = kitchen, device_info
        self._choices: dict[torch.device, dict[str, Choice]] = {}

    def choice(self, fmt: str, device: torch.device) -> Choice:
        choices = self._choices.get(device)
        if choices is None:
            info, kitchen = self._device_info(device), self._kitchen()
            choices = {f: choose(f, info, self.mode, kitchen, self.int8_matmul) for f in self.formats}
            self._choices[device] = choices
            parts = "; ".join(f"{_label(f)} layers: {c.how}" for f, c in choices.items())
            log.info("%s on %s: %s", self.what, device, parts)
        found = choices.get(fmt)
        if found is None:  # a format the model did not declare (a layer swapped in later)
            found = choices[fmt] = choose(
                fmt, self._device_info(device), self.mode, self._kitchen(), self.int8_matmul
            )
        return found


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise Flux2Error(f"quant_compute {mode!r} is not one of {', '.join(MODES)}: pick one of them")
    return mode


def _label(fmt: str) -> str:
    return {"float8_e4m3fn": "fp8", "float8_e5m2": "fp8 e5m2", "int8_tensorwise": "int8"}.get(fmt, fmt)


def fits(fmt: str, out_features: int, in_features: int, scale: torch.Tensor | None) -> bool:
    """Whether one layer of a format computed in format can: fp8 needs a per-tensor scale and widths in
    multiples of 16 (``torch._scaled_mm``); the block-scaled layouts pad their own."""
    if fmt == "float8_e4m3fn":
        return (scale is None or scale.numel() == 1) and out_features % 16 == 0 and in_features % 16 == 0
    return True


# ---- the operands, built from the stored tensors on the compute device (never copied or re-quantised) ----


def weight_operand(layer, stored: Mapping[str, torch.Tensor], shape: tuple[int, int], dtype: torch.dtype):
    """The stored weight of a layer as comfy-kitchen's ``QuantizedTensor`` of logical ``shape`` [out, in]
    (the bytes as stored; padded rows and columns stay in the storage, as ComfyUI holds them)."""
    from comfy_kitchen.tensor import QuantizedTensor, get_layout_class

    fmt, w = layer.format, stored["weight"]
    name = LAYOUTS[fmt]
    params = get_layout_class(name).Params
    scale = stored.get("weight_scale")
    if fmt == "float8_e4m3fn":
        w = w.view(torch.float8_e4m3fn) if w.dtype == torch.uint8 else w
        scale = _ones(w.device) if scale is None else scale.float().reshape(())
        p = params(scale=scale, orig_dtype=dtype, orig_shape=shape)
    elif fmt == "nvfp4":
        p = params(
            scale=stored["weight_scale_2"].float().reshape(()),
            block_scale=scale.view(torch.float8_e4m3fn),
            orig_dtype=dtype,
            orig_shape=shape,
        )
    elif fmt == "mxfp8":
        p = params(scale=scale.view(torch.float8_e8m0fnu), orig_dtype=dtype, orig_shape=shape)
    elif fmt == "asym_w4a8_int8":  # as ComfyUI builds it, plus the correction its loader leaves unread
        s_rel = stored["weight_s_rel"]
        p = params(
            scale=s_rel.view(torch.float8_e4m3fn) if s_rel.dtype == torch.uint8 else s_rel,
            s_channel=stored["weight_s_channel"],
            correction=stored.get("weight_correction"),
            codebook=stored.get("weight_codebook"),
            group_size=layer.group,
            convrot_groupsize=layer.convrot,
            orig_dtype=dtype,
            orig_shape=shape,
        )
        w = w.view(torch.int8)
    elif fmt == "awq_w4a16":
        p = params(
            scale=scale,
            zeros=stored["weight_zeros"],
            group_size=layer.group,
            orig_dtype=dtype,
            orig_shape=shape,
        )
        w = w.view(torch.int8)
    else:  # convrot_w4a4, as ComfyUI 0.29 builds it (comfy/ops.py, quant_group_size 64)
        p = params(
            scale=scale.float().reshape(-1),
            convrot_groupsize=layer.convrot,
            quant_group_size=64,
            linear_dtype=layer.linear_dtype or "int4",
            orig_dtype=dtype,
            orig_shape=shape,
        )
    return QuantizedTensor(w, name, p)


def activation_operand(fmt: str, x: torch.Tensor, input_scale: torch.Tensor | None):
    """``x`` [M, K] as ComfyUI quantises a layer's input for ``fmt`` (``QuantizedTensor.from_float`` with its
    layouts' ``quantize``); convrot_w4a4, W4A8 and AWQ take it in float (W4A8 quantises it inside)."""
    if fmt in ("convrot_w4a4", "asym_w4a8_int8", "awq_w4a16"):
        return x
    import comfy_kitchen as ck
    from comfy_kitchen.tensor import QuantizedTensor, get_layout_class

    name = LAYOUTS[fmt]
    layout = get_layout_class(name)
    shape = tuple(x.shape)
    scale = None if input_scale is None else input_scale.to(x.device, torch.float32).reshape(())
    if fmt == "float8_e4m3fn":
        scale = _ones(x.device) if scale is None else scale
        q = ck.quantize_per_tensor_fp8(x, scale, torch.float8_e4m3fn)
        return QuantizedTensor(q, name, layout.Params(scale=scale, orig_dtype=x.dtype, orig_shape=shape))
    padded = layout.get_padded_shape(shape) != shape
    if fmt == "nvfp4":
        if scale is None:
            scale = (x.abs().amax() / (ck.float_utils.F8_E4M3_MAX * ck.float_utils.F4_E2M1_MAX)).float()
        q, blocks = ck.quantize_nvfp4(x, scale, pad_16x=padded)
        params = layout.Params(scale=scale, block_scale=blocks, orig_dtype=x.dtype, orig_shape=shape)
        return QuantizedTensor(q, name, params)
    q, blocks = ck.quantize_mxfp8(x, pad_32x=padded)
    return QuantizedTensor(q, name, layout.Params(scale=blocks, orig_dtype=x.dtype, orig_shape=shape))


def linear(layer, stored: Mapping[str, torch.Tensor], x: torch.Tensor, out_features: int) -> torch.Tensor:
    """``x W^T`` with ``W`` in its stored format, through comfy-kitchen's layout (no bias); nvfp4's
    ``pre_quant_scale`` multiplies ``x`` first."""
    in_features = x.shape[-1]
    x2 = x.reshape(-1, in_features)
    smoothing = stored.get("pre_quant_scale")
    if smoothing is not None:
        x2 = x2 * smoothing.to(x2.device, x2.dtype)
    w = weight_operand(layer, stored, (out_features, in_features), x.dtype)
    y = F.linear(activation_operand(layer.format, x2, stored.get("input_scale")), w)
    return y.reshape(*x.shape[:-1], out_features).to(x.dtype)


def dequantize(layer, stored: Mapping[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
    """The weight of a format only comfy-kitchen reads, by its layout's dequantisation (logical shape)."""
    return weight_operand(layer, stored, tuple(layer.shape), dtype).dequantize().to(dtype)


_ONES: dict[torch.device, torch.Tensor] = {}


def _ones(device: torch.device) -> torch.Tensor:
    """A float32 scalar 1 per device, made once (a fresh one per call would copy from the host each time)."""
    one = _ONES.get(device)
    if one is None:
        one = _ONES[device] = torch.ones((), dtype=torch.float32, device=device)
    return one
