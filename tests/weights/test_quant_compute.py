"""Quantised layers multiplied in their own format (``weights.kitchen``), against comfy-kitchen itself.

The choice of path is checked on a faked capability table (CPU, sm80, sm89, sm90, sm100, sm120) and faked
installs. The numerics are checked on the CPU through comfy-kitchen's eager backend with ``quant_compute
"format"`` (in format wherever a kernel exists): fp8 and convrot_w4a4 run their whole in-format matmul there
and must equal comfy-kitchen's own layouts on the same stored bytes bit for bit (the same operation), and
today's dequantised output within the format's error. nvfp4 and mxfp8 have no CPU kernel in torch (block-
scaled ``scaled_mm``: "CPU does not support swizzle"), so on a CPU their operands are checked instead:
the weight is the stored bytes untouched and dequantises to ours, the activation is comfy-kitchen's own
quantisation of the input (the GPU check runs their matmul). ``dequantize`` gives today's output bit for bit.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

ck = pytest.importorskip(
    "comfy_kitchen",
    reason="comfy-kitchen is not installed (pip install comfy-kitchen, part of the test extra): the "
    "in-format matmuls are checked against its layouts",
)

from comfy_kitchen.tensor import (  # noqa: E402
    QuantizedTensor,
    TensorCoreConvRotW4A4Layout,
    TensorCoreFP8Layout,
    TensorCoreMXFP8Layout,
    TensorCoreNVFP4Layout,
)
from quant_files import quantised_layers, write_quantised, write_with_kitchen  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tiny_dit import bfl_state_dict, make_diffusers_dit  # noqa: E402

from flux2_core import Flux2Error, load_transformer  # noqa: E402
from flux2_core.lora.patches import DoRAPatch, FullDeltaPatch  # noqa: E402
from flux2_core.ops import PLAIN, LowRankPatch, linears  # noqa: E402
from flux2_core.weights import kitchen  # noqa: E402
from flux2_core.weights.kitchen import LAYOUTS, OPS, Device, Kitchen, QuantCompute, choose  # noqa: E402

CPU = torch.device("cpu")
FULL = Kitchen("0.2.40", frozenset(LAYOUTS.values()), {op: "cuda" for op in OPS.values()})
FORMATS = (
    "float8_e4m3fn",
    "float8_e5m2",
    "nvfp4",
    "mxfp8",
    "convrot_w4a4",
    "int8_tensorwise",
    "asym_w4a8_int8",
    "awq_w4a16",
    "gguf",
)
DEVICES = {
    "cpu": Device("cpu"),
    "sm80": Device("cuda", (8, 0)),
    "sm89": Device("cuda", (8, 9)),
    "sm90": Device("cuda", (9, 0)),
    "sm100": Device("cuda", (10, 0)),
    "sm120": Device("cuda", (12, 0)),
}
K, D = "kitchen", "dequantize"
# format -> the path on each device of DEVICES (auto mode, a full comfy-kitchen, int8 in a diffusion model)
TABLE = {
    "float8_e4m3fn": (D, D, K, K, K, K),
    "float8_e5m2": (D,) * 6,
    "nvfp4": (D, D, D, D, K, K),
    "mxfp8": (D, D, D, D, K, K),
    "convrot_w4a4": (D, K, K, K, K, K),  # the CPU: no backend in this faked install (cuda only)
    "int8_tensorwise": ("int8",) * 6,  # on the CPU in 16 bits: where it measures faster
    "asym_w4a8_int8": (K,) * 6,  # likewise
    "awq_w4a16": (D, K, K, K, K, K),
    "gguf": (D,) * 6,
}


@pytest.fixture(scope="module")
def sd():
    return bfl_state_dict(make_diffusers_dit(3, attention_head_dim=64, axes_dims_rope=(16,) * 4))


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_choice_on_a_faked_capability_table(fmt):
    paths = tuple(choose(fmt, d, "auto", FULL, True).path for d in DEVICES.values())
    if fmt == "convrot_w4a4":  # its layout's linear runs wherever a backend has it: the CPU has eager
        eager = Kitchen("0.2.40", FULL.layouts, {OPS[fmt]: "eager"})
        assert choose(fmt, DEVICES["cpu"], "auto", eager, True).path == K
        paths = (D, *paths[1:])  # FULL's faked backends are cuda only
    assert paths == TABLE[fmt], dict(zip(DEVICES, paths))
    for device in DEVICES.values():  # the override: everything dequantises
        assert choose(fmt, device, "dequantize", FULL, True).path == D


def test_the_choice_says_why():
    assert choose("float8_e4m3fn", DEVICES["sm89"], "auto", FULL, True).how == (
        "fp8 matmul via comfy-kitchen cuda"
    )
    why = choose("nvfp4", DEVICES["sm90"], "auto", FULL, True).how
    assert "dequantised" in why and "10.0" in why and "compute capability 9.0" in why
    assert "not installed" in choose("float8_e4m3fn", DEVICES["sm90"], "auto", None, True).how
    old = Kitchen("0.2.7", frozenset({"TensorCoreFP8Layout"}), FULL.backends)
    assert "0.2.7 has no TensorCoreMXFP8Layout" in choose("mxfp8", DEVICES["sm100"], "auto", old, True).how
    no_mx = Device("cuda", (10, 0), torch_version=(2, 9))
    assert "torch 2.10" in choose("mxfp8", no_mx, "auto", FULL, True).how
    assert choose("int8_tensorwise", DEVICES["sm90"], "auto", FULL, False).path == D  # encoders
    # format: in format wherever a kernel exists, so a CPU runs fp8 in format; block-scaled stays out
    eager = Kitchen("0.2.40", FULL.layouts, {op: "eager" for op in OPS.values()})
    assert choose("float8_e4m3fn", DEVICES["cpu"], "format", eager, True).path == K
    assert choose("nvfp4", DEVICES["cpu"], "format", eager, True).path == D
    with pytest.raises(Flux2Error, match="fast"):
        QuantCompute("m", [], mode="fast")


def test_w4a8_and_awq_choices():
    """W4A8: in format on compute capability 8.0+ (below: dequantised); on a CPU in auto, measured per shape
    class (int8 too), in format mode always. AWQ: in format only where a GPU backend has its GEMV (comfy-
    kitchen's eager AWQ is dequantise-then-matmul), in format mode on its eager backend too."""
    old_gpu = Device("cuda", (7, 5))
    assert choose("asym_w4a8_int8", old_gpu, "auto", FULL, True).path == D
    assert "8.0" in choose("asym_w4a8_int8", old_gpu, "auto", FULL, True).how
    eager = Kitchen("0.2.40", FULL.layouts, {op: "eager" for op in OPS.values()})
    for fmt in ("asym_w4a8_int8", "int8_tensorwise"):
        auto = choose(fmt, DEVICES["cpu"], "auto", eager, True)
        assert auto.in_format and auto.measured and "measures faster" in auto.how
        forced = choose(fmt, DEVICES["cpu"], "format", eager, True)
        assert forced.in_format and not forced.measured
        assert not choose(fmt, DEVICES["sm90"], "auto", FULL, True).measured
    assert choose("awq_w4a16", DEVICES["sm90"], "auto", eager, True).path == D
    assert "dequantise-then-matmul" in choose("awq_w4a16", DEVICES["sm90"], "auto", eager, True).how
    assert choose("awq_w4a16", DEVICES["cpu"], "format", eager, True).path == K
    hip = Kitchen("0.2.40", FULL.layouts, {OPS["awq_w4a16"]: "hip"})
    assert choose("awq_w4a16", Device("cuda", None), "format", hip, True).path == K


def test_the_choice_is_made_once_per_device_and_logged_in_one_line(caplog):
    seen = []

    def info(device):
        seen.append(device)
        return DEVICES["sm90"]

    compute = QuantCompute("klein 4B", ["float8_e4m3fn", "nvfp4"], kitchen=lambda: FULL, device_info=info)
    with caplog.at_level(logging.INFO, logger="flux2_core.weights.kitchen"):
        for _ in range(3):
            assert compute.choice("float8_e4m3fn", CPU).path == K
            assert compute.choice("nvfp4", CPU).path == D
    lines = [r.getMessage() for r in caplog.records]
    assert seen == [CPU] and len(lines) == 1, lines
    assert lines[0].startswith(
        "klein 4B on cpu: fp8 layers: fp8 matmul via comfy-kitchen cuda; nvfp4 layers:"
    )


def _layers(model):
    return [(name, layer) for name, layer in linears(model.transformer) if layer.source is not PLAIN]


def _stored(path, layer: str) -> dict[str, torch.Tensor]:
    with safe_open(str(path), "pt") as f:
        return {k[len(layer) + 1 :]: f.get_tensor(k) for k in f.keys() if k.startswith(layer + ".")}


def _x(layer, dtype, seed=0):
    return torch.randn(2, 7, layer.in_features, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _relative(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("input_scale", [False, True])
def test_fp8_in_format_equals_comfy_kitchens_fp8_linear(sd, tmp_path, dtype, input_scale):
    """fp8 in format: activations to fp8 with the file's input_scale (else 1, as ComfyUI), through
    torch._scaled_mm; comfy-kitchen's TensorCoreFP8Layout on the same bytes gives the same output bit for
    bit, and it differs from today's dequantised output by the activations' fp8 rounding only."""
    path = tmp_path / "fp8.safetensors"
    write_quantised(sd, path, "float8_e4m3fn")
    if input_scale:  # the scales a calibrated file carries, one per layer
        from safetensors.torch import load_file

        tensors = load_file(str(path))
        for layer in quantised_layers(sd):
            tensors[layer + ".input_scale"] = torch.tensor(0.01)  # inputs up to 4.48 in range
        save_file(tensors, str(path))
    ours = load_transformer(path, variant="distilled", dtype=dtype, quant_compute="format")
    today = dict(
        _layers(load_transformer(path, variant="distilled", dtype=dtype, quant_compute="dequantize"))
    )
    for i, (name, layer) in enumerate(_layers(ours)):
        stored, x = _stored(path, name), _x(layer, dtype, i)
        s = stored.get("input_scale", torch.ones(()))
        xq, xp = TensorCoreFP8Layout.quantize(x.reshape(-1, layer.in_features), scale=s)
        params = TensorCoreFP8Layout.Params(
            scale=stored["weight_scale"], orig_dtype=dtype, orig_shape=tuple(stored["weight"].shape)
        )
        theirs = F.linear(
            QuantizedTensor(xq, "TensorCoreFP8Layout", xp),
            QuantizedTensor(stored["weight"], "TensorCoreFP8Layout", params),
        )
        got = layer(x)
        assert torch.equal(got, theirs.reshape(got.shape)), name
        dequantised = today[name](x)
        assert torch.equal(dequantised, F.linear(x, today[name].compute_weight(dtype, CPU))), name
        # e4m3 keeps 3 mantissa bits: each activation within 2^-4 relative, so the product within ~6%
        assert 0 < _relative(got, dequantised) < 0.08, (name, _relative(got, dequantised))


def _convrot_file(sd, path, groupsize: int = 64) -> list[str]:
    """Block linears quantised by comfy-kitchen's own ConvRot W4A4 layout, saved as ComfyUI writes them."""
    entry = {"format": "convrot_w4a4", "convrot_groupsize": groupsize}
    return write_with_kitchen(sd, path, TensorCoreConvRotW4A4Layout, entry, convrot_groupsize=groupsize)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_convrot_w4a4_files_load_and_multiply_as_comfy_kitchen(sd, tmp_path, dtype):
    """convrot_w4a4: the layout ComfyUI writes (int4 pairs in int8, a float32 scale per row, its ConvRot
    group size in the marker) loads and multiplies through comfy-kitchen's own linear (here its eager
    backend, which native ComfyUI runs on a CPU too), bit for bit; its dequantisation is the layout's."""
    path = tmp_path / "w4a4.safetensors"
    layers = _convrot_file(sd, path)
    model = load_transformer(path, variant="distilled", dtype=dtype)
    found = _layers(model)
    assert sorted(n for n, _ in found) == sorted(layers)
    assert {layer.source.layer.label for _, layer in found} == {"convrot_w4a4"}
    plain = load_transformer(path, variant="distilled", dtype=dtype, quant_compute="dequantize")
    plain_layers = dict(_layers(plain))
    for i, (name, layer) in enumerate(found):
        stored, x = _stored(path, name), _x(layer, dtype, i)
        params = TensorCoreConvRotW4A4Layout.Params(
            scale=stored["weight_scale"],
            orig_dtype=dtype,
            orig_shape=(layer.out_features, layer.in_features),
            convrot_groupsize=64,
        )
        weight = QuantizedTensor(stored["weight"], "TensorCoreConvRotW4A4Layout", params)
        got = layer(x)
        assert torch.equal(got, F.linear(x, weight)), name
        assert torch.equal(layer.compute_weight(dtype, CPU), weight.dequantize().to(dtype)), name
        dequantised = plain_layers[name](x)
        assert torch.equal(dequantised, F.linear(x, weight.dequantize().to(dtype))), name
        # int4 activations in groups of 64 after the rotation: a few tenths of relative error at most
        assert 0 < _relative(got, dequantised) < 0.3, (name, _relative(got, dequantised))


@pytest.mark.parametrize("installed", [None, Kitchen("0.2.3", frozenset({"TensorCoreFP8Layout"}), {})])
def test_convrot_w4a4_is_refused_by_name_without_a_comfy_kitchen_that_reads_it(
    sd, tmp_path, monkeypatch, installed
):
    path = tmp_path / "w4a4.safetensors"
    _convrot_file(sd, path)
    monkeypatch.setattr(kitchen, "installed", lambda: installed)
    have = "is not installed" if installed is None else "0.2.3 has no TensorCoreConvRotW4A4Layout"
    with pytest.raises(
        Flux2Error, match=f"double_blocks.0.*convrot_w4a4.*{have}.*pip install -U comfy-kitchen"
    ):
        load_transformer(path, variant="distilled")


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp8"])
def test_block_scaled_operands_are_the_stored_bytes_and_comfy_kitchens_activation(sd, tmp_path, fmt):
    """nvfp4 / mxfp8 in format hand comfy-kitchen the stored bytes untouched (dequantising to exactly our
    dequantisation) and the input as its own layout quantises it (nvfp4: the per-tensor scale from the
    file's input_scale, else amax / (448 * 6))."""
    path = tmp_path / f"{fmt}.safetensors"
    layout = TensorCoreNVFP4Layout if fmt == "nvfp4" else TensorCoreMXFP8Layout
    write_with_kitchen(sd, path, layout, {"format": fmt})
    model = load_transformer(path, variant="distilled", quant_compute="format")
    for i, (name, layer) in enumerate(_layers(model)):
        stored = layer.source._stored(layer, CPU)
        w = kitchen.weight_operand(
            layer.source.layer, stored, (layer.out_features, layer.in_features), torch.float32
        )
        assert w._qdata.data_ptr() == layer.weight.data_ptr(), "the stored bytes, not a copy"
        assert torch.equal(w.dequantize(), layer.compute_weight(torch.float32, CPU)), name
        x = _x(layer, torch.float32, i).reshape(-1, layer.in_features)
        for scale in (None, torch.tensor(0.01)):
            got = kitchen.activation_operand(fmt, x, scale)
            with ck.use_backend("eager"):
                theirs = QuantizedTensor.from_float(
                    x, layout.__name__, **({"scale": scale} if scale is not None else {})
                )
            assert torch.equal(got._qdata, theirs._qdata), name
            assert torch.equal(got.dequantize(), theirs.dequantize()), name
        # no CPU kernel: "format" falls back to today's dequantised matmul here, bit for bit
        x = _x(layer, torch.float32, i)
        assert torch.equal(layer(x), F.linear(x, layer.compute_weight(torch.float32, CPU)))


def test_loras_add_beside_the_in_format_matmul_and_dora_dequantises(sd, tmp_path):
    """A LoRA (or a full delta) on an fp8 layer in format is added beside its matmul as x delta^T, never
    folded into the fp8 weight; removing it restores the layer exactly. DoRA renormalises the whole weight,
    so a layer holding one dequantises, patches and multiplies."""
    path = tmp_path / "fp8.safetensors"
    write_quantised(sd, path, "float8_e4m3fn")
    model = load_transformer(path, variant="distilled", quant_compute="format")
    name, layer = _layers(model)[0]
    x, g = _x(layer, torch.float32), torch.Generator().manual_seed(5)
    base = layer(x)
    up, down = torch.randn(layer.out_features, 4, generator=g), torch.randn(4, layer.in_features, generator=g)
    diff = torch.randn(128, layer.in_features, generator=g) * 0.01
    layer.add_patch("lora", LowRankPatch(up, down, strength=0.5))
    layer.add_patch("full", FullDeltaPatch(diff, strength=2.0, rows=(128, 128)))
    got = layer(x)
    delta = torch.zeros(layer.out_features, layer.in_features)
    delta += 0.5 * up @ down
    delta[128:256] += 2.0 * diff
    torch.testing.assert_close(got, base + x @ delta.T, rtol=1e-5, atol=1e-5)
    assert _relative(got, F.linear(x, layer.compute_weight(torch.float32, CPU))) > 1e-4  # still in format
    magnitude = torch.rand(layer.out_features, 1, generator=g) + 0.5
    layer.add_patch("dora", DoRAPatch(LowRankPatch(up * 0.01, down), magnitude))
    assert torch.equal(layer(x), F.linear(x, layer.compute_weight(torch.float32, CPU)))
    for key in ("lora", "full", "dora"):
        layer.remove_patch(key)
    assert torch.equal(layer(x), base)


def test_dequantize_gives_todays_model_output_bit_for_bit(sd, tmp_path):
    """On a CPU auto dequantises fp8 and nvfp4 (no capable backend) exactly as ``dequantize`` does: the whole
    DiT's output is the same bit for bit, and ``format`` changes it (its fp8 matmuls ran)."""
    path = tmp_path / "fp8.safetensors"
    write_quantised(sd, path, "float8_e4m3fn")
    outputs = {}
    for mode in ("auto", "dequantize", "format"):
        model = load_transformer(path, variant="distilled", quant_compute=mode)
        net = model.transformer
        g = torch.Generator().manual_seed(0)
        img = torch.randn(1, 16, net.config.in_channels, generator=g)
        txt = torch.randn(1, 5, net.config.context_in_dim, generator=g)
        img_ids = torch.zeros(16, 4, dtype=torch.long)
        img_ids[:, 1], img_ids[:, 2] = torch.arange(16) // 4, torch.arange(16) % 4
        outputs[mode] = net(img, img_ids, torch.tensor([0.7]), txt)
    assert torch.equal(outputs["auto"], outputs["dequantize"])
    assert 0 < _relative(outputs["format"], outputs["dequantize"]) < 0.2
