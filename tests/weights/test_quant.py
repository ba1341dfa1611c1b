"""Quantised checkpoints: fp8 (three marker forms, plain, e5m2, mixed), int8 (per tensor / row, ConvRot),
nvfp4, mxfp8 and GGUF, for the DiT and the Qwen3 text encoder.

Expected weights come from the stored bytes by comfy-kitchen's dequantisation formulas, computed in
``quant_files`` (GGUF: the ``gguf`` package's own dequantiser); the loaded model must reproduce them exactly
and keep them quantised.
"""

from __future__ import annotations

import json

import pytest
import torch
from quant_files import E2M1, hadamard, marker, nvfp4, swizzled_index, write_gguf, write_quantised
from safetensors.torch import save_file
from tiny_dit import bfl_state_dict, make_diffusers_dit, write_bfl_file
from tiny_text import make_tiny_qwen3, model_tensors

from flux2_core import Flux2Error, load_text_encoder, load_transformer
from flux2_core.dit.files import DIT_SPEC
from flux2_core.ops import PLAIN, linears
from flux2_core.text.encoder import text_encoder_from_state_dict
from flux2_core.weights.loading import weight_bytes
from flux2_core.weights.quant import QuantLayer, dequantize, unswizzle

CPU = torch.device("cpu")
FORMS = [
    ("float8_e4m3fn", "tensor", {}),
    ("float8_e4m3fn", "header", {"prefix": "model.diffusion_model."}),
    ("float8_e4m3fn", "legacy", {}),
    ("float8_e4m3fn", "plain", {}),
    ("float8_e5m2", "tensor", {}),
    ("int8_tensorwise", "tensor", {"per_row": False}),
    ("int8_tensorwise", "tensor", {"per_row": True, "input_scale": True, "flat_scale": True}),
    ("int8_tensorwise", "header", {"convrot": 16, "nested": True}),
    ("int8_tensorwise", "tensor", {"convrot": 16}),
    ("nvfp4", "header", {"prefix": "model.diffusion_model."}),
    ("nvfp4", "tensor", {}),
]
STORED = {
    "float8_e4m3fn": torch.float8_e4m3fn,
    "float8_e5m2": torch.float8_e5m2,
    "int8_tensorwise": torch.int8,
}


@pytest.fixture(scope="module")
def dit():
    return make_diffusers_dit(seed=3)


@pytest.fixture(scope="module")
def inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 12, 128, generator=g)
    ctx = torch.randn(1, 5, 24, generator=g)
    ids = torch.zeros(12, 4)
    ids[:, 1], ids[:, 2] = torch.arange(12) // 4, torch.arange(12) % 4
    return x, torch.tensor([0.7]), ctx, ids


def _forward(model, inputs):
    x, t, ctx, x_ids = inputs
    with torch.no_grad():
        return model.transformer(x, x_ids, t, ctx)


def _reference(sd, expected, tmp_path, high=torch.bfloat16):
    """A plain BFL file holding the weights a correct loader reconstructs (high layers rounded as stored)."""
    plain = {k: (expected[k] if k in expected else v.to(high).float()) for k, v in sd.items()}
    save_file(plain, str(tmp_path / "reference.safetensors"))
    return load_transformer(tmp_path / "reference.safetensors", variant="distilled")


