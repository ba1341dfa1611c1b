"""The 4-bit layouts ComfyUI reads since 0.29 (``asym_w4a8_int8``, ``awq_w4a16``) and nvfp4's
``pre_quant_scale``, against comfy-kitchen itself.

W4A8 and NVFP4 files are written by comfy-kitchen's own quantisers (its eager backend), AWQ by the formula of
the formats spec (comfy-kitchen has no AWQ quantiser). Every quantised layer must equal comfy-kitchen's layout
built on the same stored bytes, bit for bit: dequantised (``Linear.compute_weight``) and, for W4A8 and AWQ,
multiplied in format (``F.linear`` on its ``QuantizedTensor``, eager backend), within 2% of the dequantised
product per layer (W4A8: int8 activations per token; AWQ: its product in the scales' bf16). A whole sampling
run of the dequantised model equals a float32 twin holding the dequantised weights within 1/255; in format
it stays within 4% of it. The asymmetric correction and the pre-quant scale each move the
output by exactly their formula, so dropping either fails here.
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
import torch.nn.functional as F

ck = pytest.importorskip(
    "comfy_kitchen",
    reason="comfy-kitchen is not installed (pip install comfy-kitchen, part of the test extra): its own "
    "quantisers write the W4A8 and NVFP4 files and its layouts are the reference",
)

from comfy_kitchen.tensor import (  # noqa: E402
    AsymW4A8Int8Layout,
    QuantizedTensor,
    TensorCoreAWQW4A16Layout,
    TensorCoreNVFP4Layout,
)
from quant_files import (  # noqa: E402
    awq,
    hadamard,
    marker,
    quantised_layers,
    write_awq,
    write_quantised,
    write_with_kitchen,
)
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from tiny_dit import bfl_state_dict, make_diffusers_dit  # noqa: E402

from flux2_core import Flux2Error, SampleRequest, SampleSettings, load_transformer, sample  # noqa: E402
from flux2_core.ops import PLAIN, LowRankPatch, linears  # noqa: E402
from flux2_core.weights import kitchen, quant_source  # noqa: E402

CPU = torch.device("cpu")
DTYPES = (torch.float32, torch.bfloat16)
W4A8 = {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 16}
# comfy-kitchen's quantiser options -> the W4A8 variants files carry
VARIANTS = {
    "int4-codebook-fp8": {},
    "int4-uniform-fp32": {"codebook": False, "scale_dtype": torch.float32},
    "int6": {"bits": 6},
    "asymmetric": {"symmetric": False, "codebook": False},
}
SETTINGS = SampleSettings(64, 64, 2, 1.0, 5)


@pytest.fixture(scope="module")
def sd():
    return bfl_state_dict(make_diffusers_dit(seed=3))


def _stored(path, layer: str, prefix: str = "") -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        head = prefix + layer + "."
        return {k[len(head) :]: f.get_tensor(k) for k in f.keys() if k.startswith(head)}


def _theirs(fmt: str, t: dict[str, torch.Tensor], shape, dtype) -> QuantizedTensor:
    """comfy-kitchen's layout on the stored tensors, as ComfyUI builds it (plus the W4A8 correction)."""
    if fmt == "asym_w4a8_int8":
        s_rel = t["weight_s_rel"]
        params = AsymW4A8Int8Layout.Params(
            scale=s_rel.view(torch.float8_e4m3fn) if s_rel.dtype == torch.uint8 else s_rel,
            s_channel=t["weight_s_channel"], correction=t.get("weight_correction"),
            codebook=t.get("weight_codebook"), group_size=16, convrot_groupsize=16,
            orig_dtype=dtype, orig_shape=shape,
        )  # fmt: skip
        return QuantizedTensor(t["weight"], "AsymW4A8Int8Layout", params)
    params = TensorCoreAWQW4A16Layout.Params(
        scale=t["weight_scale"], zeros=t["weight_zeros"], group_size=16, orig_dtype=dtype, orig_shape=shape
    )
    return QuantizedTensor(t["weight"], "TensorCoreAWQW4A16Layout", params)


