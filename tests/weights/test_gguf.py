"""GGUF reading and GGML dequantisation, checked against the gguf package's own numpy decoder."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from flux2_core.errors import Flux2Error
from flux2_core.weights.gguf_file import GGUFTensors, hf_name, qwen3_config
from flux2_core.weights.gguf_quants import (
    GGML_TYPES,
    GGMLType,
    block_size,
    dequantize,
    has_torch_kernel,
    type_name,
)

Q = gguf.GGMLQuantizationType
QUANTIZABLE = [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
K_QUANTS = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
# byte offsets of the fp16 super-block scales (d, and dmin where there is one)
K_SCALE_OFFSETS = {Q.Q2_K: (80, 82), Q.Q3_K: (108,), Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}


def _values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    x.reshape(-1)[:4] = [0.0, -0.0, 1e-30, -3.5e4]  # zeros, a subnormal-ish tiny and a big value
    return x


def _k_blocks(rng: np.random.Generator, qt: Q, rows: int, cols: int) -> np.ndarray:
    """Random K-quant bytes [rows, cols/256*type_size] with sane per-block fp16 scales."""
    elems, nbytes = gguf.GGML_QUANT_SIZES[qt]
    blocks = rng.integers(0, 256, size=(rows * cols // elems, nbytes), dtype=np.uint8)
    for off in K_SCALE_OFFSETS[qt]:
        scale = rng.uniform(0.001, 0.05, size=blocks.shape[0]).astype(np.float16)
        blocks[:, off : off + 2] = scale.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def _encode(rng: np.random.Generator, qt: Q, shape: tuple[int, ...]) -> np.ndarray:
    """A tensor of logical ``shape`` stored as ``qt``, as the array GGUFWriter.add_tensor takes."""
    if qt in K_QUANTS:
        rows = int(np.prod(shape[:-1]))
        return _k_blocks(rng, qt, rows, shape[-1]).reshape(*shape[:-1], -1)
    return gguf.quants.quantize(_values(rng, shape), qt)


def _as_bytes(arr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(arr).view(np.uint8).copy())


ALL_TORCH_TYPES = QUANTIZABLE + K_QUANTS


@pytest.mark.parametrize("qt", ALL_TORCH_TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("shape", [(5, 512), (2, 3, 256)], ids=["2d", "3d"])
def test_dequantize_matches_gguf_bit_for_bit(qt: Q, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(int(qt) * 7 + len(shape))
    stored = _encode(rng, qt, shape)
    oracle = torch.from_numpy(gguf.quants.dequantize(stored, qt).astype(np.float32))
    assert tuple(oracle.shape) == shape
    raw = _as_bytes(stored)
    ours = dequantize(raw, int(qt), shape)
    assert ours.dtype == torch.float32 and tuple(ours.shape) == shape
    assert torch.equal(ours, oracle)
    # a flat byte buffer decodes the same
    assert torch.equal(dequantize(raw.reshape(-1), int(qt), shape), oracle)
    assert has_torch_kernel(int(qt))


@pytest.mark.parametrize("qt", [Q.Q8_0, Q.Q4_K, Q.Q6_K, Q.BF16], ids=lambda q: q.name)
def test_bfloat16_output_is_the_float32_result_cast(qt: Q) -> None:
    rng = np.random.default_rng(3)
    stored = _encode(rng, qt, (4, 256))
    raw = _as_bytes(stored)
    f32 = dequantize(raw, int(qt), (4, 256))
    bf16 = dequantize(raw, int(qt), (4, 256), dtype=torch.bfloat16)
    assert bf16.dtype == torch.bfloat16
    assert torch.equal(bf16, f32.to(torch.bfloat16))


def test_rows_are_decoded_independently() -> None:
    # block scales differ per row: a row-order or block-stride mistake moves values between rows
    rng = np.random.default_rng(11)
    stored = _k_blocks(rng, Q.Q4_K, 6, 768)
    full = dequantize(_as_bytes(stored), int(Q.Q4_K), (6, 768))
    for r in range(6):
        row = dequantize(_as_bytes(stored[r]), int(Q.Q4_K), (768,))
        assert torch.equal(full[r], row)
    assert not torch.equal(full[0], full[1])


def test_type_table_matches_gguf() -> None:
    for qid, (name, elems, nbytes) in GGML_TYPES.items():
        gq = Q(qid)
        assert name == gq.name == type_name(qid)
        assert (elems, nbytes) == gguf.GGML_QUANT_SIZES[gq] == block_size(qid)


def test_fallback_type_decodes_through_gguf() -> None:
    qt = Q.IQ4_NL
    assert not has_torch_kernel(int(qt))
    rng = np.random.default_rng(5)
    blocks = rng.integers(0, 256, size=(4 * 64 // 32, 18), dtype=np.uint8)
    blocks[:, 0:2] = np.full(blocks.shape[0], 0.02, dtype=np.float16).view(np.uint8).reshape(-1, 2)
    stored = blocks.reshape(4, -1)
    oracle = torch.from_numpy(gguf.quants.dequantize(stored, qt))
    ours = dequantize(_as_bytes(stored), int(qt), (4, 64))
    assert ours.device.type == "cpu" and ours.dtype == torch.float32
    assert torch.equal(ours, oracle)


def test_wrong_byte_count_is_an_error() -> None:
    raw = torch.zeros(34 * 4 - 1, dtype=torch.uint8)
    with pytest.raises(Flux2Error, match=r"Q8_0.*135 were found.*corrupt"):
        dequantize(raw, int(Q.Q8_0), (4, 32))
    with pytest.raises(Flux2Error, match="whole blocks"):
        dequantize(torch.zeros(144, dtype=torch.uint8), int(Q.Q4_K), (2, 128))


def test_unknown_type_id_is_an_error() -> None:
    with pytest.raises(Flux2Error, match="type 99"):
        dequantize(torch.zeros(8, dtype=torch.uint8), 99, (2,))
    with pytest.raises(Flux2Error, match="type 99"):
        type_name(99)
    assert not has_torch_kernel(99)


# ---- files ----------------------------------------------------------------------------------------------

FILE_TENSORS = {
    # name: (type, logical torch shape)
    "double_blocks.0.img_attn.norm.query_norm.scale": (Q.F32, (64,)),
    "img_in.weight": (Q.F16, (64, 96)),
    "txt_in.weight": (Q.BF16, (48, 64)),
    "double_blocks.0.img_attn.qkv.weight": (Q.Q8_0, (96, 64)),
    "a.q4_0": (Q.Q4_0, (6, 64)),
    "a.q4_1": (Q.Q4_1, (6, 64)),
    "a.q5_0": (Q.Q5_0, (6, 64)),
    "a.q5_1": (Q.Q5_1, (6, 64)),
    "k.q2_k": (Q.Q2_K, (3, 512)),
    "k.q3_k": (Q.Q3_K, (3, 512)),
    "k.q4_k": (Q.Q4_K, (3, 512)),
    "k.q5_k": (Q.Q5_K, (3, 512)),
    "k.q6_k": (Q.Q6_K, (3, 512)),
}


def _write(path: Path, arch: str, tensors: dict[str, np.ndarray], types: dict[str, Q], kv=None) -> None:
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_BF16)
    for key, value in (kv or {}).items():
        value(w, key)
    for name, arr in tensors.items():
        qt = types[name]
        if qt in (Q.F32, Q.F16):
            w.add_tensor(name, arr)
        else:
            w.add_tensor(name, arr, raw_dtype=qt)  # uint8 bytes: the writer derives the shape from them
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def flux_file(tmp_path_factory) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("gguf") / "tiny-flux.gguf"
    tensors = {name: _encode(rng, qt, shape) for name, (qt, shape) in FILE_TENSORS.items()}
    kv = {
        "test.name": lambda w, k: w.add_string(k, "tiny ünï"),
        "test.count": lambda w, k: w.add_uint32(k, 7),
        "test.eps": lambda w, k: w.add_float32(k, 1e-6),
        "test.flag": lambda w, k: w.add_bool(k, True),
        "test.ints": lambda w, k: w.add_array(k, [3, 1, 4]),
        "test.words": lambda w, k: w.add_array(k, ["a", "b"]),
        "tokenizer.ggml.tokens": lambda w, k: w.add_array(k, [f"t{i}" for i in range(3000)]),
    }
    _write(path, "flux", tensors, {n: qt for n, (qt, _) in FILE_TENSORS.items()}, kv)
    return path


@pytest.fixture(scope="module")
def oracle(flux_file: Path) -> dict[str, tuple[int, np.ndarray, np.ndarray]]:
    """name -> (type id, reader bytes/array, gguf float32 dequant) from gguf's own reader."""
    r = gguf.GGUFReader(flux_file)
    return {
        t.name: (
            int(t.tensor_type),
            np.array(t.data),
            np.array(gguf.quants.dequantize(t.data, t.tensor_type)),
        )
        for t in r.tensors
    }


