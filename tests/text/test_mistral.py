"""FLUX.2 [dev]'s Mistral text encoder: Tekken ids, the prompt template, file layouts, padding, errors, sizes.

Expected ids are the published Mistral-Small-3.x vectors (mistral-common's docs, transformers' Pixtral
processor test), transformers' own Tekken conversion and mistral-common's own chat encoding; expected
conditioning is diffusers' ``Flux2Pipeline`` text encoding on the same tiny random Mistral3.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from tiny_mistral import (
    TINY_TEXT,
    TINY_TEXT_HEAD_128,
    comfy_tensors,
    language_model,
    make_tiny_mistral3,
    reference_embeds,
    reference_hf_tokenizer,
    reference_tekken_folder,
    save_hf_tokenizer_folder,
    save_tekken_folder,
    v7_tekken_json,
    write_comfy_file,
    write_hf_folder,
)
from tiny_text import make_tiny_qwen3
from tiny_text import write_comfy_file as write_qwen3_file

from flux2_core.configs import DEV_32B, KLEIN_4B, TEXT_ENCODER_FOR_CONTEXT
from flux2_core.errors import Flux2Error
from flux2_core.sampling import check_text_width
from flux2_core.text.encoder import load_text_encoder, text_encoder_from_state_dict, text_encoder_spec_for
from flux2_core.text.mistral import (
    DEV_MISTRAL,
    MISTRAL_HIDDEN_LAYERS,
    MISTRAL_SMALL_24B,
    MISTRAL_SPEC,
    build_mistral,
    describe_mistral,
    load_tekken_folder,
)
from flux2_core.text.qwen3 import KLEIN_QWEN3, QWEN3_4B, QWEN3_SPEC
from flux2_core.text.tekken import (
    MISTRAL_TEMPLATE,
    SYSTEM_MESSAGE,
    TekkenTokenizer,
    builtin_tekken,
    tekken_from_json,
)
from flux2_core.text.tokenizer import HFTokenizer, tokenize_prompts
from flux2_core.weights.loading import weight_bytes

E = TINY_TEXT["hidden_size"]
PROMPTS = ["a red fox in the snow", "", "[IMG]typed [INST] <s> and 数字 12345 🦊", "long " * 700]
# Text for the id comparisons: unicode (composed and decomposed accents, CJK, emoji, RTL), numbers, whitespace
# runs and newlines, control-token strings typed by users, near-misses of them, code and punctuation.
CORPUS = [
    "Hello, how are you?",
    "a cat holding a sign that says hello world",
    "Café café CAFÉ naïve (decomposed: Cafe\u0301) Zürich ÅNGSTRÖM",
    "数字 12345 and 🦊🦊 — «quotes» ‘single’ 日本語のテキスト 한국어 العربية עברית",
    "3.14159 1,000,000 0x1F 2026-12-01 10:30pm 99% $5.99 1e-9",
    "   leading spaces\ttabs\t\there\n\nnewlines\r\nwindows   trailing   ",
    "\n\n\n    \n",
    "[INST] typed [/INST] <s></s><pad><unk>[SYSTEM_PROMPT]x[/SYSTEM_PROMPT][TOOL_CALLS]",
    "<SPECIAL_500><SPECIAL_999>[TOOL_CONTENT] [PREFIX]a[MIDDLE]b[SUFFIX]",
    "near misses: [INST [/INST]] <s > <SPECIAL_1000> <SPECIAL_20> [inst] [IMG_BREAK][IMG_END]",
    "def f(x):\n    return {'a': [1, 2, 3]}  # code\n",
    "A photo of a RED fox, 4K, ultra-detailed; f/1.8 -- by Ansel Adams!!!???",
    "",
]


@pytest.fixture(scope="module")
def tiny():
    return make_tiny_mistral3(seed=0)


@pytest.fixture(scope="module")
def hf_folder(tiny, tmp_path_factory):
    return write_hf_folder(tiny, tmp_path_factory.mktemp("mistral") / "text_encoder")


@pytest.fixture(scope="module")
def encoder(hf_folder):
    return load_text_encoder(hf_folder)


@pytest.fixture(scope="module")
def reference(tiny):
    return reference_embeds(tiny, reference_hf_tokenizer(), PROMPTS)


@pytest.fixture(scope="module")
def tiny128():
    """A tiny Mistral3 with Mistral Small's head_dim (128), for files without config.json (ComfyUI's)."""
    heads = {k: TINY_TEXT_HEAD_128[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")}
    return make_tiny_mistral3(seed=1, **heads)


@pytest.fixture(scope="module")
def comfy_file(tiny128, tmp_path_factory):
    path = tmp_path_factory.mktemp("comfy") / "mistral_3_small_flux2_bf16.safetensors"
    return write_comfy_file(tiny128, path, v7_tekken_json())


# --- Tekken ids -------------------------------------------------------------------------------------------


def test_published_id_vectors():
    tok = builtin_tekken()
    assert isinstance(tok, TekkenTokenizer) and tok.vocab_size == 131072
    # mistral-common docs, Mistral-Small-3.1 chat
    assert tok.encode("<s>[INST]Hello, how are you?[/INST]") == [1, 3, 22177, 1044, 2606, 1584, 1636, 1063, 4]
    assert tok.encode("<s>Plz tekkenize me</s>") == [1, 4444, 1122, 16058, 3569, 2033, 1639, 2]  # Devstral
    # transformers' Pixtral processor test, the text after the image
    tail = [1010, 7493, 1681, 1278, 4701, 1307, 1278, 3937, 1063, 1349, 4290, 16002, 41150, 1058]
    ids = tok.encode("USER: [IMG]\nWhat's the content of the image? ASSISTANT:")
    assert ids[-15:] == [10] + tail


def test_the_dev_template_gives_the_reference_chat_ids():
    ids, mask = tokenize_prompts(builtin_tekken(), ["", "a cat holding a sign that says hello world"],
                                 512, DEV_MISTRAL.template, DEV_MISTRAL.pad_id)  # fmt: skip
    # The ids of mistral-common's encode_chat_completion for [SystemMessage(SYSTEM_MESSAGE),
    # UserMessage(prompt)] (the message pair of BFL's and diffusers' format_input; SYSTEM_MESSAGE is
    # diffusers' pipelines/flux2/system_messages.py) with the Mistral Small 3.x Tekken vocabulary:
    empty = [1, 17, 4568, 1584, 1420, 26554, 1455, 12738, 2314, 3937, 38340, 1046, 3213, 5628, 37253,
             11688, 30557, 1408, 3481, 14608, 1044, 3481, 1010, 2452, 5604, 1321, 10636, 3816, 67813, 1046,
             18, 3, 4]  # fmt: skip
    assert ids[0, :33].tolist() == empty and mask[0].sum() == 33  # the template's 33 tokens
    assert mask[1].sum() == 42  # the template's 33 tokens and the prompt's 9
    assert ids[1, 30:42].tolist() == [18, 3, 1097, 7990, 14234, 1261, 2287, 1455, 8223, 52528, 4304, 4]
    assert (ids[:, 42:] == 11).all() and "object\nattribution" in SYSTEM_MESSAGE  # right-padded with <pad>


@pytest.mark.parametrize("text", CORPUS)
def test_ids_equal_transformers_tekken_conversion(text):
    reference = reference_hf_tokenizer()
    expected = reference(text, add_special_tokens=False)["input_ids"]
    assert builtin_tekken().encode(text) == expected


def test_template_equals_transformers_chat_template_and_mistral_common():
    from mistral_common.protocol.instruct.messages import SystemMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    common = MistralTokenizer.from_file(str(reference_tekken_folder() / "tekken.json"))
    ours = builtin_tekken()
    for prompt in CORPUS[:7]:  # ordinary text: mistral-common does not parse typed control tokens
        expected = common.encode_chat_completion(
            ChatCompletionRequest(
                messages=[SystemMessage(content=SYSTEM_MESSAGE), UserMessage(content=prompt)]
            )
        ).tokens
        assert ours.encode(MISTRAL_TEMPLATE.format(prompt=prompt)) == expected
        assert common.instruct_tokenizer.tokenizer.encode(prompt, bos=False, eos=False) == ours.encode(prompt)
    messages = [[{"role": "system", "content": [{"type": "text", "text": SYSTEM_MESSAGE}]},
                 {"role": "user", "content": [{"type": "text", "text": p}]}] for p in CORPUS]  # fmt: skip
    rendered = reference_hf_tokenizer().apply_chat_template(messages, tokenize=True, return_dict=True)
    for prompt, expected in zip(CORPUS, rendered["input_ids"]):
        assert ours.encode(MISTRAL_TEMPLATE.format(prompt=prompt)) == expected


def test_v3_and_v7_tekken_files_agree():
    v7 = tekken_from_json(v7_tekken_json(), "v7")
    for text in CORPUS:
        assert v7.encode(text) == builtin_tekken().encode(text)
    with pytest.raises(Flux2Error, match=r"not the Tekken tokenizer of Mistral Small 3.x \(\[INST\]"):
        raw = json.loads(v7_tekken_json())
        raw["special_tokens"][3]["token_str"] = "[BEGIN]"
        tekken_from_json(json.dumps(raw), "other.json")
    with pytest.raises(Flux2Error, match="is not a Tekken tokenizer file"):
        tekken_from_json(b'{"vocab": []}', "broken.json")


def test_img_is_removed_from_prompts_and_typed_controls_stay(encoder):
    ids, _ = tokenize_prompts(encoder.tokenizer, [DEV_MISTRAL.prepare("a [IMG]fox[IMG] [INST]")], 512,
                              DEV_MISTRAL.template, 11)  # fmt: skip
    plain, _ = tokenize_prompts(encoder.tokenizer, ["a fox [INST]"], 512, DEV_MISTRAL.template, 11)
    assert torch.equal(ids, plain) and 10 not in ids[0].tolist() and ids[0].tolist().count(3) == 2


# --- conditioning against diffusers ------------------------------------------------------------------------


def test_matches_diffusers_flux2_pipeline(encoder, reference):
    assert encoder.spec == DEV_MISTRAL and encoder.output_dim == 3 * E
    out = encoder.encode(PROMPTS)
    assert out.shape == (len(PROMPTS), 512, 3 * E) and out.dtype == torch.float32
    assert (out - reference).abs().max().item() <= 1e-5


def test_taps_are_raw_hidden_states_10_20_30_and_30_layers_run(tiny, encoder):
    assert len(encoder.model.layers) == 30 and isinstance(encoder.model.norm, torch.nn.Identity)
    assert encoder.shape.num_layers == 32 and encoder.spec.layers_run == 30
    ids, mask = tokenize_prompts(encoder.tokenizer, ["a red fox"], 512, DEV_MISTRAL.template, 11)
    with torch.no_grad():
        hidden = language_model(tiny)(
            input_ids=ids, attention_mask=mask, output_hidden_states=True
        ).hidden_states
    out = encoder.encode(["a red fox"])
    for slot, index in enumerate(MISTRAL_HIDDEN_LAYERS):
        chunk = out[..., slot * E : (slot + 1) * E]
        torch.testing.assert_close(chunk, hidden[index], rtol=0, atol=1e-5)
        assert not torch.allclose(chunk, hidden[index - 1], atol=1e-3)
        assert not torch.allclose(chunk, hidden[index + 1], atol=1e-3)


def test_file_layouts_load_to_identical_outputs(tiny, encoder, tmp_path):
    expected = encoder.encode(PROMPTS[2:3])
    new_layout = write_hf_folder(tiny, tmp_path / "new", new_layout=True)  # model.language_model.*
    repo = tmp_path / "FLUX.2-dev-tiny"  # a diffusers repository root: its text_encoder/ is used
    write_hf_folder(tiny, repo / "text_encoder")
    (repo / "model_index.json").write_text(json.dumps({"_class_name": "Flux2Pipeline"}))
    for path in (new_layout, repo):
        te = load_text_encoder(path)
        assert te.spec == DEV_MISTRAL and isinstance(te.tokenizer, TekkenTokenizer)
        assert torch.equal(te.encode(PROMPTS[2:3]), expected), path.name


def test_comfy_single_file_with_its_tekken_tensor(tiny128, comfy_file, tmp_path):
    te = load_text_encoder(comfy_file)
    assert te.shape.head_dim == 128 and te.shape.num_heads == 2 and te.shape.num_layers == 32
    assert te.tokenizer.source.endswith("(tekken_model)") and te.spec == DEV_MISTRAL
    out = te.encode(PROMPTS[1:3])
    reference = reference_embeds(tiny128, reference_hf_tokenizer(), PROMPTS[1:3])
    assert (out - reference).abs().max().item() <= 1e-5
    # ComfyUI's pruned file (30 layers, no final norm, no lm_head) gives the same conditioning.
    pruned = write_comfy_file(
        tiny128, tmp_path / "pruned.safetensors", v7_tekken_json(), layers=30, lm_head=False
    )
    te = load_text_encoder(pruned)
    assert te.shape.num_layers == 30 and te.name.startswith("Mistral (16 wide, 30 layers")
    assert torch.equal(te.encode(PROMPTS[1:3]), out)


def test_fp8_comfy_file_stays_quantised(tiny128, tmp_path):
    out, held, layers = {}, {}, {}
    for key, value in comfy_tensors(tiny128).items():
        layer = key[: -len(".weight")]
        if key.startswith("model.layers.") and value.ndim == 2:
            scale = value.abs().max() / 448
            q = (value / scale).to(torch.float8_e4m3fn)
            out[key], out[layer + ".weight_scale"], held[key] = q, scale, q.float() * scale
            layers[layer] = {"format": "float8_e4m3fn"}
        else:  # the embedding and norms stay bf16
            out[key] = value.to(torch.bfloat16)
            held[key] = out[key].float()
    out["tekken_model"] = torch.frombuffer(bytearray(v7_tekken_json()), dtype=torch.uint8)
    metadata = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})}
    save_file(out, str(tmp_path / "mistral_3_small_flux2_fp8.safetensors"), metadata=metadata)
    te = load_text_encoder(tmp_path / "mistral_3_small_flux2_fp8.safetensors")
    assert te.model.layers[5].mlp.up_proj.weight.dtype == torch.float8_e4m3fn
    want = text_encoder_from_state_dict(held)
    torch.testing.assert_close(te.encode(["a red fox"]), want.encode(["a red fox"]), rtol=1e-5, atol=1e-5)
    spec = text_encoder_spec_for(tmp_path / "mistral_3_small_flux2_fp8.safetensors")
    _, planned, _ = weight_bytes(spec, tmp_path / "mistral_3_small_flux2_fp8.safetensors", torch.float32)
    run = [k for k in held if k == "model.embed_tokens.weight" or k.startswith("model.layers.") and
           int(k.split(".")[2]) < 30]  # fmt: skip
    in_fp32 = sum(held[k].numel() * 4 for k in run)
    linears = sum(held[k].numel() * 3 for k in run if held[k].ndim == 2 and "layers" in k)  # 4 -> 1 byte
    scales = 4 * sum(1 for name in layers if int(name.split(".")[2]) < 30)  # one float32 per layer run
    assert spec is MISTRAL_SPEC and planned == in_fp32 - linears + scales


# --- padding side -----------------------------------------------------------------------------------------


def test_padding_side_follows_the_tokenizer_folder(tiny, tmp_path):
    root = tmp_path / "FLUX.2-dev-tiny"
    write_hf_folder(tiny, root / "text_encoder")
    (root / "model_index.json").write_text(json.dumps({"_class_name": "Flux2Pipeline"}))
    save_tekken_folder(root / "tokenizer", padding_side="left")
    te = load_text_encoder(root / "text_encoder")  # finds ../tokenizer and its padding_side
    assert te.tokenizer.source == str(root / "tokenizer" / "tekken.json") and te.spec.padding_side == "left"
    n = len(te.tokenizer.encode(te.spec.template.format(prompt="a fox")))
    ids, mask = tokenize_prompts(te.tokenizer, ["a fox"], 512, te.spec.template, 11, "left")
    assert mask[0, :-n].sum() == 0 and mask[0, -n:].all() and ids[0, 0] == 11 and ids[0, -n] == 1
    out = te.encode(PROMPTS[1:3])
    reference = reference_embeds(tiny, reference_hf_tokenizer(), PROMPTS[1:3], padding_side="left")
    assert (out - reference).abs().max().item() <= 1e-5
    # Real tokens agree with right padding (RoPE is relative); the left pads are other states.
    right = load_text_encoder(root / "text_encoder", tokenizer_path=reference_tekken_folder())
    assert right.spec.padding_side == "right"  # a folder that names no side: right, the default
    left = te.encode(["a fox"])[0]
    torch.testing.assert_close(left[-n:], right.encode(["a fox"])[0, :n], rtol=1e-4, atol=1e-4)


def test_hf_tokenizer_json_folder(encoder, tmp_path):
    folder = save_hf_tokenizer_folder(tmp_path / "tokenizer")  # tokenizer.json only
    (folder / "empty").mkdir()
    tokenizer, side = load_tekken_folder(folder)
    assert isinstance(tokenizer, HFTokenizer) and side is None
    for text in CORPUS:
        assert tokenizer.encode(text) == encoder.tokenizer.encode(text)
    with pytest.raises(Flux2Error, match="holds no Mistral tokenizer"):
        load_tekken_folder(folder / "empty")


# --- which encoder, and clear errors ------------------------------------------------------------------------


def test_one_loader_tells_qwen3_and_mistral_apart(tmp_path, encoder):
    qwen = load_text_encoder(write_qwen3_file(make_tiny_qwen3(seed=0), tmp_path / "qwen_3_4b.safetensors"))
    assert qwen.spec == KLEIN_QWEN3 and qwen.output_dim == 96 and qwen.name.startswith("Qwen3")
    assert encoder.name.startswith("Mistral") and encoder.output_dim == 48
    assert text_encoder_spec_for(tmp_path / "qwen_3_4b.safetensors") is QWEN3_SPEC


def test_wrong_pairings_name_the_right_encoder_from_shapes_alone(tmp_path, hf_folder):
    qwen_file = write_qwen3_file(make_tiny_qwen3(seed=0), tmp_path / "qwen_3_4b.safetensors")
    for path, config in ((hf_folder, KLEIN_4B), (qwen_file, DEV_32B)):
        spec = text_encoder_spec_for(path)
        shape, _, _ = weight_bytes(spec, path, torch.float32)
        with pytest.raises(Flux2Error, match=f"needs {TEXT_ENCODER_FOR_CONTEXT[config.context_in_dim]}"):
            check_text_width(config, "the model", shape.output_dim, f"text encoder ({spec.describe(shape)})")
    # The real shapes: each message names both encoders.
    with pytest.raises(Flux2Error, match="needs Mistral-Small-3.2-24B: 15360.*gives 7680 .made by Qwen3-4B"):
        check_text_width(DEV_32B, "FLUX.2 dev 32B", QWEN3_4B.output_dim)
    with pytest.raises(Flux2Error, match="needs Qwen3-4B: 7680.*gives 15360 .made by Mistral-Small-3.2-24B"):
        check_text_width(KLEIN_4B, "klein 4B", MISTRAL_SMALL_24B.output_dim)


def _with_bias(tensors):
    return tensors | {"model.layers.0.self_attn.q_proj.bias": torch.zeros(256)}


def _too_few(tensors):
    return {
        k: v for k, v in tensors.items() if not k.startswith("model.layers.") or int(k.split(".")[2]) < 20
    }


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_with_bias, "has attention biases"),
        (_too_few, "has only 20 decoder layers; FLUX.2 \\[dev\\] reads hidden states after layer 30"),
        (
            lambda t: {k: v for k, v in t.items() if "mlp.up_proj" not in k or ".7." not in k},
            "missing 1 tensors",
        ),
    ],
)
def test_wrong_files_raise_clear_errors(tiny128, tmp_path, mutate, message):
    path = tmp_path / "te.safetensors"
    save_file(mutate(comfy_tensors(tiny128)), str(path))
    with pytest.raises(Flux2Error, match=message):
        load_text_encoder(path, tokenizer_path=reference_tekken_folder())


def test_head_dim_without_config_is_mistral_smalls(tiny, tmp_path):
    path = write_comfy_file(tiny, tmp_path / "te.safetensors", v7_tekken_json())  # head_dim 4, no config
    with pytest.raises(
        Flux2Error, match="not whole heads of 128 .Mistral Small's, as there is no config.json"
    ):
        load_text_encoder(path)


# --- real sizes, on the meta device ------------------------------------------------------------------------


def test_real_size_pruned_mistral_and_dev_dit():
    from flux2_core.dit.transformer import Flux2Transformer

    ours = build_mistral(MISTRAL_SMALL_24B)
    assert sum(p.numel() for p in ours.parameters()) == 17_343_754_240  # embedding + 30 layers
    assert len(ours.layers) == 30 and MISTRAL_SMALL_24B.output_dim == 15360
    assert TEXT_ENCODER_FOR_CONTEXT[15360] == describe_mistral(MISTRAL_SMALL_24B) == "Mistral-Small-3.2-24B"
    with torch.device("meta"):
        dit = Flux2Transformer(DEV_32B)
    assert (
        sum(p.numel() for p in dit.parameters()) == 32_223_281_152
    )  # diffusers' default Flux2Transformer2DModel config
