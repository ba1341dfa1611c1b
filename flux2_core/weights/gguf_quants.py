"""Turn GGML-quantised tensor bytes from a .gguf file into ordinary torch tensors.

``dequantize(raw, qtype, shape)`` takes the stored bytes of one tensor (a uint8 tensor, on the CPU or a GPU)
and returns the weight in its logical torch shape. The common GGUF types (F32, F16, BF16, Q8_0, Q4_0, Q4_1,
Q5_0, Q5_1 and the K-quants Q2_K to Q6_K) are decoded with plain torch ops on the tensor's own device, so a
quantised weight can stay packed in GPU memory and be expanded just before it is used. The values are
identical, bit for bit in float32, to the reference decoder of the ``gguf`` package. Rarer types (the IQ
and ternary families, MXFP4, ...) are decoded by the ``gguf`` package on the CPU and moved back.

``GGMLType``, ``type_name``, ``block_size`` and ``has_torch_kernel`` describe a type id without needing the
``gguf`` package.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch

from ..errors import Flux2Error

F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1 = 0, 1, 2, 3, 6, 7, 8, 9
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K = 10, 11, 12, 13, 14, 15
IQ2_XXS, IQ2_XS, IQ3_XXS, IQ1_S, IQ4_NL, IQ3_S, IQ2_S, IQ4_XS = 16, 17, 18, 19, 20, 21, 22, 23
I8, I16, I32, I64, F64, IQ1_M, BF16 = 24, 25, 26, 27, 28, 29, 30
TQ1_0, TQ2_0, MXFP4, NVFP4, Q1_0 = 34, 35, 39, 40, 41

QK_K = 256

# GGML type id -> (name, elements per block, bytes per block)
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    F32: ("F32", 1, 4),
    F16: ("F16", 1, 2),
    Q4_0: ("Q4_0", 32, 18),
    Q4_1: ("Q4_1", 32, 20),
    Q5_0: ("Q5_0", 32, 22),
    Q5_1: ("Q5_1", 32, 24),
    Q8_0: ("Q8_0", 32, 34),
    Q8_1: ("Q8_1", 32, 40),
    Q2_K: ("Q2_K", QK_K, 84),
    Q3_K: ("Q3_K", QK_K, 110),
    Q4_K: ("Q4_K", QK_K, 144),
    Q5_K: ("Q5_K", QK_K, 176),
    Q6_K: ("Q6_K", QK_K, 210),
    Q8_K: ("Q8_K", QK_K, 292),
    IQ2_XXS: ("IQ2_XXS", QK_K, 66),
    IQ2_XS: ("IQ2_XS", QK_K, 74),
    IQ3_XXS: ("IQ3_XXS", QK_K, 98),
    IQ1_S: ("IQ1_S", QK_K, 50),
    IQ4_NL: ("IQ4_NL", 32, 18),
    IQ3_S: ("IQ3_S", QK_K, 110),
    IQ2_S: ("IQ2_S", QK_K, 82),
    IQ4_XS: ("IQ4_XS", QK_K, 136),
    I8: ("I8", 1, 1),
    I16: ("I16", 1, 2),
    I32: ("I32", 1, 4),
    I64: ("I64", 1, 8),
    F64: ("F64", 1, 8),
    IQ1_M: ("IQ1_M", QK_K, 56),
    BF16: ("BF16", 1, 2),
    TQ1_0: ("TQ1_0", QK_K, 54),
    TQ2_0: ("TQ2_0", QK_K, 66),
    MXFP4: ("MXFP4", 32, 17),
    NVFP4: ("NVFP4", 64, 36),
    Q1_0: ("Q1_0", 128, 18),
}

# Types stored as plain little-endian numbers, with the torch dtype they read as.
PLAIN_TYPES: dict[int, torch.dtype] = {
    F32: torch.float32,
    F16: torch.float16,
    BF16: torch.bfloat16,
    F64: torch.float64,
    I8: torch.int8,
    I16: torch.int16,
    I32: torch.int32,
    I64: torch.int64,
}


@dataclass(frozen=True)
class GGMLType:
    """A block-quantised GGML storage type, e.g. ``GGMLType("Q4_K", 12)``."""

    name: str
    id: int

    def __str__(self) -> str:
        return self.name


def _info(qtype: int) -> tuple[str, int, int]:
    info = GGML_TYPES.get(int(qtype))
    if info is None:
        raise Flux2Error(
            f"GGML tensor type {int(qtype)} is unknown to this loader; the file is corrupt or was written "
            "by a newer tool; use a GGUF with standard types (Q8_0, Q6_K, Q5_K_M, Q4_K_M, ...)"
        )
    return info


def type_name(qtype: int) -> str:
    """The GGML name of a type id (``"Q4_K"``); raises Flux2Error for an unknown id."""
    return _info(qtype)[0]


def block_size(qtype: int) -> tuple[int, int]:
    """(elements, bytes) of one block of this type; plain types have blocks of one element."""
    _, elems, nbytes = _info(qtype)
    return elems, nbytes


def ggml_type(qtype: int) -> GGMLType:
    """The ``GGMLType`` record of a type id."""
    return GGMLType(type_name(qtype), int(qtype))


def has_torch_kernel(qtype: int) -> bool:
    """True when ``dequantize`` decodes this type with torch ops on the tensor's own device."""
    return int(qtype) in PLAIN_TYPES or int(qtype) in _KERNELS