@pytest.mark.parametrize(("fmt", "form", "options"), FORMS, ids=[f"{f}-{g}-{len(o)}" for f, g, o in FORMS])
def test_quantised_dit_reconstructs_its_weights_and_stays_quantised(
    dit, inputs, tmp_path, fmt, form, options
):
    options = dict(options)
    prefix = options.pop("prefix", "")
    sd = bfl_state_dict(dit)
    path = tmp_path / f"flux-2-klein-4b-{fmt}.safetensors"
    expected = write_quantised(sd, path, fmt, form, prefix=prefix, **options)
    model = load_transformer(path)
    layers = dict(linears(model.transformer))
    for key, want in expected.items():
        layer = layers[key[: -len(".weight")]]
        assert torch.equal(layer.compute_weight(torch.float32, CPU), want), key
        assert layer.source is not PLAIN and layer.weight.dtype == STORED.get(fmt, torch.uint8), key
    assert model.transformer.dtype == torch.float32
    # The forward equals a plain model holding exactly those weights, and stays near the float model.
    high = torch.float8_e4m3fn if form == "plain" else torch.bfloat16
    out, want = _forward(model, inputs), _forward(_reference(sd, expected, tmp_path, high), inputs)
    if fmt == "int8_tensorwise":  # W8A8 quantises activations too: within ~1e-2 of dequantise-then-matmul
        assert ((out - want).norm() / want.norm()).item() < 2e-2
    else:
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    exact = _forward(load_transformer(write_bfl_file(dit, tmp_path / "float.safetensors")), inputs)
    bound = {"nvfp4": 0.5, "float8_e5m2": 0.25}.get(fmt, 0.15)
    assert ((out - exact).norm() / exact.norm()).item() < bound


@pytest.mark.parametrize("convrot", [0, 16])
def test_int8_layers_multiply_in_int8_as_comfyui_does(dit, tmp_path, convrot):
    sd = bfl_state_dict(dit)
    path = tmp_path / "int8.safetensors"
    write_quantised(sd, path, "int8_tensorwise", convrot=convrot)
    layer = dict(linears(load_transformer(path).transformer))["single_blocks.0.linear2"]
    x = torch.randn(2, 7, layer.in_features, generator=torch.Generator().manual_seed(0))
    # The W8A8 forward ComfyUI runs for an int8_tensorwise layer (comfy-kitchen
    # backends/eager/quantization.py, int8_linear), written out here.
    q, s = layer.weight, layer.weight_scale
    xr = (x.reshape(-1, 2, 16) @ hadamard(16)).reshape(x.shape) if convrot else x
    x2 = xr.reshape(-1, layer.in_features)
    sx = (x2.abs().amax(-1, keepdim=True).float() / 127).clamp(min=1e-30)
    xq = (x2 / sx).round().clamp(-128, 127).to(torch.int8)
    want = (torch._int_mm(xq, q.T.contiguous()).float() * (sx * s.float().reshape(1, -1))).reshape(2, 7, -1)
    with torch.no_grad():
        assert torch.equal(layer(x), want)
        deq = torch.nn.functional.linear(x, layer.compute_weight(torch.float32, CPU))
    assert ((layer(x) - deq).norm() / deq.norm()).item() < 2e-2


def test_quantised_weights_take_their_stored_bytes(dit, tmp_path):
    sd = bfl_state_dict(dit)
    path = tmp_path / "flux-2-klein-4b-fp8.safetensors"
    expected = write_quantised(sd, path, "float8_e4m3fn", high=torch.float32)
    model = load_transformer(path)
    held = sum(
        t.numel() * t.element_size() for t in [*model.transformer.parameters(), *model.transformer.buffers()]
    )
    quantised = sum(sd[k].numel() for k in expected)  # one byte each, plus a 4-byte scale per layer
    plain = sum(v.numel() * 4 for k, v in sd.items() if k not in expected)
    assert held == quantised + 4 * len(expected) + plain
    assert weight_bytes(DIT_SPEC, path, torch.float32)[1] == held
    assert held < 0.6 * sum(v.numel() * 4 for v in sd.values())


def test_dequantising_at_load_gives_plain_weights(dit, tmp_path):
    from flux2_core.weights.loading import load_component

    sd = bfl_state_dict(dit)
    path = tmp_path / "int8.safetensors"
    expected = write_quantised(sd, path, "int8_tensorwise", convrot=16)
    module = load_component(DIT_SPEC, path, torch.float32, keep_quantized=False).module
    layers = dict(linears(module))
    for key, want in expected.items():
        layer = layers[key[: -len(".weight")]]
        assert layer.source is PLAIN and layer.weight.dtype == torch.float32
        assert torch.equal(layer.weight, want)


