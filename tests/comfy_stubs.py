"""A minimal fake ComfyUI host for the node tests (ComfyUI's own unit-test trick: modules in sys.modules).

Fakes only what ``nodes/host.py`` uses: ``folder_paths`` over temporary folders (same name normalisation as
the real one), ``comfy.utils.ProgressBar`` recording every update, ``comfy.model_management`` on the CPU with
an interrupt flag, ``comfy.model_patcher.ModelPatcher`` (which, like the real one, writes ``model.device``),
``comfy.latent_formats.Flux2`` / ``Flux`` and ``latent_preview.get_previewer`` (recording the latent
format of each previewer). With ``comfy_dir``, the ``comfy`` modules' files lie in that folder, as in a
ComfyUI checkout (where the host's tokenizer folders are found; ``comfy`` itself is a namespace package).
ComfyUI's V3 node API (``comfy_api.latest``) is faked in ``fake_comfy_api``.
``FakeHost.installed`` puts them in sys.modules and takes them out again, so no other test module sees them.
``load_pack`` imports the repository root the way ComfyUI loads a custom-node folder, and ``pack_nodes``
registers its nodes as ComfyUI does (``comfy_entrypoint`` -> the extension's ``get_node_list``).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import fake_comfy_api
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
HOST_MODULES = (
    "folder_paths",
    "comfy",
    "comfy.utils",
    "comfy.model_management",
    "comfy.model_patcher",
    "comfy.patcher_extension",
    "comfy.latent_formats",
    "latent_preview",
    "comfy_api",
    "comfy_api.latest",
)


class InterruptProcessingException(BaseException):
    """Like ComfyUI's: a BaseException, so a broad ``except Exception`` cannot swallow a cancel."""