@pytest.mark.filterwarnings("error")
def test_file_shapes_dtypes_and_values(flux_file: Path, oracle) -> None:
    f = GGUFTensors(flux_file)
    assert set(f) == set(FILE_TENSORS) and len(f) == len(FILE_TENSORS)
    assert "img_in.weight" in f and "nope" not in f
    plain = {Q.F32: torch.float32, Q.F16: torch.float16, Q.BF16: torch.bfloat16}
    for name, (qt, shape) in FILE_TENSORS.items():
        qid, data, deq = oracle[name]
        assert f.shape(name) == shape
        assert f.quant_type(name) == int(qt) == qid
        t = f[name]
        if qt in plain:
            assert f.dtype(name) == plain[qt]
            assert t.dtype == plain[qt] and tuple(t.shape) == shape
            assert torch.equal(t.float(), torch.from_numpy(deq))
        else:
            assert f.dtype(name) == GGMLType(qt.name, int(qt))
            elems, nbytes = gguf.GGML_QUANT_SIZES[qt]
            assert t.dtype == torch.uint8
            assert tuple(t.shape) == (*shape[:-1], shape[-1] // elems * nbytes)
            assert torch.equal(t, torch.from_numpy(data))
            assert torch.equal(dequantize(t, f.quant_type(name), f.shape(name)), torch.from_numpy(deq))
        assert torch.equal(f.dequantized(name), torch.from_numpy(deq))
    # quantised tensors are views of the copy-on-write map: writable, and a write never reaches the file
    t = f["k.q4_k"]
    before = flux_file.read_bytes()
    t[0, 0] ^= 0xFF
    assert flux_file.read_bytes() == before
    f.close()


def test_torch_shape_is_the_reverse_of_ggml_shape(flux_file: Path) -> None:
    r = gguf.GGUFReader(flux_file)
    f = GGUFTensors(flux_file)
    for t in r.tensors:
        assert f.shape(t.name) == tuple(reversed([int(d) for d in t.shape]))
    assert f.shape("img_in.weight") == (64, 96)  # stored by GGML as [96, 64]
    assert f.shape("double_blocks.0.img_attn.norm.query_norm.scale") == (64,)


def test_metadata(flux_file: Path) -> None:
    with GGUFTensors(flux_file) as f:
        md = f.metadata
        assert md["general.architecture"] == "flux"
        assert md["general.quantization_version"] == gguf.GGML_QUANT_VERSION
        assert md["general.file_type"] == int(gguf.LlamaFileType.MOSTLY_BF16)
        assert md["test.name"] == "tiny ünï"
        assert md["test.count"] == 7 and isinstance(md["test.count"], int)
        assert md["test.eps"] == 1e-6
        assert md["test.flag"] is True
        assert md["test.ints"] == [3, 1, 4]
        assert md["test.words"] == ["a", "b"]
        assert "tokenizer.ggml.tokens" not in md  # too long to convert at open time
        tokens = f.field("tokenizer.ggml.tokens")
        assert isinstance(tokens, list) and len(tokens) == 3000 and tokens[2999] == "t2999"
        with pytest.raises(KeyError):
            f.field("missing.key")
    with pytest.raises(Flux2Error, match="closed"):
        f["img_in.weight"]


@pytest.mark.parametrize("keep", ["header", "half", "short_tail"])
def test_truncated_file_is_an_error(flux_file: Path, tmp_path: Path, keep: str) -> None:
    data = flux_file.read_bytes()
    cut = {"header": 100, "half": len(data) // 2, "short_tail": len(data) - 100}[keep]
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:cut])
    with pytest.raises(Flux2Error, match="could not be read.*truncated or corrupt, download it again"):
        GGUFTensors(bad)


