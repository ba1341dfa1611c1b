"""W4A8 files of every model the pack loads beside the klein DiT: the Qwen3 and Mistral text encoders, the
FLUX.1 Fill DiT and the Fun ControlNet (the klein / dev DiT: test_quant_w4.py).

Each file is written by comfy-kitchen's own W4A8 quantiser (``AsymW4A8Int8Layout.quantize``, eager backend)
on the model's linears whose input width it takes (a multiple of 16); every quantised layer we load must
equal comfy-kitchen's dequantisation of it bit for bit, and the model's output must equal a float32 twin
holding those dequantised weights (``quant_compute="dequantize"``: the same maths, so within float rounding;
in format on a CPU in float32 W4A8 quantises its activations to int8, as native does).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip(
    "comfy_kitchen",
    reason="comfy-kitchen is not installed (pip install comfy-kitchen, part of the test extra): its own "
    "quantiser writes the W4A8 files and its layout is the reference",
)

from comfy_kitchen.tensor import AsymW4A8Int8Layout  # noqa: E402
from quant_files import write_with_kitchen  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from tiny_control import control_state_dict  # noqa: E402
from tiny_dit import bfl_state_dict, make_diffusers_dit  # noqa: E402
from tiny_flux1 import bfl_fill_state_dict, make_diffusers_fill_dit, save_tensors  # noqa: E402
from tiny_mistral import TINY_TEXT_HEAD_128, comfy_tensors, make_tiny_mistral3, v7_tekken_json  # noqa: E402
from tiny_text import make_tiny_qwen3, model_tensors  # noqa: E402

from flux2_core import SampleRequest, SampleSettings, load_transformer, sample  # noqa: E402
from flux2_core.dit.call import CallExtras  # noqa: E402
from flux2_core.dit.control import CONTROL_CHANNELS, load_controlnet  # noqa: E402
from flux2_core.flux1 import load_fill_transformer  # noqa: E402
from flux2_core.flux1.transformer import image_ids  # noqa: E402
from flux2_core.ops import PLAIN, linears  # noqa: E402
from flux2_core.steering.control_image import AppliedControl  # noqa: E402
from flux2_core.text.encoder import load_text_encoder, text_encoder_from_state_dict  # noqa: E402

CPU = torch.device("cpu")
W4A8 = {"format": "asym_w4a8_int8", "group_size": 16, "convrot_groupsize": 16}


def _write(tensors: dict, path, pick) -> tuple[list[str], dict[str, torch.Tensor]]:
    """W4A8 on the 2-D weights ``pick`` chooses whose input width is a multiple of 16; the rest float32."""
    layers = [
        k[: -len(".weight")]
        for k, v in tensors.items()
        if k.endswith(".weight") and v.ndim == 2 and v.shape[1] % 16 == 0 and pick(k)
    ]
    held: dict[str, torch.Tensor] = {}
    write_with_kitchen(
        tensors, path, AsymW4A8Int8Layout, W4A8, layers=layers, held=held, high=torch.float32,
        group_size=16, convrot_groupsize=16,
    )  # fmt: skip
    return layers, held


def _check_layers(module, layers: list[str], held: dict) -> None:
    found = {q.source.layer.keys["weight"]: q for _, q in linears(module) if q.source is not PLAIN}
    # every linear the model runs that the file quantised (an encoder skips its last layers)
    ran = {layer.source.layer.keys["weight"] for _, layer in linears(module) if layer.source is not PLAIN}
    assert found and ran <= {k + ".weight" for k in layers}
    for key, layer in found.items():
        assert layer.weight.dtype == torch.int8, key  # kept packed
        assert torch.equal(layer.compute_weight(torch.float32, CPU), held[key]), key


@pytest.mark.parametrize("kind", ["qwen3", "mistral"])
def test_w4a8_text_encoders_equal_comfy_kitchen_and_their_float_twin(tmp_path, kind):
    if kind == "qwen3":
        tensors, name = model_tensors(make_tiny_qwen3(seed=6)), "qwen_3_4b_w4a8.safetensors"
    else:
        heads = {k: TINY_TEXT_HEAD_128[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")}
        tensors = dict(comfy_tensors(make_tiny_mistral3(seed=1, **heads)))
        tensors["tekken_model"] = torch.frombuffer(bytearray(v7_tekken_json()), dtype=torch.uint8)
        name = "mistral_3_small_flux2_w4a8.safetensors"
    layers, held = _write(tensors, tmp_path / name, lambda k: k.startswith("model.layers."))
    encoder = load_text_encoder(tmp_path / name, quant_compute="dequantize")
    _check_layers(encoder.model, layers, held)
    want = text_encoder_from_state_dict(held)
    prompts = ["a red fox"]
    torch.testing.assert_close(encoder.encode(prompts), want.encode(prompts), rtol=1e-5, atol=1e-5)


def _fill_forward(model):
    g = torch.Generator().manual_seed(0)
    x, ctx = torch.randn(2, 24, 384, generator=g), torch.randn(2, 7, 32, generator=g)
    pooled = torch.randn(2, 128, generator=g)
    t, guidance = torch.tensor([0.7, 0.3]), torch.tensor([30.0, 30.0])
    with torch.no_grad():
        return model.transformer(x, image_ids(4, 6), t, ctx, CallExtras(pooled=pooled, guidance=guidance))


def test_a_w4a8_fill_dit_equals_comfy_kitchen_and_its_float_twin(tmp_path):
    sd = bfl_fill_state_dict(make_diffusers_fill_dit(seed=1))
    path = tmp_path / "flux1-fill-dev-w4a8.safetensors"
    layers, held = _write(sd, path, lambda k: "blocks." in k)
    model = load_fill_transformer(path, quant_compute="dequantize")
    _check_layers(model.transformer, layers, held)
    twin = load_fill_transformer(save_tensors(held, tmp_path / "twin.safetensors"))
    got, want = _fill_forward(model), _fill_forward(twin)
    assert (got - want).abs().max().item() < 1e-5


def test_a_w4a8_control_net_equals_comfy_kitchen_and_steers_as_its_float_twin(tmp_path):
    dit = make_diffusers_dit(
        num_layers=4, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=24, axes_dims_rope=(4, 4, 4, 4), guidance_embeds=True, seed=3,
    )  # fmt: skip
    save_file({k: v.contiguous() for k, v in bfl_state_dict(dit).items()}, str(tmp_path / "dev.safetensors"))
    control = control_state_dict(32, 16, 96, 2, seed=4)
    path = tmp_path / "FLUX.2-dev-Fun-Controlnet-Union-2602-w4a8.safetensors"
    layers, held = _write(control, path, lambda k: k.startswith("control_transformer_blocks"))
    net = load_controlnet(path, quant_compute="dequantize")
    _check_layers(net, [k for k in layers if not k.endswith(("to_q", "to_k", "to_v"))], held)
    save_file(held, str(tmp_path / "control-twin.safetensors"))
    twin = load_controlnet(tmp_path / "control-twin.safetensors")
    model = load_transformer(tmp_path / "dev.safetensors", variant="dev")
    positive = torch.randn(1, 6, 24, generator=torch.Generator().manual_seed(1))
    context = torch.randn(1, 24, CONTROL_CHANNELS, generator=torch.Generator().manual_seed(0))
    settings = SampleSettings(96, 64, 3, 4.0, 5, 1)
    ours, theirs, plain = (
        sample(SampleRequest(model, positive, settings, control=c))
        for c in (AppliedControl(net, context, 0.8), AppliedControl(twin, context, 0.8), None)
    )
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert (ours - plain).abs().mean() > 1e-2