# ---- helpers on [n_blocks, bytes] uint8 tensors --------------------------------------------------------


def _f16(b: torch.Tensor) -> torch.Tensor:
    """Little-endian fp16 fields [n, 2] -> float32 [n, 1]."""
    return b.contiguous().view(torch.float16).float()


def _bits(b: torch.Tensor, width: int, group: int) -> torch.Tensor:
    """Split bytes [n, k] into ``width``-bit fields: for each run of ``group`` bytes, the lowest field of
    every byte, then the next, and so on (width 4 gives the low nibbles, then the high ones)."""
    n = b.shape[0]
    per_byte = 8 // width
    sh = torch.arange(0, 8, width, dtype=torch.uint8, device=b.device).reshape(1, 1, per_byte, 1)
    q = b.reshape(n, -1, 1, group) >> sh
    return (q & ((1 << width) - 1)).reshape(n, -1)


def _nibbles(b: torch.Tensor, group: int) -> torch.Tensor:
    return _bits(b, 4, group)


def _high_bits32(qh: torch.Tensor) -> torch.Tensor:
    """A little-endian uint32 [n, 4 bytes] -> its 32 bits [n, 32], bit j at column j."""
    n = qh.shape[0]
    sh = torch.arange(8, dtype=torch.uint8, device=qh.device).reshape(1, 1, 8)
    return ((qh.reshape(n, 4, 1) >> sh) & 1).reshape(n, 32)


# ---- per-type decoders: uint8 [n_blocks, block_bytes] -> float32 [n_blocks, block_elems] --------------


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _f16(b[:, :2])


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 2:], 16).to(torch.int8) - 8
    return _f16(b[:, :2]) * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 4:], 16).float()
    return _f16(b[:, :2]) * q + _f16(b[:, 2:4])