def test_not_a_gguf_or_missing_is_an_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"\x00" * 4096)
    with pytest.raises(Flux2Error, match="truncated or corrupt"):
        GGUFTensors(junk)
    with pytest.raises(Flux2Error, match="not found"):
        GGUFTensors(tmp_path / "absent.gguf")


# ---- Qwen3 text encoder naming ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("llama", "hf"),
    [
        ("blk.0.attn_q.weight", "model.layers.0.self_attn.q_proj.weight"),
        ("blk.0.attn_q_norm.weight", "model.layers.0.self_attn.q_norm.weight"),
        ("blk.11.attn_k_norm.weight", "model.layers.11.self_attn.k_norm.weight"),
        ("blk.2.attn_k.weight", "model.layers.2.self_attn.k_proj.weight"),
        ("blk.2.attn_v.bias", "model.layers.2.self_attn.v_proj.bias"),
        ("blk.35.attn_output.weight", "model.layers.35.self_attn.o_proj.weight"),
        ("blk.1.attn_norm.weight", "model.layers.1.input_layernorm.weight"),
        ("blk.1.ffn_norm.weight", "model.layers.1.post_attention_layernorm.weight"),
        ("blk.1.ffn_gate.weight", "model.layers.1.mlp.gate_proj.weight"),
        ("blk.1.ffn_up.weight", "model.layers.1.mlp.up_proj.weight"),
        ("blk.1.ffn_down.weight", "model.layers.1.mlp.down_proj.weight"),
        ("token_embd.weight", "model.embed_tokens.weight"),
        ("output_norm.weight", "model.norm.weight"),
        ("output.weight", "lm_head.weight"),
        ("rope_freqs.weight", "rope_freqs.weight"),  # unknown names pass through
        ("blk.0.attn_qkv.weight", "blk.0.attn_qkv.weight"),
    ],
)
def test_hf_name(llama: str, hf: str) -> None:
    assert hf_name(llama) == hf