def _x(layer, dtype, seed=0):
    return torch.randn(2, 7, layer.in_features, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _quantised(model):
    return [(name, layer) for name, layer in linears(model.transformer) if layer.source is not PLAIN]


def _check_against_kitchen(path, fmt: str, layers: list[str], prefix: str = "") -> None:
    for dtype in DTYPES:
        for mode in ("dequantize", "format"):
            model = load_transformer(path, variant="distilled", dtype=dtype, quant_compute=mode)
            found = _quantised(model)
            assert sorted(n for n, _ in found) == sorted(layers)
            for i, (name, layer) in enumerate(found):
                shape = (layer.out_features, layer.in_features)
                theirs = _theirs(fmt, _stored(path, name, prefix), shape, dtype)
                x = _x(layer, dtype, i)
                with ck.use_backend("eager"):
                    weight, product = theirs.dequantize(), F.linear(x, theirs)
                got = layer.compute_weight(dtype, CPU)
                assert torch.equal(got, weight.to(dtype)), f"{name} {dtype}: {(got - weight).abs().max()}"
                if mode == "format":
                    assert torch.equal(layer(x), product.to(dtype)), f"{name} {dtype} in format"
                    # the in-format bound: W4A8's int8 activations (per token, after the rotation), AWQ's
                    # product in its scales' bf16, each within 2% of the dequantised product
                    dequantised = F.linear(x.float(), got.float())
                    error = ((layer(x).float() - dequantised).norm() / dequantised.norm()).item()
                    assert error < 0.02, (name, dtype, error)
                else:
                    assert torch.equal(layer(x), F.linear(x, got)), name


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_w4a8_files_equal_comfy_kitchens_layout(sd, tmp_path, variant):
    """4- and 6-bit, codebook or uniform, fp8 or float32 group scales, the asymmetric correction: written by
    ``AsymW4A8Int8Layout.quantize``, read back equal to its ``dequantize`` and its int8 linear."""
    path = tmp_path / f"w4a8-{variant}.safetensors"
    layers = write_with_kitchen(
        sd, path, AsymW4A8Int8Layout, W4A8, group_size=16, convrot_groupsize=16, **VARIANTS[variant]
    )
    with safe_open(str(path), "pt") as f:
        roles = {k.split(".weight", 1)[1] for k in f.keys() if k.startswith(layers[0] + ".weight")}
    assert ("_correction" in roles) == (variant == "asymmetric")
    assert ("_codebook" in roles) == (variant == "int4-codebook-fp8")
    _check_against_kitchen(path, "asym_w4a8_int8", layers)


def test_w4a8_header_form_with_a_prefix_and_byte_scales(sd, tmp_path):
    """The header's ``_quantization_metadata`` form, under ``model.diffusion_model.``, with the fp8 group
    scales stored as their bytes (uint8), as some writers save them."""
    path = tmp_path / "w4a8-header.safetensors"
    prefix = "model.diffusion_model."
    layers = write_with_kitchen(
        sd, path, AsymW4A8Int8Layout, W4A8, form="header", prefix=prefix, group_size=16, convrot_groupsize=16
    )
    tensors = load_file(str(path))
    with safe_open(str(path), "pt") as f:
        metadata = f.metadata()
    for key in [k for k in tensors if k.endswith(".weight_s_rel")]:
        tensors[key] = tensors[key].view(torch.uint8)
    save_file(tensors, str(path), metadata=metadata)
    _check_against_kitchen(path, "asym_w4a8_int8", layers, prefix)


def test_awq_files_equal_comfy_kitchens_layout(sd, tmp_path):
    """AWQ by the spec's formula: unsigned nibbles, scales and zeros transposed [in / G, out], the zeros
    added; comfy-kitchen's TensorCoreAWQW4A16Layout on the same bytes dequantises and multiplies the same."""
    path = tmp_path / "awq.safetensors"
    write_awq(sd, path)
    layers = quantised_layers(sd)
    model = load_transformer(path, variant="distilled")
    name, layer = _quantised(model)[0]
    assert torch.equal(layer.compute_weight(torch.float32, CPU), awq(sd[name + ".weight"])[1])
    _check_against_kitchen(path, "awq_w4a16", layers)


def _without(path, suffix: str, out):
    tensors = {k: v for k, v in load_file(str(path)).items() if not k.endswith(suffix)}
    save_file(tensors, str(out))
    return out


def test_the_asymmetric_correction_moves_the_weight_by_its_formula(sd, tmp_path):
    """W = (q8 s_channel + correction[k // g, n]) H^T: the file without its correction (what ComfyUI's
    loader computes) differs from ours by exactly the correction rotated back, and the outputs differ."""
    path = tmp_path / "asym.safetensors"
    layers = write_with_kitchen(sd, path, AsymW4A8Int8Layout, W4A8, **VARIANTS["asymmetric"], group_size=16,
                                convrot_groupsize=16)  # fmt: skip
    dropped = _without(path, ".weight_correction", tmp_path / "dropped.safetensors")
    ours = dict(_quantised(load_transformer(path, variant="distilled", quant_compute="dequantize")))
    theirs = dict(_quantised(load_transformer(dropped, variant="distilled", quant_compute="dequantize")))
    for name in layers:
        c = _stored(path, name)["weight_correction"].float()  # [K / 16, N]
        n, k = ours[name].out_features, ours[name].in_features
        expanded = c.t().repeat_interleave(16, dim=1)  # [N, K]
        delta = (expanded.reshape(n, k // 16, 16) @ hadamard(16).T).reshape(n, k)
        got = ours[name].compute_weight(torch.float32, CPU) - theirs[name].compute_weight(torch.float32, CPU)
        torch.testing.assert_close(got, delta, rtol=0, atol=1e-5)
        assert delta.abs().max() > 1e-3
        x = _x(ours[name], torch.float32)
        assert (ours[name](x) - theirs[name](x)).abs().max() > 1e-3


def test_the_pre_quant_scale_smooths_the_input_on_every_path(sd, tmp_path, monkeypatch):
    """nvfp4 with ``pre_quant_scale`` s (NVFP4 of W / s by comfy-kitchen's quantiser): the weight is
    comfy-kitchen's dequantisation times s per input column, the output (x * s) Wq^T, and in format the
    input handed to the nvfp4 quantiser is x * s. Without s the output is the plain Wq's."""
    g = torch.Generator().manual_seed(4)
    layers, scales = quantised_layers(sd), {}
    smoothed = {}
    for layer in layers:
        w = sd[layer + ".weight"]
        s = (torch.rand(w.shape[1], generator=g) + 0.5).to(torch.bfloat16)
        scales[layer], smoothed[layer + ".weight"] = s, w / s.float()
    path = tmp_path / "nvfp4-awq.safetensors"
    write_with_kitchen({**sd, **smoothed}, path, TensorCoreNVFP4Layout, {"format": "nvfp4"})
    tensors = load_file(str(path))
    save_file(tensors, str(tmp_path / "plain-nvfp4.safetensors"))
    for layer, s in scales.items():
        tensors[layer + ".pre_quant_scale"] = s
    save_file(tensors, str(path))
    ours = dict(_quantised(load_transformer(path, variant="distilled")))
    plain = dict(_quantised(load_transformer(tmp_path / "plain-nvfp4.safetensors", variant="distilled")))
    for i, (name, s) in enumerate(scales.items()):
        t = _stored(path, name)
        params = TensorCoreNVFP4Layout.Params(
            t["weight_scale_2"], torch.float32, tuple(ours[name].compute_weight(torch.float32, CPU).shape),
            block_scale=t["weight_scale"],
        )  # fmt: skip
        with ck.use_backend("eager"):
            wq = QuantizedTensor(t["weight"], "TensorCoreNVFP4Layout", params).dequantize()
        assert torch.equal(ours[name].compute_weight(torch.float32, CPU), wq * s.float())
        assert torch.equal(plain[name].compute_weight(torch.float32, CPU), wq)
        x = _x(ours[name], torch.float32, i)
        torch.testing.assert_close(ours[name](x), F.linear(x * s.float(), wq), rtol=1e-5, atol=1e-5)
        assert (ours[name](x) - plain[name](x)).abs().max() > 1e-2
    seen = []
    monkeypatch.setattr(kitchen, "activation_operand", lambda fmt, x, scale: seen.append(x) or x)
    monkeypatch.setattr(kitchen, "weight_operand", lambda layer, stored, shape, dtype: torch.zeros(shape))
    name, s = next(iter(scales.items()))
    layer = ours[name]
    x = _x(layer, torch.float32)
    kitchen.linear(layer.source.layer, layer.source._stored(layer, CPU), x, layer.out_features)
    assert torch.equal(seen[0], x.reshape(-1, layer.in_features) * s.float())


def test_a_mixed_file_keeps_each_layer_in_its_format(sd, tmp_path):
    """Some layers W4A8, some int8 (ConvRot), the rest bf16, in one file with the header form."""
    layers = quantised_layers(sd)
    w4a8, int8 = layers[::2], layers[1::2]
    path = tmp_path / "w4a8.safetensors"
    write_with_kitchen(sd, path, AsymW4A8Int8Layout, W4A8, layers=w4a8, group_size=16, convrot_groupsize=16)
    int8_path = tmp_path / "int8.safetensors"
    write_quantised(sd, int8_path, "int8_tensorwise", layers=int8, convrot=16)
    tensors = {**load_file(str(int8_path)), **load_file(str(path))}
    for layer in int8:
        tensors[layer + ".weight"] = load_file(str(int8_path))[layer + ".weight"]
    entries = {layer: W4A8 for layer in w4a8} | {
        layer: {"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 16} for layer in int8
    }
    mixed = tmp_path / "mixed.safetensors"
    tensors = {k: v for k, v in tensors.items() if not k.endswith(".comfy_quant")}
    save_file(tensors, str(mixed), metadata={"_quantization_metadata": json.dumps({"layers": entries})})
    model = load_transformer(mixed, variant="distilled")
    labels = {name: layer.source.layer.label for name, layer in _quantised(model)}
    want = {n: "asym_w4a8_int8 (W4A8)" for n in w4a8} | {n: "int8_tensorwise + ConvRot" for n in int8}
    assert labels == want
    assert model.transformer.final_layer.linear.source is PLAIN


def _twin(sd, held, tmp_path):
    path = tmp_path / "twin.safetensors"
    save_file({k: held.get(k, v).float().contiguous() for k, v in sd.items()}, str(path))
    return load_transformer(path, variant="distilled")


@pytest.mark.parametrize("fmt", ["asym_w4a8_int8", "awq_w4a16"])
def test_a_whole_run_equals_a_float_twin_of_the_dequantised_weights(sd, tmp_path, fmt):
    """The dequantised model samples what a float32 model of the same values samples (within 1/255); in
    format (W4A8: int8 activations per token; AWQ: the eager GEMM in the scales' bf16) within 4% of it."""
    path, held = tmp_path / f"{fmt}.safetensors", {}
    if fmt == "asym_w4a8_int8":
        write_with_kitchen(sd, path, AsymW4A8Int8Layout, W4A8, held=held, group_size=16, convrot_groupsize=16)
    else:
        held = write_awq(sd, path)
    positive = torch.randn(1, 6, 24, generator=torch.Generator().manual_seed(1))
    runs = {}
    for mode in ("dequantize", "format"):
        model = load_transformer(path, variant="distilled", quant_compute=mode)
        runs[mode] = sample(SampleRequest(model, positive, SETTINGS))
    twin = sample(SampleRequest(_twin(sd, held, tmp_path), positive, SETTINGS))
    assert (runs["dequantize"] - twin).abs().max().item() <= 1 / 255
    relative = ((runs["format"] - twin).norm() / twin.norm()).item()
    assert 0 < relative < 0.04, relative


def test_svdquant_is_refused_by_name(sd, tmp_path):
    for extra, entry in (({}, {"format": "svdquant_w4a4"}), ({".proj_down": torch.zeros(32, 4)}, None)):
        tensors = dict(sd)
        layer = "double_blocks.0.img_attn.proj"
        if entry is not None:
            tensors[layer + ".comfy_quant"] = marker(entry)
        for suffix, value in extra.items():
            tensors[layer + suffix] = value
        save_file(tensors, str(tmp_path / "svdq.safetensors"))
        with pytest.raises(Flux2Error, match="SVDQuant W4A4.*(no file layout|cannot be loaded)"):
            load_transformer(tmp_path / "svdq.safetensors")


def test_loras_add_beside_w4a8_in_format(sd, tmp_path):
    """A LoRA on a W4A8 layer multiplying in format is added beside the int8 matmul (x delta^T)."""
    path = tmp_path / "w4a8.safetensors"
    write_with_kitchen(sd, path, AsymW4A8Int8Layout, W4A8, group_size=16, convrot_groupsize=16)
    model = load_transformer(path, variant="distilled", quant_compute="format")
    name, layer = _quantised(model)[0]
    x, g = _x(layer, torch.float32), torch.Generator().manual_seed(5)
    base = layer(x)
    up, down = torch.randn(layer.out_features, 4, generator=g), torch.randn(4, layer.in_features, generator=g)
    layer.add_patch("lora", LowRankPatch(up, down, strength=0.5))
    torch.testing.assert_close(layer(x), base + 0.5 * (x @ down.T) @ up.T, rtol=1e-5, atol=1e-5)
    layer.remove_patch("lora")
    assert torch.equal(layer(x), base)


def test_on_a_cpu_in_bfloat16_the_faster_path_is_measured_once_per_shape_class(sd, tmp_path, caplog):
    """auto on a CPU in bfloat16: the first call of a shape class times both paths and logs the choice; the
    next call of that class reuses it (its output the chosen path's, bit for bit)."""
    path = tmp_path / "w4a8.safetensors"
    write_with_kitchen(sd, path, AsymW4A8Int8Layout, W4A8, group_size=16, convrot_groupsize=16)
    model = load_transformer(path, variant="distilled", dtype=torch.bfloat16)
    name, layer = _quantised(model)[0]
    x = _x(layer, torch.bfloat16)
    key = quant_source.shape_class(layer.source.layer.label, x, layer.out_features)
    quant_source._FASTER.pop(key, None)
    with caplog.at_level(logging.INFO, logger="flux2_core.weights.quant_source"):
        first = layer(x)
        second = layer(x)
    lines = [r.getMessage() for r in caplog.records if "best of 2" in r.getMessage()]
    assert len(lines) == 1 and key in quant_source.measured(), lines
    in_format = quant_source.measured()[key]
    theirs = _theirs("asym_w4a8_int8", _stored(path, name), (layer.out_features, layer.in_features), x.dtype)
    with ck.use_backend("eager"):
        want = F.linear(x, theirs) if in_format else F.linear(x, layer.compute_weight(x.dtype, CPU))
    assert torch.equal(first, want) and torch.equal(second, want)
    assert ("in format" if in_format else "dequantised") in lines[0]
    for forced in (True, False):  # a recorded choice is followed
        quant_source._FASTER[key] = forced
        with ck.use_backend("eager"):
            want = F.linear(x, theirs) if forced else F.linear(x, layer.compute_weight(x.dtype, CPU))
        assert torch.equal(layer(x), want), forced
    quant_source._FASTER.pop(key)


def test_the_memory_plan_counts_packed_bytes_and_the_int8_temporaries(sd, tmp_path):
    """The weights count their packed bytes (codes, scales, codebook) from the header alone, and the sampling
    estimate gains the widest W4A8 layer's temporaries: single_blocks' linear1 (288 x 32) at 512 text + 16
    image tokens in float32: the input rotated and in int8 (5 K per row), the int32 products and their
    scaling (8 N per row) and the weight decoded to its int8 grid (10 N K)."""
    from flux2_core import estimate_memory
    from flux2_core.dit.files import DIT_SPEC
    from flux2_core.weights.loading import weight_bytes

    path, held = tmp_path / "w4a8.safetensors", {}
    layers = write_with_kitchen(sd, path, AsymW4A8Int8Layout, W4A8, held=held, group_size=16,
                                convrot_groupsize=16)  # fmt: skip
    _, planned, _ = weight_bytes(DIT_SPEC, path, torch.float32)
    with safe_open(str(path), "pt") as f:
        packed = sum(f.get_tensor(k).nbytes for k in f.keys() if not k.endswith(".comfy_quant") and
                     any(k.startswith(layer + ".weight") for layer in layers))  # fmt: skip
    rest = sum(v.numel() * 4 for k, v in sd.items() if k[: -len(".weight")] not in layers)
    assert planned == packed + rest
    model = load_transformer(path, variant="distilled")
    twin = _twin(sd, held, tmp_path)
    rows, n, k = 512 + 16, 288, 32
    extra = rows * k * 5 + rows * n * 8 + 10 * n * k
    assert estimate_memory(model, SETTINGS, None) - estimate_memory(twin, SETTINGS, None) == extra