def _q5(b: torch.Tensor, qh_at: int) -> torch.Tensor:
    high = _high_bits32(b[:, qh_at : qh_at + 4])
    return _nibbles(b[:, qh_at + 4 :], 16) | (high << 4)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    q = _q5(b, 2).to(torch.int8) - 16
    return _f16(b[:, :2]) * q.float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b[:, :2]) * _q5(b, 4).float() + _f16(b[:, 2:4])


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales, qs = b[:, :16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    dl = (d * (scales & 0x0F).float()).reshape(n, 16, 1)
    ml = (dmin * (scales >> 4).float()).reshape(n, 16, 1)
    q = _bits(qs, 2, 32).reshape(n, 16, 16).float()
    return (dl * q - ml).reshape(n, QK_K)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    hmask, qs, packed = b[:, :32], b[:, 32:96], b[:, 96:108]
    d = _f16(b[:, 108:110])
    # 16 6-bit scales: low 4 bits from bytes 0-7 (low nibbles, then high), top 2 bits from bytes 8-11
    low = _nibbles(packed[:, :8], 8)
    high = _bits(packed[:, 8:], 2, 4)
    scales = ((low | (high << 4)).to(torch.int8) - 32).float()
    dl = (d * scales).reshape(n, 16, 1)
    ql = _bits(qs, 2, 32).reshape(n, 16, 16).to(torch.int8)
    # a set hmask bit means "no offset"; a clear one subtracts 4
    qh = (_bits(hmask, 1, 32).reshape(n, 16, 16) ^ 1) << 2
    q = (ql - qh.to(torch.int8)).float()
    return (dl * q).reshape(n, QK_K)


def _k_scale_min(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 12-byte block of eight 6-bit (scale, min) pairs of Q4_K / Q5_K -> two uint8 [n, 8]."""
    a, m, lo = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    sc = torch.cat([a & 0x3F, (lo & 0x0F) | ((a >> 2) & 0x30)], dim=1)
    mn = torch.cat([m & 0x3F, (lo >> 4) | ((m >> 2) & 0x30)], dim=1)
    return sc, mn


def _k_affine(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    sc, mn = _k_scale_min(b[:, 4:16])
    d = (_f16(b[:, 0:2]) * sc.float()).reshape(n, 8, 1)
    dm = (_f16(b[:, 2:4]) * mn.float()).reshape(n, 8, 1)
    return (d * q.reshape(n, 8, 32).float() - dm).reshape(n, QK_K)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    return _k_affine(b, _nibbles(b[:, 16:], 32))


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    high = _bits(b[:, 16:48], 1, 32)
    return _k_affine(b, _nibbles(b[:, 48:], 32) | (high << 4))


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    ql, qh, scales = b[:, :128], b[:, 128:192], b[:, 192:208]
    d = (_f16(b[:, 208:210]) * scales.contiguous().view(torch.int8).float()).reshape(n, 16, 1)
    q = (_bits(ql, 4, 64) | (_bits(qh, 2, 32) << 4)).to(torch.int8) - 32
    return (d * q.reshape(n, 16, 16).float()).reshape(n, QK_K)


_KERNELS = {
    Q8_0: _q8_0,
    Q4_0: _q4_0,
    Q4_1: _q4_1,
    Q5_0: _q5_0,
    Q5_1: _q5_1,
    Q2_K: _q2_k,
    Q3_K: _q3_k,
    Q4_K: _q4_k,
    Q5_K: _q5_k,
    Q6_K: _q6_k,
}


def _plain(flat: torch.Tensor, qtype: int) -> torch.Tensor:
    if qtype == BF16:
        # bf16 is the top half of a float32: shift the bits up, keeping NaN payloads as they are
        bits = flat.view(torch.int16).to(torch.int32) << 16
        return bits.view(torch.float32)
    return flat.view(PLAIN_TYPES[qtype]).to(torch.float32)


def _gguf_fallback(flat: torch.Tensor, qtype: int, shape: tuple[int, ...]) -> torch.Tensor:
    name = type_name(qtype)
    try:
        # only the types without a dequantiser here need the gguf package's
        import gguf.quants
        from gguf import GGMLQuantizationType
    except ImportError as e:
        raise Flux2Error(f"GGUF tensors of type {name} need the gguf package: pip install gguf") from e
    elems, nbytes = block_size(qtype)
    row = shape[-1] if shape else 1
    data = flat.detach().cpu().numpy().reshape(-1, row // elems * nbytes)
    try:
        out = gguf.quants.dequantize(data, GGMLQuantizationType(qtype))
    except (NotImplementedError, ValueError) as e:
        raise Flux2Error(
            f"GGUF tensors of type {name} cannot be decoded; use a file with another type"
        ) from e
    return torch.from_numpy(out.reshape(shape)).to(flat.device)


def dequantize(
    raw: torch.Tensor, qtype: int, shape: tuple[int, ...], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Decode the stored bytes of one GGUF tensor into a tensor of the logical torch ``shape`` and ``dtype``.

    ``raw`` holds the bytes in row order, in any layout (``[rows, bytes_per_row]`` as the ``gguf`` reader
    gives them, or flat); a tensor of another dtype is taken as its bytes. Values are computed in float32
    on ``raw``'s device, then cast to ``dtype``.
    """
    qtype = int(qtype)
    name, elems, nbytes = _info(qtype)
    shape = tuple(int(s) for s in shape)
    if raw.dtype != torch.uint8:
        raw = raw.contiguous().reshape(-1).view(torch.uint8)
    flat = raw.contiguous().reshape(-1)
    n = prod(shape)
    if n % elems or (shape and shape[-1] % elems):
        raise Flux2Error(
            f"a GGUF tensor of shape {list(shape)} cannot be stored as {name} (rows must be whole blocks of "
            f"{elems} values): the file is corrupt, download it again"
        )
    expected = n // elems * nbytes
    if flat.numel() != expected:
        raise Flux2Error(
            f"a {name} GGUF tensor of shape {list(shape)} needs {expected} bytes but {flat.numel()} "
            "were found: the file is corrupt, download it again"
        )
    if qtype in PLAIN_TYPES:
        out = _plain(flat, qtype)
    elif qtype in _KERNELS:
        out = _KERNELS[qtype](flat.reshape(-1, nbytes))
    else:
        return _gguf_fallback(flat, qtype, shape).to(dtype)
    return out.reshape(shape).to(dtype)
