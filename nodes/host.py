"""Everything this pack takes from the ComfyUI host, in one place.

Host modules are imported absolutely (``folder_paths``, ``comfy.*``, ``latent_preview``: ComfyUI puts its root
on sys.path) and lazily, inside the functions, so the unit tests can swap in fakes through ``sys.modules``.

Memory: each loaded ``nn.Module`` is handed to a plain ``comfy.model_patcher.ModelPatcher`` (same behaviour
on CPU and GPU; the dynamic-VRAM patcher needs comfy.ops layers) and loaded with ``force_full_load=True``
right before use, because ComfyUI can only partially load comfy.ops layers and would silently leave plain
torch layers on the offload device otherwise.
"""

from __future__ import annotations

import contextlib
import os

import torch

from ..flux2_core import Flux2Error, MissingComponent, OutOfMemory


class Flux2KleinModule(torch.nn.Module):
    """What a ModelPatcher manages: our module plus the plain ``device`` attribute the patcher writes.

    The DiT, VAE and transformers' Qwen3 expose ``device`` as a read-only property (read from their
    weights), so ``ModelPatcher.load`` (``model.device = device_to``) would fail on them directly.
    """

    def __init__(self, module: torch.nn.Module, device: torch.device):
        super().__init__()
        self.module = module
        self.device = device


GGUF_SUFFIX = ".gguf"


def _gguf_folder(folder: str) -> str:
    """A folder key listing the ``.gguf`` files of ``folder``'s paths (ComfyUI's own lists skip them)."""
    import folder_paths

    key = f"flux2_klein_{folder}_gguf"
    paths = folder_paths.get_folder_paths(folder)  # read each time: extra_model_paths may add folders
    known = folder_paths.folder_names_and_paths.get(key)
    if known is None or list(known[0]) != list(paths):
        folder_paths.folder_names_and_paths[key] = (list(paths), {GGUF_SUFFIX})
    return key


def filenames(folder: str) -> list[str]:
    """The files ComfyUI lists for a model folder ("diffusion_models", "text_encoders", "vae"), with the
    GGUF files of the DiT and text-encoder folders (their legacy ``unet`` / ``clip`` folders included)."""
    import folder_paths

    names = list(folder_paths.get_filename_list(folder))
    if folder in ("diffusion_models", "text_encoders"):
        names += [n for n in folder_paths.get_filename_list(_gguf_folder(folder)) if n not in names]
    return sorted(names)


def full_path(folder: str, name: str) -> str:
    """The path of a listed file. A name that is not in the list (e.g. with "..") is refused, never opened."""
    import folder_paths

    if name not in filenames(folder):
        raise Flux2Error(
            f"{name!r} is not a file in ComfyUI's {folder} folders: put the file in models/{folder}/ and "
            "choose it from the list (press R in the UI to refresh the lists)"
        )
    if name.lower().endswith(GGUF_SUFFIX) and name not in folder_paths.get_filename_list(folder):
        return folder_paths.get_full_path_or_raise(_gguf_folder(folder), name)
    return folder_paths.get_full_path_or_raise(folder, name)


