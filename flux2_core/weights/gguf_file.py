"""Open .gguf model files (city96-style DiT GGUFs, llama.cpp Qwen3 text encoders) as a lazy tensor mapping.

``GGUFTensors(path)`` memory-maps the file and behaves like a read-only dict of tensor name -> tensor, read
only when asked for. Plain tensors (F32, F16, BF16) come back as float tensors of their logical torch shape;
block-quantised ones (Q8_0, Q4_K, ...) come back as their raw bytes, ``[rows..., bytes_per_row]`` uint8,
ready for ``gguf_quants.dequantize`` on any device. ``shape``, ``dtype`` and ``quant_type`` describe a tensor
without reading it, and ``metadata`` holds the file's key-value fields.

For llama.cpp text-encoder files, ``hf_name`` turns llama.cpp tensor names into Hugging Face Qwen3 names
and ``qwen3_config`` turns the metadata into transformers ``config.json`` keys.

Reading needs the ``gguf`` package (``pip install gguf``); it is imported only when a file is opened.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import Flux2Error
from .gguf_quants import BF16, PLAIN_TYPES, GGMLType, dequantize, ggml_type

# Arrays longer than this (tokenizer vocabularies, merges, scores) stay out of ``metadata``; read them with
# ``GGUFTensors.field``.
MAX_METADATA_ARRAY = 1024

_HOST_FIELDS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")


def _gguf_module() -> Any:
    try:
        import gguf
    except ImportError as e:
        raise Flux2Error("reading .gguf files needs the gguf package: pip install gguf") from e
    return gguf


def _corrupt(path: Path, why: object) -> Flux2Error:
    return Flux2Error(
        f"{path.name} could not be read as a GGUF file ({why}): "
        "the file is truncated or corrupt, download it again"
    )


def _scalar(value: Any, vtype: Any, gguf: Any) -> object:
    vt = gguf.GGUFValueType
    if vtype == vt.STRING:
        return bytes(value).decode("utf-8", errors="replace")
    item = value.tolist()[0] if isinstance(value, np.ndarray) else value
    if vtype == vt.FLOAT32:
        # the shortest decimal that round-trips in float32: 1e-06, not 9.999999974752427e-07
        return float(str(np.float32(item)))
    if vtype == vt.BOOL:
        return bool(item)
    return item


def _field_value(field: Any, gguf: Any, max_items: int | None = None) -> tuple[bool, object]:
    """(kept, value) of one reader field; arrays above ``max_items`` are not converted."""
    types = field.types
    if not types:
        return True, None
    if types[0] == gguf.GGUFValueType.ARRAY:
        if max_items is not None and len(field.data) > max_items:
            return False, None
        sub = types[-1]
        if sub == gguf.GGUFValueType.ARRAY:
            return False, None  # nested arrays: not used by any model this pack loads
        return True, [_scalar(field.parts[i], sub, gguf) for i in field.data]
    return True, _scalar(field.parts[field.data[-1]], types[0], gguf)


class GGUFTensors(Mapping):
    """A read-only, lazily read mapping of tensor name -> tensor for one .gguf file."""

    def __init__(self, path: Path | str):
        self.path = Path(path)
        gguf = _gguf_module()
        if not self.path.is_file():
            raise Flux2Error(f"GGUF file not found: {self.path}")
        try:
            reader = gguf.GGUFReader(self.path, "c")  # copy-on-write: tensors share the file's pages
        except Exception as e:  # the reader raises ValueError, IndexError, KeyError, ... on damaged files
            raise _corrupt(self.path, e) from e
        self._byte_swapped = reader.byte_order == "S"
        self._types: dict[str, int] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._data: dict[str, np.ndarray] = {}
        for t in reader.tensors:
            if t.data.nbytes != t.n_bytes:
                raise _corrupt(self.path, f"tensor {t.name} is short")
            self._types[t.name] = int(t.tensor_type)
            self._shapes[t.name] = tuple(int(d) for d in reversed(t.shape.tolist()))
            self._data[t.name] = t.data
        self._fields = reader.fields
        self.metadata: dict[str, object] = {}
        for name, field in reader.fields.items():
            if name in _HOST_FIELDS:
                continue
            kept, value = _field_value(field, gguf, MAX_METADATA_ARRAY)
            if kept:
                self.metadata[name] = value
        self._reader: Any = reader

    # ---- mapping ----

    def __iter__(self) -> Iterator[str]:
        return iter(self._types)

    def __len__(self) -> int:
        return len(self._types)

    def __contains__(self, key: object) -> bool:
        return key in self._types

    def __getitem__(self, key: str) -> torch.Tensor:
        qtype = self._types[key]
        if self._reader is None:
            raise Flux2Error(f"{self.path.name} was closed; open it again to read {key}")
        data = self._data[key]
        if self._byte_swapped and (qtype == BF16 or qtype not in PLAIN_TYPES):
            raise Flux2Error(
                f"{self.path.name} is a big-endian GGUF; only little-endian files (the usual kind) load"
            )
        if qtype in PLAIN_TYPES and qtype != BF16:
            # copy out of the read-only map (also puts byte-swapped data in host order)
            arr = np.array(data, dtype=data.dtype.newbyteorder("="), copy=True)
            return torch.from_numpy(arr).reshape(self._shapes[key])
        # No copy: the bytes stay the memory-mapped file's pages (read once, shared, never duplicated in
        # memory); a write would go to a private copy of the page (the map is copy-on-write), never the file.
        raw = torch.from_numpy(data)
        if qtype == BF16:
            return raw.reshape(-1).view(torch.bfloat16).reshape(self._shapes[key])
        return raw

    # ---- description without reading ----

    def shape(self, key: str) -> tuple[int, ...]:
        """The logical torch shape (GGML stores dimensions innermost first; this is the reverse)."""
        return self._shapes[key]

    def quant_type(self, key: str) -> int:
        """The GGML type id the tensor is stored as."""
        return self._types[key]

    def dtype(self, key: str) -> torch.dtype | GGMLType:
        """A torch dtype for plain tensors (F32, F16, BF16, ...), else the block format's ``GGMLType``."""
        qtype = self._types[key]
        return PLAIN_TYPES[qtype] if qtype in PLAIN_TYPES else ggml_type(qtype)

    def dequantized(
        self, key: str, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """The tensor decoded to ``dtype`` on ``device`` (quantised bytes move there first, then decode)."""
        qtype = self._types[key]
        t = self[key]
        if qtype in PLAIN_TYPES:
            return t.to(device=device, dtype=dtype)
        return dequantize(t.to(device), qtype, self._shapes[key], dtype)

    def field(self, name: str) -> object:
        """One metadata value in full, including the long arrays left out of ``metadata``."""
        f = self._fields.get(name)
        if f is None:
            raise KeyError(name)
        return _field_value(f, _gguf_module())[1]

    # ---- lifetime ----

    def close(self) -> None:
        """Release the memory map; tensors already read stay valid."""
        self._reader = None
        self._data = {}
        self._fields = {}

    def __enter__(self) -> GGUFTensors:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFTensors({str(self.path)!r}, {len(self)} tensors)"


# ---- llama.cpp Qwen3 text encoders ----------------------------------------------------------------------

# per-block module names, llama.cpp -> Hugging Face (matched exactly, so attn_q_norm never becomes attn_q)
LLAMA_CPP_QWEN3_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_norm": "post_attention_layernorm",
}

