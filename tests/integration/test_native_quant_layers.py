"""Quantised layers against native ComfyUI's own loader, layer by layer, on the same files.

A child process of ComfyUI's Python loads each file with ``comfy.sd.load_diffusion_model`` (native) and with
our ``load_transformer``, then compares, for every quantised layer, native's dequantised weight
(``QuantizedTensor.dequantize()``) with ours, and the layer outputs on one random input (int8: native's
W8A8 matmul against ours). Everything must agree exactly on the CPU in float32.

Then in format on both sides: native started with ``--supports-fp8-compute`` (its fp8 layers multiply in
fp8 through comfy-kitchen, here its eager backend) against ours with ``quant_compute="format"``, and
convrot_w4a4 (always in format on both): every layer's output the same bit for bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from comfy_server import REPO

CHILD = r"""
import json, sys
sys.path[:0] = json.loads(sys.stdin.readline())
options = json.loads(sys.stdin.readline())
sys.argv = ["comfyui", "--cpu", *options["argv"]]
import comfy.options
comfy.options.enable_args_parsing()
import torch
import comfy.sd
from flux2_core import load_transformer
from flux2_core.ops import PLAIN, linears

results = {}
for path in json.loads(sys.stdin.readline()):
    native = comfy.sd.load_diffusion_model(path).model.diffusion_model
    ours = load_transformer(path, variant="distilled", quant_compute=options["quant_compute"])
    ours = dict(linears(ours.transformer))
    worst_weight, worst_out, count = 0.0, 0.0, 0
    for name, layer in ours.items():
        if layer.source is PLAIN:
            continue
        count += 1
        theirs = native.get_submodule(name)
        want = theirs.weight.dequantize().float()
        ours_weight = layer.compute_weight(torch.float32, torch.device("cpu"))
        worst_weight = max(worst_weight, (ours_weight - want).abs().max().item())
        x = torch.randn(2, 24, layer.in_features, generator=torch.Generator().manual_seed(count))
        with torch.no_grad():
            worst_out = max(worst_out, (layer(x) - theirs(x)).abs().max().item())
    results[path] = {"layers": count, "weight": worst_weight, "output": worst_out}
print("RESULT " + json.dumps(results))
"""


def test_quantised_layers_equal_native_comfyui(tmp_path):
    from quant_files import quantised_layers, write_quantised
    from tiny_dit import bfl_state_dict, make_diffusers_dit

    sd = bfl_state_dict(
        make_diffusers_dit(9, attention_head_dim=128, axes_dims_rope=(32,) * 4, joint_attention_dim=96)
    )
    cases = {
        "fp8-tensor": ("float8_e4m3fn", "tensor", {}),
        "fp8-legacy": ("float8_e4m3fn", "legacy", {}),
        "e5m2": ("float8_e5m2", "tensor", {}),
        "nvfp4-header": ("nvfp4", "header", {"prefix": "model.diffusion_model."}),
        "int8-per-tensor": ("int8_tensorwise", "tensor", {"per_row": False}),
        "int8-convrot-nested": ("int8_tensorwise", "header", {"convrot": 256, "nested": True}),
    }
    paths = []
    for name, (fmt, form, options) in cases.items():
        options = dict(options)
        path = tmp_path / f"{name}.safetensors"
        write_quantised(sd, path, fmt, form, prefix=options.pop("prefix", ""), **options)
        paths.append(str(path))
    results = _compare(paths, [], "auto")
    for path, result in results.items():
        print(f"\n{os.path.basename(path)}: {result}")  # noqa: T201
        assert result["layers"] == len(quantised_layers(sd)), result
        assert result["weight"] == 0.0 and result["output"] == 0.0, (path, result)


def _compare(paths: list[str], argv: list[str], quant_compute: str) -> dict:
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    options = {"argv": argv, "quant_compute": quant_compute}
    stdin = "\n".join(json.dumps(v) for v in ([os.environ["COMFYUI_PATH"], str(REPO)], options, paths)) + "\n"
    run = subprocess.run([python, "-c", CHILD], input=stdin, capture_output=True, text=True, timeout=300)
    lines = [line for line in run.stdout.splitlines() if line.startswith("RESULT ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT ") :])


def test_in_format_layers_equal_native_comfyuis_in_format_layers(tmp_path):
    """fp8 multiplied in fp8 (activations quantised with scale 1, torch._scaled_mm) and convrot_w4a4 through
    its layout's int4 linear: ours and native give the same output bit for bit, on the same files."""
    from quant_files import write_quantised, write_with_kitchen
    from tiny_dit import bfl_state_dict, make_diffusers_dit

    pytest.importorskip("comfy_kitchen", reason="the convrot_w4a4 file is written by comfy-kitchen")
    from comfy_kitchen.tensor import TensorCoreConvRotW4A4Layout as W4A4

    sd = bfl_state_dict(
        make_diffusers_dit(9, attention_head_dim=128, axes_dims_rope=(32,) * 4, joint_attention_dim=96)
    )
    fp8 = tmp_path / "fp8.safetensors"
    write_quantised(sd, fp8, "float8_e4m3fn")
    w4a4 = tmp_path / "w4a4.safetensors"
    entry = {"format": "convrot_w4a4", "convrot_groupsize": 64}
    layers = write_with_kitchen(sd, w4a4, W4A4, entry, convrot_groupsize=64)
    results = _compare([str(fp8), str(w4a4)], ["--supports-fp8-compute"], "format")
    for path, result in results.items():
        print(f"\n{os.path.basename(path)} in format: {result}")  # noqa: T201
        assert result["layers"] == len(layers), result
        assert result["weight"] == 0.0 and result["output"] == 0.0, (path, result)