def test_qwen3_file_maps_to_hf_names_without_permutation(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    q = rng.standard_normal((64, 32)).astype(np.float32)
    tensors = {
        "token_embd.weight": rng.standard_normal((100, 32)).astype(np.float16),
        "blk.0.attn_q.weight": gguf.quants.quantize(q, Q.Q8_0),
        "blk.0.attn_q_norm.weight": rng.standard_normal(16).astype(np.float32),
        "output_norm.weight": rng.standard_normal(32).astype(np.float32),
    }
    types = {
        "token_embd.weight": Q.F16,
        "blk.0.attn_q.weight": Q.Q8_0,
        "blk.0.attn_q_norm.weight": Q.F32,
        "output_norm.weight": Q.F32,
    }
    kv = {
        "qwen3.block_count": lambda w, k: w.add_uint32(k, 1),
        "qwen3.embedding_length": lambda w, k: w.add_uint32(k, 32),
        "qwen3.attention.head_count": lambda w, k: w.add_uint32(k, 4),
        "qwen3.rope.freq_base": lambda w, k: w.add_float32(k, 1_000_000.0),
        "qwen3.attention.layer_norm_rms_epsilon": lambda w, k: w.add_float32(k, 1e-6),
    }
    path = tmp_path / "qwen3.gguf"
    _write(path, "qwen3", tensors, types, kv)

    f = GGUFTensors(path)
    assert f.metadata["general.architecture"] == "qwen3"
    hf = {hf_name(k): k for k in f}
    assert set(hf) == {
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.q_norm.weight",
        "model.norm.weight",
    }
    assert f.shape(hf["model.layers.0.self_attn.q_proj.weight"]) == (64, 32)
    assert f.shape(hf["model.embed_tokens.weight"]) == (100, 32)
    # the rows come back in the order they were written: no rope permutation for qwen3
    expected_q = torch.from_numpy(gguf.quants.dequantize(tensors["blk.0.attn_q.weight"], Q.Q8_0))
    assert torch.equal(f.dequantized("blk.0.attn_q.weight"), expected_q)
    assert (expected_q - torch.from_numpy(q)).abs().max() < 0.05
    assert torch.equal(f["blk.0.attn_q_norm.weight"], torch.from_numpy(tensors["blk.0.attn_q_norm.weight"]))
    assert torch.equal(f["token_embd.weight"], torch.from_numpy(tensors["token_embd.weight"]))
    cfg = qwen3_config(f.metadata)
    assert cfg["rope_theta"] == 1_000_000.0 and cfg["rms_norm_eps"] == 1e-6
    assert cfg["num_hidden_layers"] == 1 and cfg["hidden_size"] == 32 and cfg["num_attention_heads"] == 4
    assert "intermediate_size" not in cfg
    assert qwen3_config({"general.architecture": "qwen3vl", "qwen3vl.rope.freq_base": 5e6}) == {
        "rope_theta": 5e6
    }


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("qt", ALL_TORCH_TYPES, ids=lambda q: q.name)
def test_dequantize_on_cuda_matches_gguf(qt: Q) -> None:
    rng = np.random.default_rng(int(qt))
    stored = _encode(rng, qt, (8, 1024))
    oracle = torch.from_numpy(gguf.quants.dequantize(stored, qt).astype(np.float32))
    ours = dequantize(_as_bytes(stored).cuda(), int(qt), (8, 1024))
    assert ours.is_cuda
    assert torch.equal(ours.cpu(), oracle)


@pytest.mark.parametrize(
    ("qt", "np_dtype"), [(Q.I8, np.int8), (Q.I16, np.int16), (Q.I32, np.int32), (Q.F64, np.float64)]
)
def test_plain_integer_and_f64_types(qt: Q, np_dtype) -> None:
    values = np.arange(-6, 6, dtype=np_dtype).reshape(3, 4) * 3
    ours = dequantize(_as_bytes(values), int(qt), (3, 4))
    assert torch.equal(ours, torch.from_numpy(values.astype(np.float32)))
