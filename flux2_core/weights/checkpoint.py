"""Reading checkpoint files, lazily: safetensors (a single file or a sharded folder) and GGUF files.

A user may point at a single ``.safetensors`` file, at a folder holding one model's shards (with or without an
``*.index.json``), or at the root of a diffusers repository (``model_index.json`` plus ``transformer/``,
``text_encoder/``, ``vae/``...), in which case the wanted component's subfolder is used, or at a ``.gguf``
file (llama.cpp Qwen3 names are given their Hugging Face names here). Pickle files are never opened.
Opening reads only the headers: names, shapes and dtypes are known at once, and each tensor is read from the
file when it is asked for, so loading never holds the whole file in memory next to the model it fills.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ..errors import Flux2Error
from .gguf_file import GGUFTensors, hf_name, qwen3_config
from .hub import local_path

log = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl")
_READ_ERRORS = (SafetensorError, OSError, RuntimeError, ValueError)
_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": getattr(torch, "float8_e4m3fn", None),
    "F8_E5M2": getattr(torch, "float8_e5m2", None), "F8_E8M0": getattr(torch, "float8_e8m0fnu", None),
}  # fmt: skip


class LazyTensors(Mapping):
    """The tensors of one or more safetensors files by name; a tensor is read when it is looked up.

    A lookup reads the tensor's bytes with plain file reads into memory of its own (never a memory map of the
    file), so loading holds one copy of each weight: the page cache the reads go through is not the process's
    memory, and a tensor handed to another device or cast to another dtype leaves nothing behind.
    ``read_slice`` reads only some rows or columns (one process's shard under tensor parallelism);
    ``bytes_read`` counts the tensor bytes read so far.
    """

    def __init__(self, files: list[Path]):
        self._handles = []
        self._where: dict[str, tuple[object, Path]] = {}
        self._layout: dict[str, tuple[Path, str, tuple[int, ...], int, int]] = {}
        self._scratch: torch.Tensor | None = None
        self.metadata: dict[str, str] = {}
        self.bytes_read = 0
        for file in files:
            try:
                handle = safe_open(str(file), framework="pt", device="cpu")  # validates the header
            except _READ_ERRORS as e:
                raise _unreadable(file, e) from None
            self._handles.append(handle)
            _merge_metadata(self.metadata, handle.metadata() or {})
            layout = _layout(file)
            for key in handle.keys():
                self._where[key] = (handle, file)
                if key in layout:
                    self._layout[key] = (file, *layout[key])

    def __getitem__(self, key: str) -> torch.Tensor:
        handle, file = self._where[key]
        entry = self._layout.get(key)
        try:
            if entry is not None and _DTYPES.get(entry[1]) is not None:
                self.bytes_read += entry[4]
                return _read_tensor(*entry)
            return handle.get_tensor(key)  # a dtype torch has no name for: safetensors' own reader
        except _READ_ERRORS as e:
            raise _unreadable(file, e) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def shape(self, key: str) -> tuple[int, ...]:
        return tuple(self._where[key][0].get_slice(key).get_shape())

    def dtype(self, key: str) -> torch.dtype | str:
        name = self._where[key][0].get_slice(key).get_dtype()
        return _DTYPES.get(name) or name

    def read_as(self, key: str, dtype: torch.dtype) -> torch.Tensor:
        """``self[key]`` cast to ``dtype``; the stored bytes go through one read buffer reused for every
        tensor (freed by ``release_buffers``), so casting while loading leaves no freed blocks behind."""
        entry = self._layout.get(key)
        stored = _DTYPES.get(entry[1]) if entry is not None else None
        if stored is None or stored == dtype or not stored.is_floating_point:
            tensor = self[key]
            return tensor.to(dtype) if tensor.is_floating_point() else tensor
        nbytes = entry[4]
        if self._scratch is None or self._scratch.numel() < nbytes:
            self._scratch = None
            self._scratch = torch.empty(nbytes, dtype=torch.uint8)
        try:
            raw = _read_tensor(*entry, buffer=self._scratch[:nbytes])
        except _READ_ERRORS as e:
            raise _unreadable(entry[0], e) from None
        self.bytes_read += nbytes
        return raw.to(dtype)

    def release_buffers(self) -> None:
        self._scratch = None

    def read_slice(self, key: str, dim: int, ranges: list[tuple[int, int]]) -> torch.Tensor:
        """The rows (``dim`` 0) or columns (``dim`` 1 of a 2-D tensor) ``[start, stop)`` of each of
        ``ranges`` of ``key``, concatenated in order; only their bytes are read from the file."""
        entry = self._layout.get(key)
        stored = _DTYPES.get(entry[1]) if entry is not None else None
        if stored is None or dim not in (0, 1) or len(entry[2]) <= dim or (dim == 1 and len(entry[2]) != 2):
            kind = entry[1] if entry is not None else "unknown"
            raise Flux2Error(f"{key} ({kind}, shape {list(self.shape(key))}) cannot be read in slices")
        file, _, shape, offset, _ = entry
        item, size = stored.itemsize, sum(b - a for a, b in ranges)
        if any(not 0 <= a <= b <= shape[dim] for a, b in ranges):
            raise Flux2Error(f"{key}: slices {ranges} do not fit its shape {list(shape)}")
        row = math.prod(shape[1:]) * item  # bytes per index of dim 0
        if dim == 0:
            spans = [(offset + a * row, (b - a) * row) for a, b in ranges]
            out_shape = (size, *shape[1:])
        else:
            spans = [
                (offset + r * row + a * item, (b - a) * item) for r in range(shape[0]) for a, b in ranges
            ]
            out_shape = (shape[0], size)
        buffer = torch.empty(math.prod(out_shape) * item, dtype=torch.uint8)
        try:
            _read_spans(file, spans, buffer)
        except _READ_ERRORS as e:
            raise _unreadable(file, e) from None
        self.bytes_read += buffer.numel()
        return buffer.view(stored).reshape(out_shape)


def read_tensor(tensors: Mapping, key: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``tensors[key]``, floating tensors cast to ``dtype`` if given (read straight into it when lazy)."""
    if dtype is None:
        return tensors[key]
    if hasattr(type(tensors), "read_as"):  # lazy: read straight into the dtype
        return tensors.read_as(key, dtype)
    tensor = tensors[key]
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def _layout(file: Path) -> dict[str, tuple[str, tuple[int, ...], int, int]]:
    """{name: (dtype, shape, absolute byte offset, byte count)} from a (validated) safetensors header."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    start = 8 + size
    return {
        name: (entry["dtype"], tuple(entry["shape"]), start + entry["data_offsets"][0],
               entry["data_offsets"][1] - entry["data_offsets"][0])
        for name, entry in header.items()
        if name != "__metadata__"
    }  # fmt: skip


def _read_tensor(
    file: Path,
    dtype: str,
    shape: tuple[int, ...],
    offset: int,
    nbytes: int,
    buffer: torch.Tensor | None = None,
) -> torch.Tensor:
    buffer = torch.empty(nbytes, dtype=torch.uint8) if buffer is None else buffer
    _read_spans(file, [(offset, nbytes)], buffer)
    return buffer.view(_DTYPES[dtype]).reshape(shape)


def _read_spans(file: Path, spans: list[tuple[int, int]], buffer: torch.Tensor) -> None:
    """Read the byte spans (offset, count) of ``file`` one after another into ``buffer``; adjacent spans
    are read as one."""
    merged: list[list[int]] = []
    for offset, count in spans:
        if merged and merged[-1][0] + merged[-1][1] == offset:
            merged[-1][1] += count
        elif count:
            merged.append([offset, count])
    if not merged:
        return
    view, at = memoryview(buffer.numpy()), 0
    with open(file, "rb", buffering=0) as f:
        for offset, count in merged:
            f.seek(offset)
            done = 0
            while done < count:
                got = f.readinto(view[at + done : at + count])
                if not got:
                    raise OSError(f"the file ends {count - done} bytes before tensor data it lists")
                done += got
            at += count


def _merge_metadata(merged: dict[str, str], shard: dict[str, str]) -> None:
    """Header metadata over shards; the layers each shard's ``_quantization_metadata`` lists all count."""
    for key, value in shard.items():
        if key == "_quantization_metadata" and key in merged:
            try:
                old, new = json.loads(merged[key]), json.loads(value)
                old.setdefault("layers", {}).update(new.get("layers", {}))
                value = json.dumps(old)
            except (json.JSONDecodeError, AttributeError, TypeError):
                pass  # the quantisation reader reports the broken header
        merged[key] = value


def tensor_shape(tensors: Mapping, key: str) -> tuple[int, ...]:
    """The (logical) shape of ``tensors[key]`` without reading it when the mapping is lazy."""
    return tensors.shape(key) if hasattr(type(tensors), "shape") else tuple(tensors[key].shape)


def tensor_dtype(tensors: Mapping, key: str):
    """The stored dtype of ``tensors[key]``: a torch dtype, a GGUF block type, or a safetensors type name."""
    return tensors.dtype(key) if hasattr(type(tensors), "dtype") else tensors[key].dtype


class RenamedTensors(Mapping):
    """A lazy tensor mapping seen under other names (``rename`` maps a stored name to the one exposed)."""

    def __init__(self, tensors: Mapping, rename):
        self._tensors = tensors
        self._names = {rename(k): k for k in tensors}
        self.metadata = getattr(tensors, "metadata", {})

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._tensors[self._names[key]]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def shape(self, key: str) -> tuple[int, ...]:
        return tensor_shape(self._tensors, self._names[key])

    def dtype(self, key: str):
        return tensor_dtype(self._tensors, self._names[key])


@dataclass
class Checkpoint:
    """The tensors of one model component (read lazily), with what the files say about it."""

    path: Path  # what was opened: a file, or a folder of shards
    tensors: Mapping[str, torch.Tensor]
    metadata: dict[str, str] = field(default_factory=dict)  # safetensors header metadata, merged over shards
    config: dict | None = None  # config.json beside the weights (diffusers / transformers layout)
    model_index: dict | None = None  # model_index.json of the diffusers repository, if any
    folder: Path | None = None  # the folder the weights came from (for a tokenizer next to them)

    @property
    def name(self) -> str:
        return self.path.name


def open_checkpoint(path: str | Path, component: str) -> Checkpoint:
    """Open the safetensors weights of ``component`` ("transformer", "text_encoder" or "vae") at ``path``:
    a file, a folder, or a Hugging Face Hub id (``org/repo``, ``org/repo@revision``, ``org/repo/file``)."""
    path = local_path(path, component)
    what = component.replace("_", " ")
    if not path.exists():
        raise Flux2Error(f"{path} does not exist: check the path of the {what} file")
    if path.is_file() and _shard_index_naming(path) is not None:
        log.info("%s is one shard of %s: loading every shard", path.name, path.parent)
        path = path.parent  # e.g. one shard of an HF Qwen3 folder picked from ComfyUI's file list
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _open_gguf(path)
    if path.is_file():
        check_suffix(path)
        # A weights file inside a diffusers repository (repo/transformer/x.safetensors) or beside its index.
        model_index = _read_json(path.parent / "model_index.json") or _read_json(
            path.parent.parent / "model_index.json"
        )
        tensors = LazyTensors([path])
        return Checkpoint(path, tensors, tensors.metadata, None, model_index, folder=path.parent)

    model_index = _read_json(path / "model_index.json") or _read_json(path.parent / "model_index.json")
    if (path / component).is_dir():
        path = path / component
    files = _shard_files(path)
    if not files:
        raise Flux2Error(
            f"{path} holds no .safetensors file: point at the {what} weights (a .safetensors file or a "
            "folder of them)"
        )
    tensors = LazyTensors(files)
    return Checkpoint(path, tensors, tensors.metadata, _read_json(path / "config.json"), model_index, path)


def _open_gguf(path: Path) -> Checkpoint:
    tensors = GGUFTensors(path)
    fields = tensors.metadata
    metadata = {k: v for k, v in fields.items() if isinstance(v, str)}
    if "general.name" in metadata:
        metadata.setdefault("name", metadata["general.name"])
    config = None
    if str(fields.get("general.architecture", "")).startswith("qwen3"):  # llama.cpp names -> HF names
        tensors, config = RenamedTensors(tensors, hf_name), qwen3_config(fields)
    return Checkpoint(path, tensors, metadata, config, None, folder=path.parent)


def _unreadable(file: Path, error: Exception) -> Flux2Error:
    return Flux2Error(
        f"{file.name} could not be read ({error}): the file is truncated or corrupt, download it again"
    )


def check_suffix(path: Path, kind: str = "model", accepted: str = "a .safetensors or .gguf file") -> None:
    """Refuse pickle files (loading them can run code) and anything but ``accepted``, in plain words."""
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        raise Flux2Error(
            f"{path.name} is a pickle file ({suffix}), which is never loaded because it can run code: "
            f"use the .safetensors release of the {kind} (or convert it to safetensors)"
        )
    if suffix != ".safetensors":
        raise Flux2Error(f"{path.name} is not {accepted}: only those {kind} files are supported")


def _shard_index_naming(file: Path) -> Path | None:
    """The ``*.safetensors.index.json`` beside ``file`` whose weight map names it, if any."""
    for index in sorted(file.parent.glob("*.safetensors.index.json")):
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
            continue
        if isinstance(weight_map, dict) and file.name in weight_map.values():
            return index
    return None


def _shard_files(folder: Path) -> list[Path]:
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        weight_map = (_read_json(indexes[0]) or {}).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise Flux2Error(
                f"{indexes[0]} has no valid weight_map (tensor name -> shard file): repair or remove it"
            )
        names = sorted(set(weight_map.values()))
        outside = [
            n for n in names if Path(n).name != n or n in (".", "..") or not n.endswith(".safetensors")
        ]
        if outside:
            raise Flux2Error(
                f"{indexes[0].name} names {outside[0]!r}: a shard index may only name .safetensors "
                "files in its own folder; repair the index"
            )
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise Flux2Error(
                f"{folder} is missing {len(missing)} shard(s) listed in {indexes[0].name} ({missing[0]}...): "
                "download the remaining files"
            )
        return [folder / n for n in names]
    return sorted(folder.glob("*.safetensors"))


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Flux2Error(f"{path} is not valid JSON ({e}): repair or remove it") from None
    if not isinstance(data, dict):
        raise Flux2Error(f"{path} holds a JSON {type(data).__name__}, not an object: repair or remove it")
    return data
