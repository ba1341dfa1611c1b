"""LoRAs on quantised bases and through sampling: the delta lands on the dequantised weight at compute time,
removal is exact, and models that share a base share its weights; for klein and for FLUX.2 [dev] (whose
guidance embedder and final-layer modulation take a LoRA too)."""

from __future__ import annotations

import pytest
import torch
from quant_files import quantised_layers, write_gguf, write_quantised
from safetensors.torch import save_file
from tiny_dit import bfl_state_dict, make_diffusers_dit, write_bfl_file

from flux2_core import SampleRequest, SampleSettings, load_transformer, sample
from flux2_core.lora import prepare_lora, read_lora
from flux2_core.ops import linears

CPU = torch.device("cpu")
KLEIN_TARGETS = ("double_blocks.0.img_attn.qkv", "single_blocks.1.linear1", "double_blocks.1.txt_mlp.2")
DEV_TARGETS = (*KLEIN_TARGETS, "guidance_in.out_layer", "final_layer.adaLN_modulation.1")


def _lora_file(sd, path, targets, rank=4, alpha=2.0, seed=0):
    """ai-toolkit layout; returns {layer: delta at strength 1} computed here by hand."""
    g = torch.Generator().manual_seed(seed)
    tensors, deltas = {}, {}
    for layer in targets:
        out, inp = sd[layer + ".weight"].shape
        down, up = torch.randn(rank, inp, generator=g) * 0.3, torch.randn(out, rank, generator=g) * 0.3
        tensors[f"diffusion_model.{layer}.lora_A.weight"] = down
        tensors[f"diffusion_model.{layer}.lora_B.weight"] = up
        tensors[f"diffusion_model.{layer}.alpha"] = torch.tensor(alpha)
        deltas[layer] = alpha / rank * (up @ down)
    save_file(tensors, str(path))
    return deltas


@pytest.fixture(scope="module", params=["klein", "dev"])
def base(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bases")
    dev = request.param == "dev"
    dit = make_diffusers_dit(
        seed=11,
        attention_head_dim=128,
        axes_dims_rope=(32,) * 4,
        joint_attention_dim=256,
        guidance_embeds=dev,
    )
    sd = bfl_state_dict(dit)
    files = {"float": write_bfl_file(dit, tmp / "float.safetensors")}
    files["fp8"] = tmp / "fp8.safetensors"
    write_quantised(sd, files["fp8"], "float8_e4m3fn")
    files["nvfp4"] = tmp / "nvfp4.safetensors"
    write_quantised(sd, files["nvfp4"], "nvfp4", "header")
    files["int8"] = tmp / "int8.safetensors"
    write_quantised(sd, files["int8"], "int8_tensorwise", convrot=256)
    files["gguf"] = tmp / "q8.gguf"
    write_gguf(sd, files["gguf"], "flux", {k + ".weight": "Q8_0" for k in quantised_layers(sd)})
    lora = tmp / "lora.safetensors"
    return sd, files, lora, _lora_file(sd, lora, DEV_TARGETS if dev else KLEIN_TARGETS)


def _load(path):
    """The variant from the file (dev by its guidance embedder); klein's tiny files are read as distilled."""
    model = load_transformer(path)
    return model if model.variant.name == "dev" else load_transformer(path, variant="distilled")


@pytest.mark.parametrize("kind", ["float", "fp8", "nvfp4", "int8", "gguf"])
def test_lora_lands_on_the_dequantised_weight_and_comes_off_exactly(base, kind):
    sd, files, lora_path, deltas = base
    model = _load(files[kind])
    layers = dict(linears(model.transformer))
    before = {name: layers[name].compute_weight(torch.float32, CPU) for name in deltas}
    stored = {name: layers[name].weight.clone() for name in deltas}
    lora = prepare_lora(read_lora(lora_path), model.transformer, strength=0.7)
    from flux2_core.lora import patched

    with patched(model.transformer, "diffusion_model", [lora]):
        for name in deltas:
            after = layers[name].compute_weight(torch.float32, CPU)
            torch.testing.assert_close(after, before[name] + 0.7 * deltas[name], rtol=1e-6, atol=1e-6)
    for name in deltas:  # off again: the same weight, and the stored (quantised) tensor never touched
        assert torch.equal(layers[name].compute_weight(torch.float32, CPU), before[name])
        assert torch.equal(layers[name].weight, stored[name]) and not layers[name].patches


def test_the_same_lora_moves_every_base_by_the_same_delta(base):
    sd, files, lora_path, _ = base
    settings = SampleSettings(64, 64, 2, 1.0, seed=3)
    text = torch.randn(1, 8, 256, generator=torch.Generator().manual_seed(1))
    effect = {}
    for kind in ("float", "fp8", "gguf"):
        model = _load(files[kind])
        plain = sample(SampleRequest(model, text, settings))
        lora = prepare_lora(read_lora(lora_path), model.transformer)
        with_lora = sample(SampleRequest(model.with_lora(lora), text, settings))
        assert torch.equal(
            sample(SampleRequest(model, text, settings)), plain
        )  # the base handle is untouched afterwards
        effect[kind] = with_lora - plain
    size = effect["float"].norm()
    assert size > 0.05 * sample(SampleRequest(_load(files["float"]), text, settings)).norm()
    for kind in ("fp8", "gguf"):
        assert ((effect[kind] - effect["float"]).norm() / size).item() < 0.1, kind


def test_models_with_and_without_a_lora_share_the_base_weights(base):
    _, files, lora_path, _ = base
    model = _load(files["fp8"])
    lora = prepare_lora(read_lora(lora_path), model.transformer)
    other = model.with_lora(lora)
    assert other.transformer is model.transformer and model.loras == () and other.loras == (lora,)
    held = {id(t) for t in model.transformer.parameters()}
    assert held == {id(t) for t in other.transformer.parameters()}
