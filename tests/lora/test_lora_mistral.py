"""Text-encoder LoRAs on FLUX.2 [dev]'s Mistral, in ComfyUI's layouts, through the LoRA's text-encoder part.

ComfyUI names the weights of dev's text encoder ``mistral3_24b.transformer.model.layers.N.<module>`` and
reads three spellings of them from a LoRA file (``comfy/lora.py::model_lora_keys_clip``):
``text_encoders.mistral3_24b.transformer.model.layers.N.<module>``, the same without the model's name
(``text_encoders.transformer.model.``) and kohya's ``lora_te_layers_N_<module with _>``. The change is
``strength * alpha/rank * B @ A`` on the weight, as for the DiT. Here the tiny Mistral (ComfyUI's single
file: 30 layers kept, its Tekken tokenizer inside) is patched through ``TextEncoder.with_lora`` (what the
LoRA Loader's ``text_encoder`` output carries) and compared with the deltas merged by hand: the weights,
and the encoder's output against a file holding the merged weights.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_mistral import TINY_TEXT_HEAD_128, comfy_tensors, make_tiny_mistral3, tekken_tensor, v7_tekken_json

from flux2_core.dit.files import load_transformer
from flux2_core.errors import Flux2Error
from flux2_core.lora import prepare_lora, read_lora
from flux2_core.text.encoder import load_text_encoder

S = 0.7  # the strength
RANK = 4
CPU = torch.device("cpu")
PROMPTS = ["a red kite above a green hill", "an empty room"]
HEADS = {k: TINY_TEXT_HEAD_128[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")}
# (file key, our layer, alpha or None, suffixes): every ComfyUI spelling, with and without alpha
MODULES = [
    ("text_encoders.mistral3_24b.transformer.model.layers.0.self_attn.q_proj", "layers.0.self_attn.q_proj",
     2.0, (".lora_B.weight", ".lora_A.weight")),
    ("text_encoders.transformer.model.layers.4.mlp.down_proj", "layers.4.mlp.down_proj",
     None, (".lora_up.weight", ".lora_down.weight")),
    ("lora_te_layers_2_self_attn_v_proj", "layers.2.self_attn.v_proj",
     8.0, (".lora_up.weight", ".lora_down.weight")),
    ("lora_te_layers_9_mlp_gate_proj", "layers.9.mlp.gate_proj",
     None, (".lora_up.weight", ".lora_down.weight")),
    ("text_encoders.mistral3_24b.transformer.model.layers.29.self_attn.o_proj", "layers.29.self_attn.o_proj",
     1.0, (".lora_B.weight", ".lora_A.weight")),
]  # fmt: skip
UNUSED = "lora_te_layers_31_mlp_up_proj"  # layer 32 of the file: the encoder never runs it


@pytest.fixture(scope="module")
def mistral():
    return make_tiny_mistral3(seed=702, **HEADS)


@pytest.fixture(scope="module")
def encoder(mistral, tmp_path_factory):
    path = tmp_path_factory.mktemp("te") / "mistral_3_small_flux2_bf16.safetensors"
    tensors = comfy_tensors(mistral, layers=32, lm_head=False)
    tensors["tekken_model"] = tekken_tensor(v7_tekken_json())
    save_file(tensors, str(path))
    return load_text_encoder(path)


@pytest.fixture(scope="module")
def dev(tmp_path_factory):
    dit = make_diffusers_dit(seed=13, guidance_embeds=True)
    return load_transformer(write_bfl_file(dit, tmp_path_factory.mktemp("dev") / "flux2-dev.safetensors"))


def _lora(encoder) -> tuple[dict, dict]:
    """The file's tensors, and {our layer: the change at strength 1} merged by hand."""
    layers = dict(encoder.model.named_modules())
    g = torch.Generator().manual_seed(5)
    tensors, deltas = {}, {}
    for key, layer, alpha, (up_end, down_end) in [*MODULES, (UNUSED, None, None, MODULES[1][3])]:
        rows, cols = (layers[layer].out_features, layers[layer].in_features) if layer else (37, 16)
        up, down = torch.randn(rows, RANK, generator=g) * 0.3, torch.randn(RANK, cols, generator=g) * 0.3
        tensors |= {key + up_end: up, key + down_end: down}
        if alpha is not None:
            tensors[key + ".alpha"] = torch.tensor(alpha)
        if layer:
            deltas[layer] = (alpha / RANK if alpha is not None else 1.0) * up @ down
    return tensors, deltas


def _weight(encoder, name):
    return encoder.model.get_submodule(name).compute_weight(torch.float32, CPU)


def test_comfyui_mistral_layouts_apply_the_hand_merged_change(tmp_path, mistral, encoder, dev):
    tensors, deltas = _lora(encoder)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "te.safetensors"))
    lora = prepare_lora(read_lora(tmp_path / "te.safetensors"), dev.transformer, encoder.model, strength=S)
    report = lora.report
    assert report.text_encoder_matched == len(MODULES) and report.unused_layers == [
        "lora_te_layers_N_mlp_up_proj"
    ]
    assert set(lora.patches["text_encoder"]) == set(deltas)
    before = {name: _weight(encoder, name) for name in deltas}
    patched = encoder.with_lora(lora)
    plain = encoder.encode(PROMPTS)
    with_lora = patched.encode(PROMPTS)
    assert torch.equal(encoder.encode(PROMPTS), plain)  # the input encoder is untouched

    # the encoder's output with the deltas merged into a file by hand
    sd = comfy_tensors(mistral, layers=32, lm_head=False)
    for name, delta in deltas.items():
        sd[f"model.{name}.weight"] = sd[f"model.{name}.weight"] + S * delta
    sd["tekken_model"] = tekken_tensor(v7_tekken_json())
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp_path / "merged.safetensors"))
    merged = load_text_encoder(tmp_path / "merged.safetensors")
    for name, delta in deltas.items():
        torch.testing.assert_close(_weight(merged, name), before[name] + S * delta, atol=1e-6, rtol=0)
    torch.testing.assert_close(with_lora, merged.encode(PROMPTS), atol=1e-5, rtol=1e-5)
    change = (with_lora - plain).abs().max().item()
    assert change > 1e-2, f"the LoRA barely changes the text encoder's output ({change})"


def test_a_klein_text_encoder_lora_on_mistral_is_refused_by_name(tmp_path, encoder, dev):
    qwen = {  # Qwen3-4B's q_proj: 4096 rows of 2560
        "lora_te_layers_0_self_attn_q_proj.lora_up.weight": torch.zeros(4096, 1),
        "lora_te_layers_0_self_attn_q_proj.lora_down.weight": torch.zeros(1, 2560),
    }
    save_file(qwen, str(tmp_path / "klein_te.safetensors"))
    with pytest.raises(Flux2Error) as e:
        prepare_lora(read_lora(tmp_path / "klein_te.safetensors"), dev.transformer, encoder.model)
    assert "Qwen3-4B (klein 4B)" in str(e.value) and "16 wide" in str(e.value), str(e.value)
