"""Quantised checkpoints against comfy-kitchen, the package that holds ComfyUI's quantisation kernels.

Each file is loaded by ``load_transformer`` and every quantised layer's weight (``Linear.compute_weight`` in
float32 and bfloat16) must equal comfy-kitchen's CPU (eager backend) dequantisation of the tensors stored in
the file, read back with safetensors and handed to its layout classes as ComfyUI does
(``QuantizedTensor(qdata, layout, params).dequantize()``). Both sides cast to the compute dtype and multiply
by the same scales in the same order, so equality is exact unless a test says otherwise.

Files come from the suite's writers (``quant_files``) and, separately, from comfy-kitchen's own quantisers,
so both the dequantisation formulas and the stored layouts (nibble order, swizzled block scales, scale
shapes and dtypes) are checked against an implementation that is not ours.
"""

from __future__ import annotations

from importlib.metadata import version

import pytest
import torch

ck = pytest.importorskip(
    "comfy_kitchen",
    reason="comfy-kitchen is not installed (pip install comfy-kitchen, part of the test extra): the check of "
    "our dequantisation against ComfyUI's kernels needs it",
)

from comfy_kitchen.tensor import (  # noqa: E402
    QuantizedTensor,
    TensorCoreFP8Layout,
    TensorCoreMXFP8Layout,
    TensorCoreNVFP4Layout,
    TensorWiseINT8Layout,
)
from quant_files import (  # noqa: E402
    marker,
    quantised_layers,
    swizzled_index,
    write_quantised,
    write_with_kitchen,
)
from safetensors import safe_open  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tiny_dit import bfl_state_dict, make_diffusers_dit  # noqa: E402

from flux2_core import load_transformer  # noqa: E402
from flux2_core.ops import PLAIN, linears  # noqa: E402

CPU = torch.device("cpu")
DTYPES = (torch.float32, torch.bfloat16)
FP8 = ("float8_e4m3fn", "float8_e5m2")
# comfy-kitchen's dequantisation op for each format (the eager backend must list it for a CPU path)
KERNEL = {
    "float8_e4m3fn": "dequantize_per_tensor_fp8",
    "float8_e5m2": "dequantize_per_tensor_fp8",
    "int8_tensorwise": "dequantize_int8_simple_dtype",
    "int8_convrot": "dequantize_int8_convrot_weight_dtype",
    "nvfp4": "dequantize_nvfp4",
    "mxfp8": "dequantize_mxfp8",
}


@pytest.fixture(scope="module")
def sd():
    return bfl_state_dict(make_diffusers_dit(seed=3))


def _needs_cpu_kernel(fmt: str, convrot: int = 0) -> None:
    name = KERNEL["int8_convrot" if convrot else fmt]
    if name not in ck.list_backends()["eager"]["capabilities"]:
        pytest.skip(
            f"comfy-kitchen {version('comfy-kitchen')} has no CPU dequantisation for {fmt}"
            f"{' + ConvRot' if convrot else ''} ({name}): only its GPU kernels"
        )


def _stored(path, prefix: str = "") -> dict[str, dict[str, torch.Tensor]]:
    """{layer: {role: tensor}} of the quantised layers, as stored in the file (legacy names normalised)."""
    roles = {
        "weight_scale_2": "weight_scale_2",
        "weight_scale": "weight_scale",
        "scale_weight": "weight_scale",
    }
    out: dict[str, dict[str, torch.Tensor]] = {}
    with safe_open(str(path), "pt") as f:
        for key in f.keys():
            layer, _, role = key.removeprefix(prefix).rpartition(".")
            if layer and role in roles:
                out.setdefault(layer, {})[roles[role]] = f.get_tensor(key)
        for layer, tensors in out.items():
            tensors["weight"] = f.get_tensor(prefix + layer + ".weight")
    return out