def test_nvfp4_nibble_order_swizzle_and_padding():
    # Byte 0x27 of row 0: column 0 in the high nibble (code 2 -> 1.0), column 1 in the low one (7 -> 6.0).
    rows, cols, stored_rows = 100, 80, 112  # rows padded to 16; 5 blocks of 16 -> scale columns padded to 8
    codes = torch.randint(
        0, 256, (stored_rows, cols // 2), dtype=torch.uint8, generator=torch.Generator().manual_seed(1)
    )
    codes[0, 0] = 0x27
    logical = torch.exp2(torch.randint(-3, 3, (stored_rows, cols // 16)).float())
    flat = torch.zeros(128 * 8)
    for r in range(stored_rows):
        for k in range(cols // 16):
            flat[swizzled_index(r, k, 8)] = logical[r, k]
    scales = flat.reshape(128, 8).to(torch.float8_e4m3fn)
    assert torch.equal(unswizzle(scales)[:stored_rows, : cols // 16].float(), logical)
    q = QuantLayer("nvfp4", {}, shape=(stored_rows, cols))
    w = dequantize(
        q, {"weight": codes, "weight_scale": scales, "weight_scale_2": torch.tensor(0.5)}, torch.float32
    )
    unpacked = torch.stack([codes >> 4, codes & 15], -1).reshape(stored_rows, cols).long()
    want = E2M1[unpacked] * logical.repeat_interleave(16, 1) * 0.5
    assert torch.equal(w, want)
    assert w[0, 0] == 1.0 * logical[0, 0] * 0.5 and w[0, 1] == 6.0 * logical[0, 0] * 0.5
    assert w[:rows].shape == (rows, cols)


def test_mxfp8_dequantises_by_power_of_two_blocks():
    g = torch.Generator().manual_seed(2)
    values = (torch.randn(64, 64, generator=g) * 4).to(torch.float8_e4m3fn)
    exps = torch.randint(120, 135, (64, 2), generator=g)
    exps[3, 1] = 0  # E = 0 reads as zero
    flat = torch.zeros(128 * 4, dtype=torch.uint8)
    for r in range(64):
        for k in range(2):
            flat[swizzled_index(r, k, 4)] = int(exps[r, k])
    q = QuantLayer("mxfp8", {}, shape=(64, 64))
    w = dequantize(q, {"weight": values, "weight_scale": flat.reshape(128, 4)}, torch.float32)
    factor = torch.where(exps == 0, 0.0, torch.exp2(exps.float() - 127)).repeat_interleave(32, 1)
    assert torch.equal(w, values.float() * factor)


def test_hadamard_rotation_is_its_own_inverse():
    from flux2_core.weights.quant import hadamard as ours

    for g in (4, 16, 64, 256):
        h = ours(g)
        assert torch.equal(h, hadamard(g)) and torch.allclose(h @ h, torch.eye(g), atol=1e-6)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"format": "convrot_w4a4"}, "convrot_w4a4"),  # a scalar scale: not the layout ComfyUI writes
        ({"format": "float8_e4m3fn_rowwise"}, "row-wise fp8"),
        ({"format": "bitnet_ternary"}, "unknown quantisation format 'bitnet_ternary'"),
        ({"format": "int8_tensorwise", "convrot": True, "convrot_groupsize": 128}, "not a power of 4"),
    ],
)
def test_unknown_or_unsupported_formats_are_refused_by_name(dit, tmp_path, entry, message):
    sd = bfl_state_dict(dit)
    layer = "double_blocks.0.img_attn.proj"
    sd[layer + ".weight"] = torch.zeros(sd[layer + ".weight"].shape, dtype=torch.int8)
    sd[layer + ".weight_scale"] = torch.ones(())
    sd[layer + ".comfy_quant"] = marker(entry)
    save_file(sd, str(tmp_path / "odd.safetensors"))
    with pytest.raises(Flux2Error, match=f"{layer}.*{message}|{message}.*{layer}"):
        load_transformer(tmp_path / "odd.safetensors")


def test_a_scale_without_a_marker_on_integer_weights_is_refused(dit, tmp_path):
    sd = bfl_state_dict(dit)
    layer = "single_blocks.0.linear2"
    sd[layer + ".weight"] = torch.zeros(sd[layer + ".weight"].shape, dtype=torch.int8)
    sd[layer + ".weight_scale"] = torch.ones(())
    save_file(sd, str(tmp_path / "odd.safetensors"))
    with pytest.raises(Flux2Error, match="weight scale but no format marker"):
        load_transformer(tmp_path / "odd.safetensors")


def test_corrupt_block_scales_are_refused(dit, tmp_path):
    sd = bfl_state_dict(dit)
    layer = "double_blocks.0.img_mlp.2"
    stored, _ = nvfp4(sd[layer + ".weight"])
    stored["weight_scale"] = stored["weight_scale"][:64]
    for role, value in stored.items():
        sd[f"{layer}.{role}"] = value
    sd[layer + ".comfy_quant"] = marker({"format": "nvfp4"})
    save_file(sd, str(tmp_path / "odd.safetensors"))
    with pytest.raises(Flux2Error, match="block scales of shape"):
        load_transformer(tmp_path / "odd.safetensors")


GGUF_TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "BF16", "F16"]


def test_gguf_dit_dequantises_like_gguf_and_runs(tmp_path):
    wide = make_diffusers_dit(
        seed=4, attention_head_dim=128, axes_dims_rope=(32, 32, 32, 32), joint_attention_dim=256
    )
    sd = bfl_state_dict(wide)
    linear = [k for k in sd if k.endswith(".weight") and sd[k].ndim == 2]
    types = {k: GGUF_TYPES[i % len(GGUF_TYPES)] for i, k in enumerate(linear)}
    types["img_in.weight"] = "F16"  # 128 inputs: no K-quant fits, as converters do
    held = write_gguf(sd, tmp_path / "flux-2-klein-4b-Q4_K_M.gguf", "flux", types)
    model = load_transformer(tmp_path / "flux-2-klein-4b-Q4_K_M.gguf")
    assert model.variant.name == "distilled"
    layers = dict(linears(model.transformer))
    for key in linear:
        layer = layers[key[: -len(".weight")]]
        assert torch.equal(layer.compute_weight(torch.float32, CPU), held[key]), key
        if types[key] not in ("F16", "BF16"):
            assert layer.weight.dtype == torch.uint8, key
    ids = torch.zeros(8, 4)
    ids[:, 2] = torch.arange(8)
    x, ctx = torch.randn(1, 8, 128), torch.randn(1, 3, 256)
    save_file({k: v.contiguous() for k, v in held.items()}, str(tmp_path / "held.safetensors"))
    plain = load_transformer(tmp_path / "held.safetensors", variant="distilled")
    with torch.no_grad():
        out = model.transformer(x, ids, torch.tensor([0.5]), ctx)
        want = plain.transformer(x, ids, torch.tensor([0.5]), ctx)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


LLAMA = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
}  # fmt: skip


def _llama_name(hf: str) -> str:
    if hf.startswith("model.layers."):
        n, rest = hf[len("model.layers.") :].split(".", 1)
        module, kind = rest.rsplit(".", 1)
        return f"blk.{n}.{LLAMA[module]}.{kind}"
    return {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}[hf]


def test_qwen3_gguf_with_llama_cpp_names(tmp_path):
    tiny = make_tiny_qwen3(seed=5)
    tensors = model_tensors(tiny, lm_head=False)
    named = {_llama_name(k): v for k, v in tensors.items()}
    types = {k: ("Q8_0" if v.ndim == 2 else "F32") for k, v in named.items()}
    types["token_embd.weight"] = "Q8_0"  # a quantised embedding is dequantised at load
    held = write_gguf(named, tmp_path / "Qwen3-4B-Q8_0.gguf", "qwen3", types)
    encoder = load_text_encoder(tmp_path / "Qwen3-4B-Q8_0.gguf")
    assert encoder.model.layers[0].self_attn.q_proj.weight.dtype == torch.uint8
    want = text_encoder_from_state_dict({k: held[_llama_name(k)] for k in tensors})
    prompts = ["a red fox", "数字 and 🦊"]
    torch.testing.assert_close(encoder.encode(prompts), want.encode(prompts), rtol=1e-5, atol=1e-5)


def test_qwen3_fp8mixed_text_encoder(tmp_path):
    tiny = make_tiny_qwen3(seed=6)
    tensors = model_tensors(tiny)
    out, held, layers = {}, {}, {}
    for key, value in tensors.items():
        layer = key[: -len(".weight")]
        if key.startswith("model.layers.") and value.ndim == 2 and not key.startswith("model.layers.0."):
            scale = value.abs().max() / 448
            q = (value / scale).to(torch.float8_e4m3fn)
            out[key], out[layer + ".weight_scale"], held[key] = q, scale, q.float() * scale
            layers[layer] = {"format": "float8_e4m3fn", "full_precision_matrix_mult": True}
        else:  # embeddings, norms, lm_head and the first layer stay bf16, as fp8mixed recipes do
            out[key] = value.to(torch.bfloat16)
            held[key] = out[key].float()
    metadata = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": layers})}
    save_file(out, str(tmp_path / "qwen_3_4b_fp8_mixed.safetensors"), metadata=metadata)
    encoder = load_text_encoder(tmp_path / "qwen_3_4b_fp8_mixed.safetensors")
    assert encoder.model.layers[5].mlp.up_proj.weight.dtype == torch.float8_e4m3fn
    assert encoder.dtype == torch.float32
    want = text_encoder_from_state_dict(held)
    torch.testing.assert_close(
        encoder.encode(["a red fox"]), want.encode(["a red fox"]), rtol=1e-5, atol=1e-5
    )


def test_plain_fp8_files_cast_their_norms(dit, tmp_path):
    # Every tensor fp8, no scales; norms spelled `.weight` as re-saved files do (1-D: simply cast).
    sd = {k.replace("_norm.scale", "_norm.weight"): v for k, v in bfl_state_dict(dit).items()}
    save_file({k: v.to(torch.float8_e4m3fn) for k, v in sd.items()}, str(tmp_path / "plain.safetensors"))
    model = load_transformer(tmp_path / "plain.safetensors", variant="distilled")
    norm = model.transformer.double_blocks[0].img_attn.norm.query_norm.scale
    assert norm.dtype == torch.float32
    assert torch.equal(
        norm, sd["double_blocks.0.img_attn.norm.query_norm.weight"].to(torch.float8_e4m3fn).float()
    )
    tiny = make_tiny_qwen3(seed=7)
    tensors = {k: v.to(torch.float8_e4m3fn) for k, v in model_tensors(tiny).items()}
    save_file(tensors, str(tmp_path / "qwen_fp8.safetensors"))
    encoder = load_text_encoder(tmp_path / "qwen_fp8.safetensors")
    want = text_encoder_from_state_dict({k: v.float() for k, v in tensors.items()})
    torch.testing.assert_close(encoder.encode(["a fox"]), want.encode(["a fox"]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("scale_dtype", [torch.uint8, getattr(torch, "float8_e8m0fnu", None)])
def test_mxfp8_file_loads_with_either_scale_dtype(dit, tmp_path, scale_dtype):
    if scale_dtype is None:
        pytest.skip("this torch has no float8_e8m0fnu")
    sd = bfl_state_dict(dit)
    layer = "single_blocks.0.linear1"
    w = sd.pop(layer + ".weight")
    g = torch.Generator().manual_seed(3)
    values = (torch.randn(w.shape, generator=g) * 4).to(torch.float8_e4m3fn)
    exps = torch.randint(118, 124, (w.shape[0], w.shape[1] // 32), generator=g)
    flat = torch.zeros(-(-w.shape[0] // 128) * 128 * 4, dtype=torch.uint8)
    for r in range(w.shape[0]):
        for k in range(exps.shape[1]):
            flat[swizzled_index(r, k, 4)] = int(exps[r, k])
    sd[layer + ".weight"] = values
    sd[layer + ".weight_scale"] = flat.reshape(-1, 4).view(scale_dtype)
    sd[layer + ".comfy_quant"] = marker({"format": "mxfp8"})
    save_file(sd, str(tmp_path / "mxfp8.safetensors"))
    model = load_transformer(tmp_path / "mxfp8.safetensors", variant="distilled")
    got = dict(linears(model.transformer))[layer].compute_weight(torch.float32, CPU)
    assert torch.equal(got, values.float() * torch.exp2(exps.float() - 127).repeat_interleave(32, 1))


def test_sharded_header_only_file_keeps_every_shards_layers(dit, tmp_path):
    sd = bfl_state_dict(dit)
    whole = tmp_path / "whole.safetensors"
    expected = write_quantised(sd, whole, "int8_tensorwise", "header")
    from safetensors import safe_open

    with safe_open(str(whole), "pt") as f:
        tensors, layers = (
            {k: f.get_tensor(k) for k in f.keys()},
            json.loads(f.metadata()["_quantization_metadata"]),
        )
    folder = tmp_path / "sharded"
    folder.mkdir()
    keys = sorted(tensors)
    halves = {
        "model-00001-of-00002.safetensors": keys[: len(keys) // 2],
        "model-00002-of-00002.safetensors": keys[len(keys) // 2 :],
    }
    for name, part in halves.items():
        own = {k: v for k, v in layers["layers"].items() if k + ".weight" in part}
        header = {"_quantization_metadata": json.dumps({"format_version": "1.0", "layers": own})}
        save_file({k: tensors[k] for k in part}, str(folder / name), metadata=header)
    model = load_transformer(folder, variant="distilled")
    got = dict(linears(model.transformer))
    for key, want in expected.items():
        assert torch.equal(got[key[: -len(".weight")]].compute_weight(torch.float32, CPU), want)


def test_weight_bytes_counts_a_quantised_embedding_dequantised(tmp_path):
    from flux2_core.text.qwen3 import QWEN3_SPEC

    tiny = make_tiny_qwen3(seed=8)
    tensors = model_tensors(tiny, lm_head=False)
    out = {}
    for key, value in tensors.items():
        if value.ndim == 2:
            scale = value.abs().max() / 448
            out[key], out[key[:-7] + ".weight_scale"] = (value / scale).to(torch.float8_e4m3fn), scale
            out[key[:-7] + ".comfy_quant"] = marker({"format": "float8_e4m3fn"})
        else:
            out[key] = value
    save_file(out, str(tmp_path / "te.safetensors"))
    encoder = load_text_encoder(tmp_path / "te.safetensors")
    held = sum(t.numel() * t.element_size() for t in [*encoder.model.parameters(), *encoder.model.buffers()])
    planned = weight_bytes(QWEN3_SPEC, tmp_path / "te.safetensors", torch.float32)[1]
    rotary = sum(b.numel() * b.element_size() for b in encoder.model.rotary_emb.buffers())  # in no file
    assert encoder.model.embed_tokens.weight.dtype == torch.float32  # an embedding is dequantised at load
    assert planned == held - rotary


def test_pairing_reads_text_widths_from_quantised_and_gguf_encoders(tmp_path):
    from flux2_core.text.qwen3 import QWEN3_SPEC

    tiny = make_tiny_qwen3(seed=9)
    tensors = model_tensors(tiny, lm_head=False)
    write_gguf({_llama_name(k): v for k, v in tensors.items()}, tmp_path / "te.gguf", "qwen3",
               {_llama_name(k): "Q8_0" for k, v in tensors.items() if v.ndim == 2})  # fmt: skip
    out = {}
    for key, value in tensors.items():
        out[key] = value.to(torch.float8_e4m3fn) if value.ndim == 2 and "layers" in key else value
    save_file(out, str(tmp_path / "te_fp8.safetensors"))
    for name in ("te.gguf", "te_fp8.safetensors"):
        shape = weight_bytes(QWEN3_SPEC, tmp_path / name, torch.float32)[0]
        assert (shape.hidden_size, shape.output_dim, shape.num_layers) == (32, 96, 28), name


def test_nvfp4_table_is_built_once_per_device_and_dtype():
    from flux2_core.weights import quant

    quant._PAIRS.clear()
    first = quant._e2m1_pairs(torch.float32, "cpu")
    assert quant._e2m1_pairs(torch.float32, torch.device("cpu")) is first  # no new table (no host copy)
    assert quant._e2m1_pairs(torch.bfloat16, "cpu") is not first
    assert first.shape == (256, 2) and first[0x1F].tolist() == [0.5, -6.0]  # high nibble 1, low nibble 15


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_int8_matmul_of_an_all_zero_row_is_zero_in_every_dtype(dit, tmp_path, dtype):
    """The activation scale of an all-zero row is floored; the floor must stay a number in float16 (1e-30
    rounds to 0 there, and 0 / 0 made the row NaN)."""
    sd = bfl_state_dict(dit)
    write_quantised(sd, tmp_path / "int8.safetensors", "int8_tensorwise")
    # format: the int8 matmul in every dtype (auto measures it against dequantising in 16 bits on a CPU)
    net = load_transformer(tmp_path / "int8.safetensors", quant_compute="format").transformer
    layer = dict(linears(net))["single_blocks.0.linear2"]
    x = torch.randn(3, layer.in_features, generator=torch.Generator().manual_seed(1))
    x[1] = 0.0
    with torch.no_grad():
        y = layer.source.linear(layer, x.to(dtype))
    assert y is not None and torch.isfinite(y).all()
    assert torch.equal(y[1], torch.zeros_like(y[1])) and y[0].abs().sum() > 0


def test_int8_layers_fall_back_where_cudas_int8_matmul_refuses_the_shape(dit, tmp_path, monkeypatch):
    """On a GPU ``torch._int_mm`` refuses few rows (M <= 16) and widths that are not multiples of 8; the CPU
    kernel takes them, so this stand-in with CUDA's rules puts the CPU tests on the GPU's branch: the shapes
    are checked before the call (the kernel is never handed one it refuses), such calls multiply the
    dequantised weight instead, and the others still run in int8."""
    from flux2_core.weights import quant_source as quant

    real = torch._int_mm

    def cuda_rules(a, b):
        assert a.shape[0] > 16 and a.shape[1] % 8 == 0 and b.shape[1] % 8 == 0, "a shape CUDA refuses"
        return real(a, b)

    def takes_as_on_cuda(x, out_features):
        return x.shape[0] > 16 and x.shape[1] % 8 == 0 and out_features % 8 == 0

    sd = bfl_state_dict(dit)
    write_quantised(sd, tmp_path / "int8.safetensors", "int8_tensorwise")
    net = load_transformer(tmp_path / "int8.safetensors").transformer
    layer = dict(linears(net))["single_blocks.0.linear2"]
    g = torch.Generator().manual_seed(2)
    few = torch.randn(1, 3, layer.in_features, generator=g)
    many = torch.randn(2, 20, layer.in_features, generator=g)
    with torch.no_grad():
        int8_few, int8_many = layer(few), layer(many)
        monkeypatch.setattr(torch, "_int_mm", cuda_rules)
        monkeypatch.setattr(quant, "int_mm_takes", takes_as_on_cuda)
        assert layer.source.linear(layer, few.reshape(-1, layer.in_features)) is None  # the fallback
        deq = torch.nn.functional.linear(few, layer.compute_weight(torch.float32, CPU))
        torch.testing.assert_close(layer(few), deq)  # dequantise-then-matmul, not int8
        assert not torch.equal(layer(few), int8_few)
        assert torch.equal(layer(many), int8_many)  # 40 rows: int8 as before
