"""The 4-bit weight layouts ComfyUI reads since 0.29, ``asym_w4a8_int8`` (W4A8 / W6A8) and ``awq_w4a16``
(AWQ), and nvfp4's ``pre_quant_scale``: their checks from the header and their dequantisation in torch.

``asym_w4a8_int8`` (weight [N, K]; ``group_size`` g, default 16; ``convrot_groupsize`` R, default 256):

- ``weight`` int8 [N, K/2] at 4 bits, [N, 3K/4] at 6 (the width tells): column 2j in the low nibble of byte j,
  2j+1 in the high one; at 6 bits a second plane of K/4 bytes holds column c's top two bits in byte c//4 at
  bit 2(c%4);
- ``weight_s_rel`` [N, K/g] (float8_e4m3fn, its bytes as uint8, or float32), ``weight_s_channel`` float32 [N],
  optional ``weight_codebook`` float32 [16] (4 bits only), optional ``weight_correction`` [K/g, N] (the
  asymmetric variant: 4 bits, no codebook);
- level ``v = codebook[c]``, else ``c - 2^(bits-1)``; int8 grid ``q8 = clamp(round(v * s_rel), -127, 127)``;
  ``Wrot = q8 * s_channel (+ correction[k//g, n])`` in float32, then in the compute dtype ConvRot undone per
  block of R columns: ``W = Wrot H_R^T``. ComfyUI's loader never reads ``weight_correction`` (it computes an
  asymmetric file as if it were symmetric); it is applied here, on every path.

``awq_w4a16`` (group size G, default 64): ``weight`` int8 [N, K/2] of unsigned nibbles (column 2j low),
``weight_scale`` and ``weight_zeros`` [K/G, N] (transposed against the weight), and
``W = (q - 8) * weight_scale[k//G, n] + weight_zeros[k//G, n]`` (the zeros are added, not an integer point).

nvfp4's ``pre_quant_scale`` [K] (ModelOpt's AWQ smoothing) multiplies the layer's input: ``y = (x * s) Wq^T``,
the same as the weight ``W = Wq * s[k]`` used here whenever the weight is dequantised (a LoRA then adds to the
true weight); in format, the input is scaled before its quantisation.

Every formula is comfy-kitchen's (``AsymW4A8Int8Layout``, ``TensorCoreAWQW4A16Layout``), in its order of
operations, so the weights equal its layouts' ``dequantize`` bit for bit (checked in tests/weights).
"""

from __future__ import annotations

import math

import torch

W4A8, AWQ = "asym_w4a8_int8", "awq_w4a16"
# role -> file suffix after the layer name (what each layout stores beside its packed weight)
ROLES = {
    W4A8: ("weight_s_rel", "weight_s_channel", "weight_codebook", "weight_correction"),
    AWQ: ("weight_scale", "weight_zeros"),
}
EXTRA_ROLES = ("weight_s_rel", "weight_s_channel", "weight_codebook", "weight_correction", "weight_zeros")
REFUSED = {
    "svdquant_w4a4": "SVDQuant W4A4 (Nunchaku), which has no file layout in ComfyUI",
    "svdquant": "SVDQuant W4A4 (Nunchaku), which has no file layout in ComfyUI",
}
SVDQUANT_KEYS = (".proj_down", ".proj_up", ".smooth_factor")  # a Nunchaku SVDQuant layer's low-rank branch