def _kitchen(fmt: str, t: dict[str, torch.Tensor], dtype: torch.dtype, convrot: int = 0) -> torch.Tensor:
    """comfy-kitchen's dequantisation of one stored layer, through the layout class ComfyUI builds for it."""
    q = t["weight"]
    rows = q.shape[0]
    if fmt in FP8:  # TensorCoreFP8Layout -> dequantize_per_tensor_fp8: q.to(dtype) * scale.to(dtype)
        scale = t.get("weight_scale", torch.ones(()))
        layout, params = "TensorCoreFP8Layout", TensorCoreFP8Layout.Params(scale, dtype, tuple(q.shape))
    elif fmt == "int8_tensorwise":  # TensorWiseINT8Layout -> dequantize_int8_{simple,convrot_weight}_dtype
        scale = t["weight_scale"]
        scale = scale.reshape(rows, 1) if scale.numel() == rows else scale.reshape(())  # one per output row
        params = TensorWiseINT8Layout.Params(
            scale, dtype, tuple(q.shape), convrot=bool(convrot), convrot_groupsize=convrot or 256
        )
        layout = "TensorWiseINT8Layout"
    elif fmt == "nvfp4":  # TensorCoreNVFP4Layout -> dequantize_nvfp4 (high nibble first, swizzled scales)
        params = TensorCoreNVFP4Layout.Params(
            t["weight_scale_2"], dtype, (rows, q.shape[1] * 2), block_scale=t["weight_scale"]
        )
        layout = "TensorCoreNVFP4Layout"
    else:  # TensorCoreMXFP8Layout -> dequantize_mxfp8 (E8M0 exponents, swizzled; E = 0 reads as 0)
        scale = t["weight_scale"].view(torch.uint8).view(torch.float8_e8m0fnu)
        layout, params = "TensorCoreMXFP8Layout", TensorCoreMXFP8Layout.Params(scale, dtype, tuple(q.shape))
    with ck.use_backend("eager"):
        return QuantizedTensor(q, layout, params).dequantize()


def _assert_matches_kitchen(path, fmt: str, layers: list[str], prefix: str = "", convrot: int = 0) -> None:
    ours = dict(linears(load_transformer(path, variant="distilled").transformer))
    stored = _stored(path, prefix)
    assert sorted(stored) == sorted(layers)
    for layer in layers:
        assert ours[layer].source is not PLAIN, f"{layer} was not loaded as a quantised layer"
        for dtype in DTYPES:
            theirs = _kitchen(fmt, stored[layer], dtype, convrot)
            assert theirs.dtype == dtype and theirs.abs().sum() > 0, layer
            got = ours[layer].compute_weight(dtype, CPU)
            assert torch.equal(got, theirs), f"{layer} ({dtype}): max diff {(got - theirs).abs().max()}"


FORMS = [
    ("float8_e4m3fn", "tensor", {}),
    ("float8_e4m3fn", "header", {"prefix": "model.diffusion_model."}),
    ("float8_e4m3fn", "legacy", {}),
    ("float8_e4m3fn", "plain", {}),
    ("float8_e5m2", "tensor", {}),
    ("int8_tensorwise", "tensor", {"per_row": False}),
    ("int8_tensorwise", "tensor", {"per_row": True}),
    ("int8_tensorwise", "tensor", {"per_row": True, "flat_scale": True}),
    ("int8_tensorwise", "tensor", {"convrot": 16}),
    ("int8_tensorwise", "header", {"convrot": 4, "nested": True}),
    ("nvfp4", "tensor", {}),
    ("nvfp4", "header", {"prefix": "model.diffusion_model."}),
]


@pytest.mark.parametrize(("fmt", "form", "options"), FORMS, ids=[f"{f}-{g}-{o}" for f, g, o in FORMS])
def test_suite_written_files_dequantise_like_comfy_kitchen(sd, tmp_path, fmt, form, options):
    """fp8 (``.comfy_quant``, header, legacy ``scaled_fp8``, unscaled), int8 per tensor / per row / ConvRot
    and nvfp4, compared with ``QuantizedTensor.dequantize`` of comfy-kitchen's TensorCoreFP8Layout
    (``dequantize_per_tensor_fp8``), TensorWiseINT8Layout (``dequantize_int8_simple_dtype``,
    ``dequantize_int8_convrot_weight_dtype``) and TensorCoreNVFP4Layout (``dequantize_nvfp4``)."""
    options = dict(options)
    prefix = options.pop("prefix", "")
    _needs_cpu_kernel(fmt, options.get("convrot", 0))
    path = tmp_path / f"{fmt}-{form}.safetensors"
    expected = write_quantised(sd, path, fmt, form, prefix=prefix, **options)
    layers = [key[: -len(".weight")] for key in expected]
    if form == "plain":  # no scale tensors to find: every 2-D quantised weight, scale 1
        with safe_open(str(path), "pt") as f:
            stored = {layer: {"weight": f.get_tensor(layer + ".weight")} for layer in layers}
        ours = dict(linears(load_transformer(path, variant="distilled").transformer))
        for layer in layers:
            for dtype in DTYPES:
                got = ours[layer].compute_weight(dtype, CPU)
                assert torch.equal(got, _kitchen(fmt, stored[layer], dtype)), layer
        return
    _assert_matches_kitchen(path, fmt, layers, prefix, options.get("convrot", 0))


