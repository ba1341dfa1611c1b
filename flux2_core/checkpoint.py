"""Reading checkpoint files: safetensors only, memory-mapped, from a single file or a (sharded) folder.

A user may point at a single ``.safetensors`` file, at a folder holding one model's shards (with or without an
``*.index.json``), or at the root of a diffusers repository (``model_index.json`` plus ``transformer/``,
``text_encoder/``, ``vae/``...), in which case the wanted component's subfolder is used. Pickle files
are never opened. ``load_into`` fills a module that was built on the meta device, strictly.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .errors import Flux2Error

log = logging.getLogger(__name__)

PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl")
UNSUPPORTED_SUFFIXES = {".gguf": "GGUF"}


@dataclass
class Checkpoint:
    """The tensors of one model component, with what the files say about it."""

    path: Path  # what was opened: a file, or a folder of shards
    tensors: dict[str, torch.Tensor]
    metadata: dict[str, str] = field(default_factory=dict)  # safetensors header metadata, merged over shards
    config: dict | None = None  # config.json beside the weights (diffusers / transformers layout)
    model_index: dict | None = None  # model_index.json of the diffusers repository, if any
    folder: Path | None = None  # the folder the weights came from (for a tokenizer next to them)

    @property
    def name(self) -> str:
        return self.path.name


def open_checkpoint(path: str | Path, component: str) -> Checkpoint:
    """Open the safetensors weights of ``component`` ("transformer", "text_encoder" or "vae") at ``path``."""
    path = Path(path).expanduser()
    if not path.exists():
        raise Flux2Error(f"{path} does not exist: check the path of the {component.replace('_', ' ')} file")
    if path.is_file():
        _check_suffix(path)
        # A weights file inside a diffusers repository (repo/transformer/x.safetensors) or beside its index.
        model_index = _read_json(path.parent / "model_index.json") or _read_json(
            path.parent.parent / "model_index.json"
        )
        return Checkpoint(
            path, *_read_files([path]), config=None, model_index=model_index, folder=path.parent
        )

    model_index = _read_json(path / "model_index.json") or _read_json(path.parent / "model_index.json")
    if (path / component).is_dir():
        path = path / component
    files = _shard_files(path)
    if not files:
        raise Flux2Error(
            f"{path} holds no .safetensors file: point at the {component.replace('_', ' ')} weights "
            "(a .safetensors file or a folder of them)"
        )
    tensors, metadata = _read_files(files)
    return Checkpoint(path, tensors, metadata, _read_json(path / "config.json"), model_index, folder=path)


def load_into(module: torch.nn.Module, state_dict: dict[str, torch.Tensor], what: str) -> torch.nn.Module:
    """Assign ``state_dict`` to a module built on the meta device; every key must match exactly."""
    expected = module.state_dict()
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} tensors ({_summarize(missing)})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected tensors ({_summarize(unexpected)})")
        raise Flux2Error(f"{what}: the file does not match the architecture read from it: {'; '.join(parts)}")
    for key, tensor in state_dict.items():
        if tuple(tensor.shape) != tuple(expected[key].shape):
            raise Flux2Error(
                f"{what}: tensor {key} has shape {list(tensor.shape)}, expected {list(expected[key].shape)}; "
                "the file is not a consistent FLUX.2 checkpoint"
            )
    module.load_state_dict(state_dict, strict=True, assign=True)
    return module


def strip_prefix(tensors: dict[str, torch.Tensor], prefixes: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """Remove the first prefix that every key carrying it shares (e.g. ``model.diffusion_model.``)."""
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in tensors):
            return {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
    return tensors


def reject_quantized(tensors: dict[str, torch.Tensor], metadata: dict[str, str], what: str) -> None:
    """Quantized files need dequantization this version does not do; never load their raw bytes."""
    quant_keys = [k for k in tensors if k.endswith((".comfy_quant", ".weight_scale", ".scale_weight"))]
    fp8 = [k for k, v in tensors.items() if v.dtype in _FLOAT8_DTYPES]
    if quant_keys or fp8 or "_quantization_metadata" in metadata:
        raise Flux2Error(
            f"{what} is a quantized (fp8/nvfp4) file, which this version cannot load yet: "
            "use the bf16 or fp32 .safetensors release of the same model"
        )


_FLOAT8_DTYPES = {getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, n)}


def _check_suffix(path: Path) -> None:
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        raise Flux2Error(
            f"{path.name} is a pickle file ({suffix}), which is never loaded because it can run code: "
            "use the .safetensors release of the model"
        )
    if suffix in UNSUPPORTED_SUFFIXES:
        raise Flux2Error(
            f"{path.name} is a {UNSUPPORTED_SUFFIXES[suffix]} file, which this version cannot load yet: "
            "use the .safetensors release of the model"
        )
    if suffix != ".safetensors":
        raise Flux2Error(
            f"{path.name} is not a .safetensors file: only safetensors checkpoints are supported"
        )


def _shard_files(folder: Path) -> list[Path]:
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if indexes:
        index = _read_json(indexes[0]) or {}
        names = sorted(set(index.get("weight_map", {}).values()))
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise Flux2Error(
                f"{folder} is missing {len(missing)} shard(s) listed in {indexes[0].name} ({missing[0]}...): "
                "download the remaining files"
            )
        return [folder / n for n in names]
    return sorted(folder.glob("*.safetensors"))


def _read_files(files: list[Path]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    tensors: dict[str, torch.Tensor] = {}
    metadata: dict[str, str] = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device="cpu") as f:
                metadata.update(f.metadata() or {})
                for key in f.keys():
                    tensors[key] = f.get_tensor(key)
        except (SafetensorError, OSError, RuntimeError, ValueError) as e:
            raise Flux2Error(
                f"{file.name} could not be read ({e}): the file is truncated or corrupt, download it again"
            ) from None
    return tensors, metadata


def _read_json(path: Path) -> dict | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise Flux2Error(f"{path} is not valid JSON ({e}): repair or remove it") from None


def _summarize(keys: list[str], limit: int = 4) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f", ... {len(keys) - limit} more" if len(keys) > limit else "")