def check_layer(fmt: str, params: dict, stored: dict, bad) -> tuple[tuple[int, int], int, int]:
    """(logical [N, K], group size, ConvRot size) of a W4A8 or AWQ layer from its stored shapes and dtypes;
    ``bad(problem)`` makes the error naming the layer."""
    (rows, cols), dtype = stored["weight"]
    if dtype not in (torch.int8, torch.uint8):
        raise bad(f"stores its weight as {dtype} (expected int8)")
    for role in ROLES[fmt][:2]:
        if role not in stored:
            raise bad(f"lacks its {role}")
    if fmt == AWQ:
        group, k = int(params.get("group_size") or 64), cols * 2
        for role in ROLES[AWQ]:
            shape, role_dtype = stored[role]
            if k % group or tuple(shape) != (k // group, rows) or not _is_float(role_dtype):
                expected = [k // group, rows]
                raise bad(f"has a {role} of {role_dtype} {list(shape)} (expected floats {expected})")
        return (rows, k), group, 0
    group, convrot = int(params.get("group_size") or 16), int(params.get("convrot_groupsize") or 256)
    (n, groups), s_dtype = stored["weight_s_rel"]
    k = groups * group
    bits = cols * 8 // k if k else 0
    if n != rows or bits not in (4, 6) or k * bits != cols * 8:
        raise bad(f"has a packed weight [{rows}, {cols}] that does not fit its weight_s_rel [{n}, {groups}]")
    if s_dtype not in (torch.float8_e4m3fn, torch.uint8, torch.float32):
        raise bad(f"has a weight_s_rel of {s_dtype} (expected float8_e4m3fn or float32)")
    if group < 4 or (16 % group and group % 16) or k % 16:
        raise bad(f"has a group size {group} (it must divide 16 or be a multiple of 16) over {k} inputs")
    if convrot < 4 or 4 ** round(math.log(convrot, 4)) != convrot or k % convrot:
        raise bad(f"has a ConvRot group size {convrot} that is not a power of 4 dividing {k}")
    expect = {"weight_s_channel": (rows,), "weight_codebook": (16,), "weight_correction": (groups, rows)}
    for role, shape in expect.items():
        if role in stored and (tuple(stored[role][0]) != shape or not _is_float(stored[role][1])):
            got = f"{stored[role][1]} {list(stored[role][0])}"
            raise bad(f"has a {role} of {got} (expected floats {list(shape)})")
    if bits == 6 and (k % 32 or group % 16 or "weight_codebook" in stored or "weight_correction" in stored):
        raise bad("is 6-bit with a codebook, a correction or a group size that 6-bit storage does not have")
    return (rows, k), group, convrot


def check_pre_quant_scale(stored: dict, logical: tuple[int, int], bad) -> None:
    """nvfp4's smoothing: one float per input column (the logical width may be padded)."""
    shape, dtype = stored["pre_quant_scale"]
    if len(shape) != 1 or not _is_float(dtype) or not 0 <= logical[1] - shape[0] < 32:
        raise bad(f"has a pre_quant_scale of {dtype} {list(shape)} (expected {logical[1]} floats)")


def bits(q, stored_weight: torch.Tensor) -> int:
    """The code width of a W4A8 layer: 4 or 6, from its packed row against K."""
    return stored_weight.shape[1] * 8 // q.shape[1]


def int8_grid(q, stored) -> torch.Tensor:
    """A W4A8 layer's int8 grid [N, K] (float32 values), before its channel scale and rotation."""
    w, (n, k), g = stored["weight"].view(torch.uint8), q.shape, q.group
    width = bits(q, w)
    packed = w.to(torch.int32)
    codes = torch.empty(n, k, dtype=torch.int32, device=w.device)
    codes[:, 0::2] = packed[:, : k // 2] & 0xF
    codes[:, 1::2] = (packed[:, : k // 2] >> 4) & 0xF
    if width == 6:
        high = packed[:, k // 2 :]
        for j in range(4):
            codes[:, j::4] |= ((high >> (2 * j)) & 0x3) << 4
    codebook = stored.get("weight_codebook")
    if codebook is not None:
        values = codebook.to(w.device, torch.float32)[codes]
    else:
        values = codes.float() - float(1 << (width - 1))
    s_rel = stored["weight_s_rel"]
    s_rel = s_rel.view(torch.float8_e4m3fn) if s_rel.dtype == torch.uint8 else s_rel
    values = values.view(n, k // g, g) * s_rel.float().unsqueeze(-1)
    return values.view(n, k).round().clamp_(-127, 127)


def dequantize_w4a8(q, stored, dtype: torch.dtype, hadamard) -> torch.Tensor:
    n, k = q.shape
    g, r = q.group, q.convrot
    w = int8_grid(q, stored).view(n, k // g, g) * stored["weight_s_channel"].float().view(n, 1, 1)
    correction = stored.get("weight_correction")
    if correction is not None:
        w = w + correction.t().unsqueeze(-1).float()
    w = w.view(n, k).to(dtype)
    h = hadamard(r, w.device).to(dtype)
    return torch.matmul(w.reshape(n, k // r, r), h.T).reshape(n, k).to(dtype)


def dequantize_awq(q, stored, dtype: torch.dtype) -> torch.Tensor:
    w, (n, k), g = stored["weight"].view(torch.uint8), q.shape, q.group
    packed = w.to(torch.int32)
    codes = torch.empty(n, k, dtype=torch.int32, device=w.device)
    codes[:, 0::2] = packed & 0x0F
    codes[:, 1::2] = (packed >> 4) & 0x0F
    scale, zeros = stored["weight_scale"].t().unsqueeze(-1), stored["weight_zeros"].t().unsqueeze(-1)
    return ((codes.view(n, k // g, g).to(dtype) - 8.0) * scale + zeros).view(n, k).to(dtype)


def smooth(w: torch.Tensor, stored) -> torch.Tensor:
    """A dequantised nvfp4 weight times its ``pre_quant_scale`` per input column (when it has one)."""
    s = stored.get("pre_quant_scale")
    if s is None:
        return w
    w = w.clone()
    w[:, : s.shape[0]] *= s.to(w.device, w.dtype)
    return w


def _is_float(dtype) -> bool:
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point