def test_rowwise_fp8_scales_match_comfy_kitchen_row_by_row(sd, tmp_path):
    """fp8 with one ``weight_scale`` per output row. comfy-kitchen has no row-wise fp8 layout, so each row is
    compared with its per-tensor ``dequantize_per_tensor_fp8`` (TensorCoreFP8Layout) under that row's scale:
    a scale applied along the wrong axis, or rows and scales paired wrongly, shows up here."""
    _needs_cpu_kernel("float8_e4m3fn")
    out, layers = {}, quantised_layers(sd)
    for key, tensor in sd.items():
        layer = key[: -len(".weight")]
        if layer not in layers:
            out[key] = tensor.to(torch.bfloat16)
            continue
        scale = tensor.abs().amax(1) / 448  # [rows], distinct per row
        out[key] = (tensor / scale[:, None]).to(torch.float8_e4m3fn)
        out[layer + ".weight_scale"] = scale
        out[layer + ".comfy_quant"] = marker({"format": "float8_e4m3fn"})
    path = tmp_path / "fp8-rowwise.safetensors"
    save_file(out, str(path))
    ours = dict(linears(load_transformer(path, variant="distilled").transformer))
    stored = _stored(path)
    for layer in layers:
        q, scale = stored[layer]["weight"], stored[layer]["weight_scale"]
        assert scale.unique().numel() > 1, layer
        for dtype in DTYPES:
            theirs = torch.cat([_kitchen("float8_e4m3fn", {"weight": q[i : i + 1], "weight_scale": s}, dtype)
                                for i, s in enumerate(scale)])  # fmt: skip
            assert torch.equal(ours[layer].compute_weight(dtype, CPU), theirs), f"{layer} ({dtype})"


def test_mxfp8_file_dequantises_like_comfy_kitchen(sd, tmp_path):
    """mxfp8: float8 values, one E8M0 exponent per 32 inputs in the swizzled 128x4-tile layout (some E = 0),
    compared with comfy-kitchen's TensorCoreMXFP8Layout (``dequantize_mxfp8``)."""
    _needs_cpu_kernel("mxfp8")
    g = torch.Generator().manual_seed(5)
    out, layers = {}, quantised_layers(sd)
    for key, tensor in sd.items():
        layer = key[: -len(".weight")]
        if layer not in layers:
            out[key] = tensor.to(torch.bfloat16)
            continue
        rows, cols = tensor.shape
        exps = torch.randint(118, 126, (rows, cols // 32), generator=g, dtype=torch.uint8)
        exps[torch.rand(exps.shape, generator=g) < 0.1] = 0  # E = 0: the block reads as zero
        r, k = torch.meshgrid(torch.arange(rows), torch.arange(cols // 32), indexing="ij")
        flat = torch.zeros(-(-rows // 128) * 128 * 4, dtype=torch.uint8)
        flat[swizzled_index(r, k, 4).flatten()] = exps.flatten()
        out[key] = (torch.randn(rows, cols, generator=g) * 100).to(torch.float8_e4m3fn)
        out[layer + ".weight_scale"] = flat.reshape(-1, 4)
        out[layer + ".comfy_quant"] = marker({"format": "mxfp8"})
    path = tmp_path / "mxfp8.safetensors"
    save_file(out, str(path))
    _assert_matches_kitchen(path, "mxfp8", layers)


KITCHEN_QUANTISED = [
    ("float8_e4m3fn", TensorCoreFP8Layout, {}),
    ("int8_tensorwise", TensorWiseINT8Layout, {}),
    ("int8_tensorwise", TensorWiseINT8Layout, {"per_channel": True}),
    (
        "int8_tensorwise",
        TensorWiseINT8Layout,
        {"per_channel": True, "convrot": True, "convrot_groupsize": 16},
    ),
    ("nvfp4", TensorCoreNVFP4Layout, {}),
    ("mxfp8", TensorCoreMXFP8Layout, {}),
]


@pytest.mark.parametrize(
    ("fmt", "layout", "kwargs"), KITCHEN_QUANTISED, ids=[f"{f}-{k}" for f, _, k in KITCHEN_QUANTISED]
)
def test_files_quantised_by_comfy_kitchen_load_to_its_dequantisation(sd, tmp_path, fmt, layout, kwargs):
    """Layers quantised by comfy-kitchen's own ``<Layout>.quantize`` and saved under the names of its
    ``state_dict_tensors`` (``weight``, ``weight_scale``, ``weight_scale_2``) with a ``.comfy_quant`` marker,
    as ComfyUI writes them: the loader takes comfy-kitchen's scale shapes and dtypes (per-row int8 scales
    [rows, 1], E8M0 mxfp8 scales, swizzled nvfp4 scales) and reproduces its ``QuantizedTensor.dequantize``."""
    convrot = kwargs.get("convrot_groupsize", 0)
    _needs_cpu_kernel(fmt, convrot)
    entry = {"format": fmt} | ({"convrot": True, "convrot_groupsize": convrot} if convrot else {})
    path = tmp_path / f"kitchen-{fmt}.safetensors"
    layers = write_with_kitchen(sd, path, layout, entry, is_weight=True, **kwargs)
    _assert_matches_kitchen(path, fmt, layers, convrot=convrot)
