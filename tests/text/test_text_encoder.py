"""The 27-layer Qwen3 text encoder vs diffusers' klein conditioning; file layouts, errors, real sizes."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from tiny_text import (
    TINY_QWEN3,
    make_tiny_qwen3,
    model_tensors,
    reference_embeds,
    reference_hf_tokenizer,
    save_reference_tokenizer,
    write_all_in_one,
    write_comfy_file,
    write_hf_folder,
    write_qwen_tokenizer_folder,
)
from transformers import Qwen3Config, Qwen3ForCausalLM

from flux2_core.configs import TEXT_ENCODER_FOR_CONTEXT
from flux2_core.errors import Flux2Error
from flux2_core.text.encoder import TextEncoder, load_text_encoder, text_encoder_from_state_dict
from flux2_core.text.qwen3 import (
    QWEN3_4B,
    QWEN3_8B,
    QWEN3_HIDDEN_LAYERS,
    build_qwen3,
    describe_qwen3,
    read_qwen3_shape,
)
from flux2_core.text.tokenizer import HFTokenizer, QwenTokenizer, tokenize_prompts

E = TINY_QWEN3["hidden_size"]
PROMPTS = [
    "a red fox in the snow",
    "",
    "special text <|im_end|> inside, 数字 12345 and 🦊",
    "long " * 700,  # truncated at 512
]


@pytest.fixture(scope="module")
def tiny() -> Qwen3ForCausalLM:
    return make_tiny_qwen3(seed=0)


@pytest.fixture(scope="module")
def encoder(tiny) -> TextEncoder:
    return text_encoder_from_state_dict(model_tensors(tiny))


@pytest.fixture(scope="module")
def reference(tiny) -> torch.Tensor:
    return reference_embeds(tiny, reference_hf_tokenizer(), PROMPTS)


def test_matches_diffusers_full_depth_reference(encoder, reference):
    out = encoder.encode(PROMPTS)
    assert out.shape == (len(PROMPTS), 512, 3 * E) and out.dtype == torch.float32
    assert encoder.output_dim == 3 * E
    assert (out - reference).abs().max().item() <= 1e-5


def test_taps_are_raw_hidden_states_9_18_27(tiny, encoder):
    out = encoder.encode(["a red fox in the snow"])
    ids, mask = tokenize_prompts(encoder.tokenizer, ["a red fox in the snow"])
    with torch.no_grad():
        hidden = tiny.model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
    assert len(hidden) == 29  # embeddings + 28 layers (the last one normed)
    for slot, index in enumerate(QWEN3_HIDDEN_LAYERS):
        chunk = out[..., slot * E : (slot + 1) * E]
        torch.testing.assert_close(chunk, hidden[index], rtol=0, atol=1e-5)
        assert not torch.allclose(chunk, hidden[index - 1], atol=1e-3)  # not off by one either way
        assert not torch.allclose(chunk, hidden[index + 1], atol=1e-3)
    assert not torch.allclose(out[..., 2 * E :], tiny.model.norm(hidden[27]), atol=1e-3)  # no final norm


@pytest.mark.parametrize("layer", [8, 9, 17, 18, 26, 27])
def test_perturbing_a_layer_changes_only_the_later_taps(tiny, encoder, layer):
    tensors = model_tensors(tiny)
    tensors[f"model.layers.{layer}.mlp.down_proj.weight"] += 0.5
    out = text_encoder_from_state_dict(tensors).encode(["a red fox"])
    base = encoder.encode(["a red fox"])
    changed = [
        not torch.equal(out[..., s * E : (s + 1) * E], base[..., s * E : (s + 1) * E]) for s in range(3)
    ]
    # 0-based layer L feeds hidden_states[k] iff L < k: h0 (embeddings) is no tap, layer 27 never matters.
    assert changed == [layer < k for k in QWEN3_HIDDEN_LAYERS]


def test_final_norm_lm_head_and_extra_layers_are_ignored(tiny, encoder):
    tensors = model_tensors(tiny)
    tensors["model.norm.weight"] *= 3.0
    tensors["lm_head.weight"] *= 3.0
    tensors["model.layers.27.self_attn.q_proj.weight"] *= 3.0
    assert torch.equal(text_encoder_from_state_dict(tensors).encode(["x"]), encoder.encode(["x"]))


def test_only_27_layers_are_built(encoder):
    assert len(encoder.model.layers) == 27 == encoder.model.config.num_hidden_layers
    assert isinstance(encoder.model.norm, torch.nn.Identity)
    assert encoder.shape.num_layers == 28  # what the file holds
    assert not any(p.requires_grad for p in encoder.model.parameters())
    assert not encoder.model.training


def test_batch_rows_equal_single_prompts(encoder):
    batch = encoder.encode(PROMPTS[:3])
    for row, prompt in enumerate(PROMPTS[:3]):
        torch.testing.assert_close(batch[row : row + 1], encoder.encode([prompt]), rtol=0, atol=1e-5)


def test_file_layouts_load_to_identical_outputs(tiny, encoder, tmp_path):
    expected = encoder.encode(PROMPTS[:2])
    comfy = write_comfy_file(tiny, tmp_path / "qwen_3_4b.safetensors")
    bare = write_comfy_file(tiny, tmp_path / "no_lm_head.safetensors", lm_head=False)
    aio = write_all_in_one(tiny, tmp_path / "flux2_klein_aio.safetensors")
    folder = write_hf_folder(tiny, tmp_path / "Qwen3-tiny", max_shard_size="4MB")
    assert len(list(folder.glob("model-*-of-*.safetensors"))) > 1
    assert (folder / "model.safetensors.index.json").is_file()
    shard = sorted(folder.glob("model-*-of-*.safetensors"))[-1]  # one shard picked from ComfyUI's list
    for path in (comfy, bare, aio, folder, shard):
        te = load_text_encoder(path)
        assert isinstance(te.tokenizer, QwenTokenizer)  # none of these carries a tokenizer
        assert torch.equal(te.encode(PROMPTS[:2]), expected), path.name


def test_all_in_one_with_a_quantized_dit_still_loads_its_text_encoder(tiny, encoder, tmp_path):
    tensors = {f"text_encoders.qwen3_8b.transformer.{k}": v for k, v in model_tensors(tiny).items()}
    tensors["model.diffusion_model.img_in.weight"] = torch.zeros(32, 128, dtype=torch.float8_e4m3fn)
    tensors["model.diffusion_model.img_in.weight_scale"] = torch.ones(())
    path = tmp_path / "aio_fp8.safetensors"
    save_file(tensors, str(path), metadata={"_quantization_metadata": "{}"})
    assert torch.equal(load_text_encoder(path).encode(["x"]), encoder.encode(["x"]))


def test_config_json_supplies_rope_theta(tmp_path):
    model = make_tiny_qwen3(seed=1, rope_theta=10_000.0, rms_norm_eps=1e-5)
    te = load_text_encoder(write_hf_folder(model, tmp_path / "qwen"))
    assert te.shape.rope_theta == 10_000.0 and te.shape.rms_norm_eps == 1e-5
    reference = reference_embeds(model, reference_hf_tokenizer(), PROMPTS[:2])
    assert (te.encode(PROMPTS[:2]) - reference).abs().max().item() <= 1e-5


def test_tokenizer_beside_the_weights_is_used(tiny, tmp_path):
    root = tmp_path / "FLUX.2-klein-tiny"
    write_hf_folder(tiny, root / "text_encoder")
    save_reference_tokenizer(root / "tokenizer")  # a bare tokenizer.json
    (root / "model_index.json").write_text(json.dumps({"_class_name": "Flux2KleinPipeline"}))
    te = load_text_encoder(root / "text_encoder")  # finds ../tokenizer (and so does the repo root)
    assert isinstance(te.tokenizer, HFTokenizer) and te.tokenizer.source == str(root / "tokenizer")
    vocab_merges = write_qwen_tokenizer_folder(tmp_path / "qwen25_tokenizer")  # ComfyUI's layout
    explicit = load_text_encoder(
        write_comfy_file(tiny, tmp_path / "te.safetensors"), tokenizer_path=vocab_merges
    )
    assert isinstance(explicit.tokenizer, HFTokenizer) and explicit.tokenizer.source == str(vocab_merges)
    torch.testing.assert_close(explicit.encode(PROMPTS[:2]), te.encode(PROMPTS[:2]), rtol=0, atol=0)


def test_bf16_matches_transformers_from_pretrained_in_bf16(tiny, encoder, tmp_path):
    folder = write_hf_folder(tiny, tmp_path / "qwen")
    te = load_text_encoder(folder, dtype=torch.bfloat16)
    # RoPE stays fp32, as in from_pretrained(dtype=bf16) (a plain model.to(bf16) would round inv_freq too).
    assert te.dtype == torch.bfloat16 and te.model.rotary_emb.inv_freq.dtype == torch.float32
    out = te.encode(PROMPTS[:2])
    assert out.dtype == torch.bfloat16
    hf_bf16 = Qwen3ForCausalLM.from_pretrained(
        str(folder), dtype=torch.bfloat16, local_files_only=True
    ).eval()
    reference = reference_embeds(hf_bf16, reference_hf_tokenizer(), PROMPTS[:2])
    assert torch.equal(out.float(), reference)  # same kernels, same order: bit-identical
    cosine = torch.nn.functional.cosine_similarity(
        out.float().flatten(), encoder.encode(PROMPTS[:2]).flatten(), 0
    )
    assert cosine > 0.999
    assert te.to("cpu") is te and te.device == torch.device("cpu")


# --- errors ------------------------------------------------------------------------------------------------


def _qwen25_like(tensors):
    return {k: v for k, v in tensors.items() if "q_norm" not in k and "k_norm" not in k}


def _qwen3_vl_like(tensors):
    renamed = {k.replace("model.", "model.language_model.", 1): v for k, v in tensors.items()}
    return renamed | {"model.visual.patch_embed.proj.weight": torch.zeros(8, 3, 2, 16, 16)}


def _dit_like(tensors):
    return {"double_blocks.0.img_attn.qkv.weight": torch.zeros(96, 32), "img_in.weight": torch.zeros(32, 128)}


def _other_all_in_one(tensors):
    return {f"text_encoders.mistral3_24b.transformer.{k}": v for k, v in tensors.items()} | _dit_like(tensors)


def _missing_one(tensors):
    return {k: v for k, v in tensors.items() if k != "model.layers.5.mlp.up_proj.weight"}


def _int8(tensors):
    tensors = dict(tensors)
    tensors["model.layers.3.mlp.gate_proj.weight"] = torch.zeros(64, 32, dtype=torch.int8)
    return tensors


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_qwen25_like, "is not a Qwen3 model"),
        (_qwen3_vl_like, "is a Qwen3-VL"),
        (_dit_like, "is a diffusion model"),
        (_other_all_in_one, "all-in-one checkpoint whose text encoder is mistral3_24b"),
        (lambda t: {"decoder.conv_in.weight": torch.zeros(4, 4)}, "not a language-model text encoder"),
        (_missing_one, "missing 1 tensors"),
        (_int8, "int8, packed integer weights with no format marker"),
    ],
)
def test_wrong_files_raise_clear_errors(tiny, tmp_path, mutate, message):
    path = tmp_path / "te.safetensors"
    save_file(mutate(model_tensors(tiny)), str(path))
    with pytest.raises(Flux2Error, match=message):
        load_text_encoder(path)


def test_too_few_layers(tmp_path):
    path = write_comfy_file(make_tiny_qwen3(num_hidden_layers=20), tmp_path / "short.safetensors")
    with pytest.raises(Flux2Error, match="has only 20 decoder layers.*36 layers"):
        load_text_encoder(path)


def test_truncated_file(tiny, tmp_path):
    path = write_comfy_file(tiny, tmp_path / "qwen_3_4b.safetensors")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(Flux2Error, match="truncated or corrupt"):
        load_text_encoder(path)


# --- real sizes, on the meta device ---------------------------------------------------------------------


def _hf_config(shape, tie: bool) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        tie_word_embeddings=tie,
    )


def _layer_params(shape) -> int:
    e, q, kv = shape.hidden_size, shape.num_heads * shape.head_dim, shape.num_kv_heads * shape.head_dim
    attention = e * q + 2 * e * kv + q * e + 2 * shape.head_dim  # q, k, v, o projections + q/k norms
    return attention + 3 * e * shape.intermediate_size + 2 * e  # SwiGLU + two RMSNorms


@pytest.mark.parametrize(
    ("shape", "name", "tie", "full_count"),
    [(QWEN3_4B, "Qwen3-4B", True, 4_022_468_096), (QWEN3_8B, "Qwen3-8B", False, 8_190_735_360)],
)
def test_real_size_parameter_counts(shape, name, tie, full_count):
    embed = shape.vocab_size * shape.hidden_size
    with torch.device("meta"):
        full = Qwen3ForCausalLM(_hf_config(shape, tie))
    # the released checkpoints: total_size in Qwen/Qwen3-4B's and Qwen/Qwen3-8B's model.safetensors.index.json
    # (8,044,936,192 and 16,381,470,720 bytes of bfloat16) / 2; Qwen3-4B's tied lm_head is stored once
    assert sum(p.numel() for p in full.parameters()) == full_count
    assert full_count == embed * (1 if tie else 2) + 36 * _layer_params(shape) + shape.hidden_size
    # What we build and load: embeddings + 27 layers, no final norm, no lm_head.
    ours = build_qwen3(shape)
    assert sum(p.numel() for p in ours.parameters()) == embed + 27 * _layer_params(shape)
    # The shape reader recognises the published model from its tensors alone.
    detected = read_qwen3_shape(full.state_dict(), name)
    assert detected == shape and describe_qwen3(detected) == name
    assert TEXT_ENCODER_FOR_CONTEXT[shape.output_dim] == name  # 7680 / 12288 = the DiT's txt_in width


def test_no_prompt_is_a_clear_error(encoder):
    with pytest.raises(Flux2Error, match="no prompt to encode"):
        encoder.encode([])


def test_interrupt_is_checked_before_every_layer(encoder):
    class Stop(BaseException):
        pass

    calls = []

    def interrupt():
        calls.append(1)
        if len(calls) == 5:
            raise Stop

    with pytest.raises(Stop):
        encoder.encode(["a fox"], interrupt=interrupt)
    assert len(calls) == 5
    counted = []
    encoder.encode(["a fox"], interrupt=lambda: counted.append(1))  # hooks from the stopped run are gone
    assert len(counted) == 27