def devices(
    role: str, cpu: bool = False, device: torch.device | None = None
) -> tuple[torch.device, torch.device]:
    """(load device, offload device) that ComfyUI chooses for a "diffusion_model", "text_encoder" or "vae";
    ``device``: the load device chosen by the user instead (the offload device stays ComfyUI's)."""
    import comfy.model_management as mm

    if cpu:
        return torch.device("cpu"), torch.device("cpu")
    if role == "diffusion_model":
        load, offload = mm.get_torch_device(), mm.unet_offload_device()
    elif role == "text_encoder":
        load, offload = mm.text_encoder_device(), mm.text_encoder_offload_device()
    else:
        load, offload = mm.vae_device(), mm.vae_offload_device()
    return (device if device is not None else load), offload


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the device runs it well (ComfyUI's judgement), else fp32 (CPU, old GPUs)."""
    import comfy.model_management as mm

    return torch.bfloat16 if mm.should_use_bf16(device) else torch.float32


def vae_dtype(device: torch.device) -> torch.dtype:
    """ComfyUI's VAE dtype (honours --fp32-vae / --bf16-vae); the FLUX.2 VAE runs in bf16 or fp32."""
    import comfy.model_management as mm

    return mm.vae_dtype(device, [torch.bfloat16, torch.float32])


def manage(module: torch.nn.Module, load_device: torch.device, offload_device: torch.device):
    """A ModelPatcher for ``module`` (which must sit on ``offload_device``)."""
    import comfy.model_patcher

    size = sum(t.nbytes for t in module.state_dict().values())
    holder = Flux2KleinModule(module, offload_device)
    return comfy.model_patcher.ModelPatcher(holder, load_device, offload_device, size=size)


def on_unload(patcher, callback) -> None:
    """Run ``callback()`` whenever ComfyUI unloads the module (to make room, say). ComfyUI also detaches a
    model without unpatching it each time it is loaded again; that one keeps it in place and is ignored."""
    import comfy.patcher_extension

    def detached(patcher, unpatch_all=True):
        if unpatch_all:
            callback()

    patcher.add_callback(comfy.patcher_extension.CallbacksMP.ON_DETACH, detached)


def load(patcher, memory_required: int = 0) -> None:
    """Move the whole module to its load device, letting ComfyUI evict other models first so that
    ``memory_required`` bytes stay free for the activations."""
    load_all([patcher], memory_required)


def load_all(patchers: list, memory_required: int = 0) -> None:
    """``load`` for the parts of one model on several devices (a DiT split by blocks), in one call: ComfyUI
    frees room on every device they use (``memory_required`` on each) before it moves any of them."""
    import comfy.model_management as mm

    with out_of_memory("loading the model", "free memory (unload other models) or use a smaller model"):
        mm.load_models_gpu(list(patchers), memory_required=memory_required, force_full_load=True)


@contextlib.contextmanager
def out_of_memory(what: str, advice: str):
    """Turn a device out-of-memory error into a node error that says what to change."""
    try:
        yield
    except OutOfMemory:
        import comfy.model_management as mm

        mm.soft_empty_cache()
        raise Flux2Error(f"out of memory while {what}: {advice}") from None


@contextlib.contextmanager
def running(patchers: list, need, checked: list | None = None):
    """The body runs a model: ``patchers`` loaded with ``need.bytes`` left free on each device (a
    ``flux2_core.MemoryNeed``), the run refused when it cannot fit on the devices of ``checked`` (default:
    every patcher's), and an out-of-memory error in it named with ``need``'s words."""
    load_all(patchers, need.bytes)  # every device of a block split: each needs the activations
    for device in dict.fromkeys(p.load_device for p in checked or patchers):
        need.check(device, free=free_memory(device))
    with out_of_memory(need.what, need.advice):
        yield


def free_memory(device: torch.device) -> int:
    """Bytes ComfyUI counts as free on ``device`` (after it evicted what it could for the last load)."""
    import comfy.model_management as mm

    return mm.get_free_memory(device)


def unload(patcher) -> None:
    """Send the module back to its offload device and drop it from ComfyUI's list of loaded models."""
    import comfy.model_management as mm

    mm.unload_model_and_clones(patcher)


def intermediate_device() -> torch.device:
    """Where node outputs (latents, conditioning, images) live: the CPU unless ComfyUI runs --gpu-only."""
    import comfy.model_management as mm

    return mm.intermediate_device()


def check_interrupt() -> None:
    """Raises ComfyUI's InterruptProcessingException (a BaseException) once the user pressed cancel."""
    import comfy.model_management as mm

    mm.throw_exception_if_processing_interrupted()


def step_reporter(steps: int, latent_format: str = "Flux2"):
    """A core sampling callback ``(step, total, x0)``: stops on cancel, advances the progress bar and sends
    a live preview of the predicted latent (none if previews are off), decoded as the native latent format
    named ``latent_format`` in ``comfy.latent_formats`` ("Flux2"; "Flux" for FLUX.1, whose x0 is the
    model-space latent [B, 16, H/8, W/8])."""
    import comfy.latent_formats
    import comfy.model_management as mm
    import comfy.utils
    import latent_preview

    bar = comfy.utils.ProgressBar(steps)
    previewer = latent_preview.get_previewer(
        mm.get_torch_device(), getattr(comfy.latent_formats, latent_format)()
    )

    def report(step: int, total: int, x0: torch.Tensor) -> None:
        check_interrupt()
        preview = None
        if previewer is not None:  # a TAESD previewer lives on the compute device
            preview = previewer.decode_latent_to_preview_image("JPEG", x0.to(mm.get_torch_device()))
        bar.update_absolute(step, total, preview)

    return report


def progress_reporter():
    """A core progress callback ``(done, total)`` (a VAE run's, ``flux2_core.vae.progress``): stops on cancel
    and moves the running node's progress bar, made at the first call (0 of the whole total, before any
    work), so a reporter never called draws no bar."""
    import comfy.utils

    bar = None

    def report(done: int, total: int) -> None:
        nonlocal bar
        check_interrupt()
        if bar is None:
            bar = comfy.utils.ProgressBar(total)
        bar.update_absolute(done, total)

    return report


def tokenizer_folders() -> list[str]:
    """The host's own CLIP-L and T5 tokenizer folders (``comfy/sd1_tokenizer``,
    ``comfy/text_encoders/t5_tokenizer``), for FLUX.1's text encoders, whose weight files carry none.

    ``comfy`` is a namespace package (no ``__init__.py``, so no ``__file__``): the folder is found from one
    of its modules, as ComfyUI's own text encoders find these folders from theirs."""
    import comfy.model_management as mm

    root = os.path.dirname(os.path.realpath(mm.__file__))
    return [os.path.join(root, "sd1_tokenizer"), os.path.join(root, "text_encoders", "t5_tokenizer")]


def diffusion_model_wrappers(fn, owner, transformer_options: dict):
    """``fn`` behind the ``DIFFUSION_MODEL`` wrappers model patches registered (EasyCache's among them), as
    native FLUX's ``forward`` runs its ``_forward``."""
    import comfy.patcher_extension as ext

    wrappers = ext.get_all_wrappers(ext.WrappersMP.DIFFUSION_MODEL, transformer_options)
    return ext.WrapperExecutor.new_class_executor(fn, owner, wrappers).execute


def plain_error_names() -> None:
    """Our error types named as ``Flux2Error`` in the frontend's error report.

    ComfyUI reports an exception's type as ``module.qualname`` unless the module is ``builtins``, and the
    module name it gives this pack is its folder's path (``/.../custom_nodes/comfyui-flux2-klein``), so the
    report would start with a path. Inside ComfyUI only (never imported elsewhere); these instances are
    never pickled there."""
    for error_type in (Flux2Error, MissingComponent):
        error_type.__module__ = "builtins"
