"""Tiny checkpoints in the quantised formats users download (test helper).

Quantisers here follow the layouts ComfyUI loads (comfy/quant_ops.py ``QUANT_ALGOS``, with comfy-kitchen's
tensor layouts): fp8 with a per-tensor ``weight_scale`` (amax / 448), int8 per tensor or per row (amax /
127) with optional ConvRot, nvfp4 with E2M1 codes (even column in the high nibble: comfy-kitchen's
``hi_first``), float8 block scales in the swizzled 128x4-tile layout (comfy-kitchen float_utils.py
``to_blocked``) and a global ``weight_scale_2``; GGUF through the ``gguf`` package's own writer and
quantisers. Each writer also returns the weights a correct loader must reconstruct, computed here from the
stored bytes by comfy-kitchen's dequantisation formulas (backends/eager/quantization.py:
``dequantize_per_tensor_fp8``, ``dequantize_nvfp4``, ``dequantize_int8_convrot_weight``), written out here.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

# The block linears that quantised releases quantise; embedders, modulation and the final layer stay high.
QUANTISED = re.compile(
    r"(double_blocks\.\d+\.(img|txt)_(attn\.(qkv|proj)|mlp\.[02])|single_blocks\.\d+\.linear[12])"
)
E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])


def quantised_layers(sd: dict[str, torch.Tensor]) -> list[str]:
    return [k[: -len(".weight")] for k in sd if k.endswith(".weight") and QUANTISED.fullmatch(k[:-7])]


def marker(entry: dict) -> torch.Tensor:
    return torch.tensor(list(json.dumps(entry).encode()), dtype=torch.uint8)


def fp8(w: torch.Tensor, dtype=torch.float8_e4m3fn) -> tuple[torch.Tensor, torch.Tensor]:
    top = 448.0 if dtype == torch.float8_e4m3fn else 57344.0
    scale = (w.abs().max().float() / top).reshape(())
    return (w.float() / scale).to(dtype), scale


def int8(w: torch.Tensor, per_row: bool, convrot: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    w = w.float()
    if convrot:
        w = (w.reshape(w.shape[0], -1, convrot) @ hadamard(convrot).T).reshape(w.shape)
    scale = w.abs().amax(1, keepdim=True) / 127 if per_row else (w.abs().max() / 127).reshape(())
    return (w / scale).round().clamp(-128, 127).to(torch.int8), scale


def hadamard(g: int) -> torch.Tensor:
    h4 = torch.tensor([[1, 1, 1, -1], [1, 1, -1, 1], [1, -1, 1, 1], [-1, 1, 1, 1]], dtype=torch.float32)
    h = torch.ones(1, 1)
    for _ in range(round(math.log(g, 4))):
        h = torch.kron(h, h4)
    return h / math.sqrt(g)


def swizzled_index(r: int, k: int, cols: int) -> int:
    """Flat position of logical block scale S[r, k] in the 128x4-tile layout (``cols`` padded to 4)."""
    return ((r // 128) * (cols // 4) + k // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + (k % 4)


def nvfp4(w: torch.Tensor, global_scale: float = 0.5) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """(stored tensors, the weight they dequantise to): nearest E2M1 code per value, power-of-two scales."""
    rows, cols = w.shape
    blocks = w.float().reshape(rows, cols // 16, 16)
    amax = blocks.abs().amax(-1).clamp(min=1e-8)
    scales = torch.exp2(torch.ceil(torch.log2(amax / 6 / global_scale))).clamp(2.0**-6, 256.0)
    scaled = blocks / (scales * global_scale).unsqueeze(-1)
    codes = (scaled.unsqueeze(-1) - E2M1).abs().argmin(-1).reshape(rows, cols).to(torch.uint8)
    packed = (codes[:, 0::2] << 4) | codes[:, 1::2]  # even column in the high nibble
    srows, scols = -(-rows // 128) * 128, -(-(cols // 16) // 4) * 4
    flat = torch.zeros(srows * scols)
    for r in range(rows):
        for k in range(cols // 16):
            flat[swizzled_index(r, k, scols)] = scales[r, k]
    stored = {
        "weight": packed,
        "weight_scale": flat.reshape(srows, scols).to(torch.float8_e4m3fn),
        "weight_scale_2": torch.tensor(global_scale),
    }
    expected = E2M1[codes.long()].reshape(rows, cols // 16, 16) * (scales * global_scale).unsqueeze(-1)
    return stored, expected.reshape(rows, cols)


def write_quantised(
    sd: dict[str, torch.Tensor], path: Path, fmt: str, form: str = "tensor", prefix: str = "", **options
) -> dict[str, torch.Tensor]:
    """Write ``sd`` with its block linears in ``fmt``; return the weights a loader must reconstruct.

    fmt: float8_e4m3fn, float8_e5m2, int8_tensorwise, nvfp4; form: "tensor" (``.comfy_quant``), "header"
    (``_quantization_metadata`` only), "legacy" (``scaled_fp8`` + ``scale_weight``), "plain" (fp8, no scales).
    """
    out, expected, layers = {}, {}, {}
    quantised = set(options.get("layers") or quantised_layers(sd))
    for key, tensor in sd.items():
        layer = key[: -len(".weight")]
        if layer not in quantised:
            out[key] = (
                tensor.to(options.get("high", torch.bfloat16))
                if form != "plain"
                else tensor.to(torch.float8_e4m3fn)
            )
            continue
        entry = {"format": fmt}
        if fmt.startswith("float8"):
            q, scale = fp8(tensor, getattr(torch, fmt))
            if form == "plain":
                q, scale = tensor.to(getattr(torch, fmt)), None
            stored = {"weight": q} | ({} if scale is None else {"weight_scale": scale})
            expected[key] = q.float() * (1.0 if scale is None else scale)
        elif fmt == "int8_tensorwise":
            convrot = options.get("convrot", 0)
            q, scale = int8(tensor, options.get("per_row", True) or bool(convrot), convrot)
            stored = {
                "weight": q,
                "weight_scale": scale if not options.get("flat_scale") else scale.reshape(-1),
            }
            w = q.float() * scale
            if convrot:
                entry |= {"convrot": True, "convrot_groupsize": convrot}
                w = (w.reshape(w.shape[0], -1, convrot) @ hadamard(convrot).T).reshape(w.shape)
            if options.get("nested"):  # the legacy layout: format on top, its parameters under "params"
                entry = {"format": fmt, "params": {k: v for k, v in entry.items() if k != "format"}}
            if options.get("input_scale"):
                stored["input_scale"] = torch.tensor(0.02)
            expected[key] = w
        else:
            stored, expected[key] = nvfp4(tensor)
        if form == "legacy":
            stored = {"scale_weight" if k == "weight_scale" else k: v for k, v in stored.items()}
            stored["scale_input"] = torch.tensor(1.0)
        for role, value in stored.items():
            out[f"{layer}.{role}"] = value
        if form == "tensor":
            out[f"{layer}.comfy_quant"] = marker(entry)
        layers[layer] = entry
    if form == "legacy":
        out["scaled_fp8"] = torch.empty(2, dtype=torch.float8_e4m3fn)
    metadata = {}
    if form == "header":
        metadata["_quantization_metadata"] = json.dumps({"format_version": "1.0", "layers": layers})
    save_file({prefix + k: v.contiguous() for k, v in out.items()}, str(path), metadata=metadata)
    return expected


def write_gguf(tensors: dict[str, torch.Tensor], path: Path, arch: str, types: dict[str, str], **fields):
    """A GGUF file through ``gguf.GGUFWriter``; ``types`` names each tensor's GGML type (default F32).

    Returns {name: the float32 values the file holds}, by ``gguf.quants.dequantize`` (the oracle). Types with
    no quantiser in ``gguf`` (the K-quants) get random blocks with sane fp16 scales.
    """
    import gguf

    writer = gguf.GGUFWriter(str(path), arch=arch)
    for key, value in fields.items():
        writer.add_key_value(key, value[0], value[1])
    held = {}
    rng = np.random.default_rng(0)
    for name, tensor in tensors.items():
        qt = gguf.GGMLQuantizationType[types.get(name, "F32")]
        arr = tensor.float().numpy()
        if qt == gguf.GGMLQuantizationType.F32:
            data = arr.astype(np.float32)
            writer.add_tensor(name, data)
        elif qt == gguf.GGMLQuantizationType.F16:
            data = arr.astype(np.float16)
            writer.add_tensor(name, data)
        elif qt.name.endswith("_K"):
            elements, nbytes = gguf.GGML_QUANT_SIZES[qt]
            blocks = rng.integers(
                0, 256, size=(arr.shape[0], arr.shape[1] // elements, nbytes), dtype=np.uint8
            )
            d = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
            where = {
                "Q4_K": [0, 2],
                "Q5_K": [0, 2],
                "Q6_K": [nbytes - 2],
                "Q3_K": [nbytes - 2],
                "Q2_K": [nbytes - 4, nbytes - 2],
            }
            for at in where[qt.name]:
                blocks[:, :, at : at + 2] = d
            data = blocks.reshape(arr.shape[0], -1)
            writer.add_tensor(name, data, raw_dtype=qt)
        else:
            data = gguf.quants.quantize(arr, qt)
            writer.add_tensor(name, data, raw_dtype=qt)
        held[name] = torch.from_numpy(np.array(gguf.quants.dequantize(data, qt), dtype=np.float32)).reshape(
            tensor.shape
        )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return held