@dataclass
class FakeHost:
    models_dir: Path
    folders: tuple[str, ...] = ("diffusion_models", "text_encoders", "vae", "loras")
    progress: list[tuple[int, int, object]] = field(default_factory=list)  # (value, total, preview)
    loads: list[tuple[object, bool]] = field(default_factory=list)  # (patcher, force_full_load)
    unloads: list[object] = field(default_factory=list)
    previews_enabled: bool = True
    interrupted: bool = False
    on_progress: object = None  # optional hook(value, total), e.g. to press cancel mid-run
    free_memory: int = 64 * 1024**3  # what get_free_memory reports for any device
    comfy_dir: Path | None = None  # where the fake comfy modules "live" (their __file__'s folder)
    previewers: list[str] = field(default_factory=list)  # latent-format class name of each previewer made

    def reset(self) -> None:
        self.progress.clear()
        self.previewers.clear()
        self.loads.clear()
        self.unloads.clear()
        self.previews_enabled, self.interrupted, self.on_progress = True, False, None
        self.free_memory = 64 * 1024**3

    def folder(self, name: str) -> Path:
        return self.models_dir / name

    @contextlib.contextmanager
    def installed(self):
        """The fake host modules in sys.modules for the duration; whatever was there before comes back."""
        saved = {name: sys.modules.get(name) for name in HOST_MODULES}
        sys.modules.update(self.build_modules())
        try:
            yield self
        finally:
            for name, module in saved.items():
                if module is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = module

    def build_modules(self) -> dict[str, ModuleType]:
        modules = {
            "folder_paths": self._folder_paths(),
            "comfy.utils": self._utils(),
            "comfy.model_management": self._model_management(),
            "comfy.patcher_extension": self._patcher_extension(),
            "comfy.model_patcher": self._model_patcher(),
            "comfy.latent_formats": self._latent_formats(),
            "latent_preview": self._latent_preview(),
        }
        comfy = ModuleType("comfy")
        comfy.__path__ = []  # a package (a namespace package in ComfyUI: no __init__.py, no __file__)
        for name, module in list(modules.items()):
            if name.startswith("comfy."):
                setattr(comfy, name.split(".", 1)[1], module)
                if self.comfy_dir is not None:
                    module.__file__ = str(self.comfy_dir / (name.split(".", 1)[1] + ".py"))
        modules["comfy"] = comfy
        modules.update(fake_comfy_api.build_modules())
        return modules

    def _folder_paths(self) -> ModuleType:
        """Like ComfyUI's: named folders with their paths and extensions; lists hold only those extensions."""
        host, module = self, ModuleType("folder_paths")
        module.folder_names_and_paths = {}

        def entry(folder: str) -> tuple[list[str], set[str]]:
            if folder not in module.folder_names_and_paths:
                module.folder_names_and_paths[folder] = ([str(host.folder(folder))], {".safetensors"})
            return module.folder_names_and_paths[folder]

        def get_folder_paths(folder: str) -> list[str]:
            return list(entry(folder)[0])

        def get_filename_list(folder: str) -> list[str]:
            paths, extensions = entry(folder)
            names = set()
            for base in map(Path, paths):
                names |= {p.relative_to(base).as_posix() for p in base.rglob("*") if p.suffix in extensions}
            return sorted(names)

        def get_full_path(folder: str, filename: str) -> str | None:
            filename = os.path.relpath(os.path.join("/", filename), "/")  # as ComfyUI: no escaping the folder
            for base in entry(folder)[0]:
                path = Path(base) / filename
                if path.is_file():
                    return str(path)
            return None

        def get_full_path_or_raise(folder: str, filename: str) -> str:
            path = get_full_path(folder, filename)
            if path is None:
                raise FileNotFoundError(f"Model in folder '{folder}' with filename '{filename}' not found.")
            return path

        module.get_folder_paths = get_folder_paths
        module.get_filename_list = get_filename_list
        module.get_full_path = get_full_path
        module.get_full_path_or_raise = get_full_path_or_raise
        return module

    def _utils(self) -> ModuleType:
        host, module = self, ModuleType("comfy.utils")

        class ProgressBar:
            def __init__(self, total, node_id=None):
                self.total, self.current = total, 0

            def update_absolute(self, value, total=None, preview=None):
                self.total = total if total is not None else self.total
                self.current = value
                host.progress.append((value, self.total, preview))
                if host.on_progress is not None:
                    host.on_progress(value, self.total)

        module.ProgressBar = ProgressBar
        return module

    def _model_management(self) -> ModuleType:
        host, module = self, ModuleType("comfy.model_management")
        cpu = torch.device("cpu")
        for name in (
            "get_torch_device",
            "unet_offload_device",
            "text_encoder_device",
            "text_encoder_offload_device",
            "vae_device",
            "vae_offload_device",
            "intermediate_device",
        ):
            setattr(module, name, lambda: cpu)
        module.should_use_bf16 = lambda device=None, **kwargs: False
        module.vae_dtype = lambda device=None, allowed_dtypes=(): torch.float32
        module.InterruptProcessingException = InterruptProcessingException

        def load_models_gpu(models, memory_required=0, force_patch_weights=False,
                            minimum_memory_required=None, force_full_load=False):  # fmt: skip
            for patcher in models:
                host.loads.append((patcher, force_full_load))
                patcher.move_to(patcher.load_device)

        def unload_model_and_clones(model, unload_additional_models=True, all_devices=False):
            host.unloads.append(model)
            model.detach()

        def interrupt_current_processing(value=True):
            host.interrupted = value

        def throw_exception_if_processing_interrupted():
            if host.interrupted:
                host.interrupted = False
                raise InterruptProcessingException()

        module.load_models_gpu = load_models_gpu
        module.get_free_memory = lambda dev=None, torch_free_too=False: host.free_memory
        module.unload_model_and_clones = unload_model_and_clones
        module.interrupt_current_processing = interrupt_current_processing
        module.processing_interrupted = lambda: host.interrupted
        module.throw_exception_if_processing_interrupted = throw_exception_if_processing_interrupted
        return module

    def _model_patcher(self) -> ModuleType:
        module = ModuleType("comfy.model_patcher")

        class ModelPatcher:
            def __init__(self, model, load_device, offload_device, size=0, weight_inplace_update=False):
                self.model, self.size = model, size
                self.load_device, self.offload_device = load_device, offload_device
                if getattr(model, "device", None) is None:
                    model.device = offload_device

            def model_size(self):
                return self.size

            def move_to(self, device):
                self.model.to(device)
                self.model.device = device  # the real patcher's load() and detach() do the same

            def detach(self):  # as the real one: to the offload device, then its ON_DETACH callbacks
                self.move_to(self.offload_device)
                for callback in getattr(self, "detach_callbacks", []):
                    callback(self, True)

            def add_callback(self, call_type, callback):
                assert call_type == "on_detach_after", call_type
                self.detach_callbacks = [*getattr(self, "detach_callbacks", []), callback]

        module.ModelPatcher = ModelPatcher
        return module

    def _patcher_extension(self) -> ModuleType:
        module = ModuleType("comfy.patcher_extension")
        module.CallbacksMP = type("CallbacksMP", (), {"ON_DETACH": "on_detach_after"})
        return module

    def _latent_formats(self) -> ModuleType:
        module = ModuleType("comfy.latent_formats")

        class Flux2:
            latent_channels = 128
            spacial_downscale_ratio = 16

        class Flux:
            latent_channels = 16
            spacial_downscale_ratio = 8

        module.Flux2, module.Flux = Flux2, Flux
        return module

    def _latent_preview(self) -> ModuleType:
        host, module = self, ModuleType("latent_preview")

        class Previewer:
            def __init__(self, latent_format):
                self.latent_format = latent_format

            def decode_latent_to_preview_image(self, preview_format, x0):
                return (preview_format, tuple(x0.shape), 512)  # stands for ("JPEG", PIL image, max size)

        def get_previewer(device, latent_format):
            host.previewers.append(type(latent_format).__name__)
            return Previewer(latent_format) if host.previews_enabled else None  # None: --preview-method none

        module.get_previewer = get_previewer
        return module


def pack_module_name(root: Path = REPO_ROOT) -> str:
    return str(root).replace(".", "_x_")  # ComfyUI: the folder path with "." replaced (nodes.py)


def load_pack(root: Path = REPO_ROOT) -> ModuleType:
    """Import the repository root as ComfyUI does: a path-derived module name for its __init__.py."""
    name = pack_module_name(root)
    spec = importlib.util.spec_from_file_location(
        name, root / "__init__.py", submodule_search_locations=[str(root)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class PackNodes:
    """The nodes a pack registers: node id -> class, and node id -> display name (ComfyUI's two tables)."""

    classes: dict
    display_names: dict


def pack_nodes(pack: ModuleType) -> PackNodes:
    """Register ``pack``'s nodes as ComfyUI's loader does: await ``comfy_entrypoint()``, its ``on_load`` and
    ``get_node_list``, and key each node class by its schema's id."""

    async def node_list():
        extension = await pack.comfy_entrypoint()
        await extension.on_load()
        return await extension.get_node_list()

    classes, names = {}, {}
    for node_class in asyncio.run(node_list()):
        schema = node_class.GET_SCHEMA()
        classes[schema.node_id] = node_class
        if schema.display_name is not None:
            names[schema.node_id] = schema.display_name
    return PackNodes(classes, names)


def unload_pack(root: Path = REPO_ROOT) -> None:
    name = pack_module_name(root)
    for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
        del sys.modules[key]
