"""FLUX.1 Fill [dev] loaders: the DiT, T5-XXL + CLIP-L (with the host's tokenizers) and the FLUX.1 VAE.

As the klein loaders: files come only from ComfyUI's folders, each module is built on its offload device and
handed to a patcher, and a wrong file (a klein DiT, a Qwen3 encoder, the FLUX.2 VAE) is refused with the
file to choose instead. FLUX.1 Fill has no float16 choice: its activations overflow there.
"""

from __future__ import annotations

import torch

from ..flux2_core import Flux2Error, load_fill_text_encoder, load_fill_transformer, load_flux1_vae
from . import host, types
from .model_files import empty_folder_entry, empty_folder_message
from .types import socket

WEIGHT_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}
DIT_FILE, T5_FILE, CLIP_FILE, VAE_FILE = (
    "flux1-fill-dev.safetensors",
    "t5xxl_fp16.safetensors",
    "clip_l.safetensors",
    "ae.safetensors",
)

TOOLTIPS = {
    "model_name": "flux1-fill-dev.safetensors from models/diffusion_models (or models/unet): bf16, fp8 or "
    "int8 .safetensors (BFL, ComfyUI or diffusers names) or a .gguf file.",
    "weight_dtype": "Precision the model computes in. default: bfloat16 on a GPU that supports it, else "
    "float32, and quantised files (fp8, int8, GGUF) stay quantised in memory, dequantised layer by layer as "
    "they run. A chosen dtype also dequantises a quantised file once, at load (more memory). No float16: "
    "FLUX.1 Fill overflows there into black images.",
    "t5_name": "The T5-XXL text encoder from models/text_encoders (or models/clip): t5xxl_fp16.safetensors, "
    "an fp8 or GGUF version of it.",
    "clip_name": "The CLIP-L text encoder from models/text_encoders (or models/clip): clip_l.safetensors.",
    "device": "default: where ComfyUI runs text encoders (the GPU when there is room). cpu: always on the "
    "CPU in float32, which saves VRAM but is slow (T5-XXL is large).",
    "vae_name": "The FLUX.1 VAE (ae.safetensors, 16 latent channels) from models/vae.",
}


def _choices(folder: str, first: str) -> list[str]:
    """The folder's files; an empty folder shows one entry naming ``first`` (an empty list cannot be
    queued)."""
    return host.filenames(folder) or [empty_folder_entry(folder, first)]


def _path(folder: str, name: str, first: str) -> str:
    if name == empty_folder_entry(folder, first) and not host.filenames(folder):
        raise Flux2Error(empty_folder_message(folder, first))
    return host.full_path(folder, name)


class Flux1FillModelLoader:
    DESCRIPTION = (
        "Loads the FLUX.1 Fill [dev] diffusion model (flux1-fill-dev.safetensors) from "
        "models/diffusion_models, for inpainting and outpainting."
    )
    CATEGORY = "flux1_fill/loaders"
    RETURN_TYPES = (types.FILL_MODEL,)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The FLUX.1 Fill DiT, for the FLUX.1 Fill [dev] Sampler.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model_name": socket(_choices("diffusion_models", DIT_FILE), TOOLTIPS["model_name"])
            },
            "optional": {
                "weight_dtype": socket(
                    ["default", *WEIGHT_DTYPES], TOOLTIPS["weight_dtype"], default="default"
                ),
            },
        }

    def load(self, model_name: str, weight_dtype: str = "default"):
        load_device, offload_device = host.devices("diffusion_model")
        dtype = WEIGHT_DTYPES.get(weight_dtype) or host.default_dtype(load_device)
        path = _path("diffusion_models", model_name, DIT_FILE)
        # A chosen dtype dequantises quantised files at load; so does Apple's MPS, which cannot hold float8.
        keep = weight_dtype == "default" and load_device.type != "mps"
        model = load_fill_transformer(path, dtype=dtype, device=offload_device, keep_quantized=keep)
        return (types.FillModel(model, host.manage(model.transformer, load_device, offload_device)),)


class Flux1FillTextEncoderLoader:
    DESCRIPTION = (
        "Loads FLUX.1's two text encoders from models/text_encoders: T5-XXL (t5xxl_fp16.safetensors) and "
        "CLIP-L (clip_l.safetensors), with ComfyUI's own tokenizers."
    )
    CATEGORY = "flux1_fill/loaders"
    RETURN_TYPES = (types.FILL_TEXT_ENCODER,)
    RETURN_NAMES = ("text_encoder",)
    OUTPUT_TOOLTIPS = ("T5-XXL and CLIP-L, for FLUX.1 Fill [dev] Text Encode.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "t5_name": socket(_choices("text_encoders", T5_FILE), TOOLTIPS["t5_name"]),
                "clip_name": socket(_choices("text_encoders", CLIP_FILE), TOOLTIPS["clip_name"]),
            },
            "optional": {"device": socket(["default", "cpu"], TOOLTIPS["device"], default="default")},
        }

    def load(self, t5_name: str, clip_name: str, device: str = "default"):
        load_device, offload_device = host.devices("text_encoder", cpu=device == "cpu")
        t5_path = _path("text_encoders", t5_name, T5_FILE)
        clip_path = _path("text_encoders", clip_name, CLIP_FILE)
        encoder = load_fill_text_encoder(
            t5_path,
            clip_path,
            dtype=host.default_dtype(load_device),
            device=offload_device,
            tokenizers=host.tokenizer_folders(),
            keep_quantized=load_device.type != "mps",
        )
        patcher = host.manage(encoder.modules, load_device, offload_device)
        return (types.FillTextEncoderPair(encoder, patcher),)


class Flux1FillVAELoader:
    DESCRIPTION = "Loads the FLUX.1 VAE (ae.safetensors) from models/vae."
    CATEGORY = "flux1_fill/loaders"
    RETURN_TYPES = (types.FILL_VAE,)
    RETURN_NAMES = ("vae",)
    OUTPUT_TOOLTIPS = ("The FLUX.1 autoencoder, for the FLUX.1 Fill [dev] Sampler and Decode.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae_name": socket(_choices("vae", VAE_FILE), TOOLTIPS["vae_name"])}}

    def load(self, vae_name: str):
        load_device, offload_device = host.devices("vae")
        path = _path("vae", vae_name, VAE_FILE)
        vae = load_flux1_vae(path, dtype=host.vae_dtype(load_device), device=offload_device)
        return (types.FillVAE(vae, host.manage(vae, load_device, offload_device)),)