LLAMA_CPP_QWEN3_TOP_NAMES: dict[str, str] = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

_BLOCK_KEY = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
_TOP_KEY = re.compile(r"(\w+)\.(weight|bias)")


def hf_name(key: str) -> str:
    """The Hugging Face Qwen3 name of a llama.cpp tensor name; names it does not know come back unchanged.

    ``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``. No Q/K permutation is needed
    for qwen3 files: the weights are stored in Hugging Face order.
    """
    m = _BLOCK_KEY.fullmatch(key)
    if m is not None:
        module = LLAMA_CPP_QWEN3_NAMES.get(m.group(2))
        return key if module is None else f"model.layers.{m.group(1)}.{module}.{m.group(3)}"
    m = _TOP_KEY.fullmatch(key)
    if m is not None and m.group(1) in LLAMA_CPP_QWEN3_TOP_NAMES:
        return f"{LLAMA_CPP_QWEN3_TOP_NAMES[m.group(1)]}.{m.group(2)}"
    return key


# llama.cpp metadata key (after "<arch>.") -> transformers config.json key
_QWEN3_CONFIG_KEYS = {
    "rope.freq_base": "rope_theta",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "block_count": "num_hidden_layers",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "context_length": "max_position_embeddings",
    "vocab_size": "vocab_size",
}


def qwen3_config(metadata: Mapping[str, object]) -> dict[str, object]:
    """transformers-style config keys (``rope_theta``, ``rms_norm_eps``, ``hidden_size``, ...) found in the
    metadata of a llama.cpp Qwen3 GGUF (architecture ``qwen3`` or ``qwen3vl``); absent keys are left out."""
    arch = metadata.get("general.architecture") or "qwen3"
    config: dict[str, object] = {}
    for src, dst in _QWEN3_CONFIG_KEYS.items():
        value = metadata.get(f"{arch}.{src}")
        if value is not None:
            config[dst] = value
    return config
