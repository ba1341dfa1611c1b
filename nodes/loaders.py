"""Loader nodes: a file chosen from ComfyUI's model folders -> a core model on its offload device + a patcher.

Files are only ever found through ``folder_paths`` (the combo lists and their paths). Each loader builds the
module on the device ComfyUI offloads it to; ``host.load`` moves it to the compute device right before use.
ComfyUI caches node outputs, so a file is loaded once until its inputs change or memory runs short.
"""

from __future__ import annotations

import torch

from ..flux2_core import (
    KLEIN_VARIANTS,
    Flux2Error,
    enable_streaming,
    load_text_encoder,
    load_transformer,
    load_vae,
)
from . import host, types
from .model_files import empty_folder_entry, empty_folder_message
from .sampler import KV_STORE
from .types import socket

VARIANTS = ("auto", *KLEIN_VARIANTS)
WEIGHT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


TOOLTIPS = {
    "model_name": "A FLUX.2 [klein] model from models/diffusion_models (or models/unet): bf16, fp8, nvfp4, "
    "int8 .safetensors (BFL or ComfyUI layout) or a .gguf file.",
    "variant": "How the weights are sampled; auto reads it from the file's metadata or name. distilled: "
    "4 steps, no CFG. base: about 50 steps, CFG (guidance > 1 needs a negative prompt). kv: the 9B-KV model, "
    "which computes the references' attention keys/values once and reuses them.",
    "weight_dtype": "Precision the model computes in. default: bfloat16 on a GPU that supports it, else "
    "float32, and quantised files (fp8, nvfp4, int8, GGUF) stay quantised in memory, dequantised layer by "
    "layer as they run. A chosen dtype also dequantises a quantised file once, at load (more memory).",
    "text_encoder_name": "qwen_3_4b.safetensors (klein 4B) or qwen_3_8b.safetensors (klein 9B) from "
    "models/text_encoders (or models/clip): bf16, fp8mixed or GGUF (e.g. Qwen3-4B-Q8_0.gguf).",
    "device": "default: where ComfyUI runs text encoders (the GPU when there is room). cpu: always on the "
    "CPU in float32, which saves VRAM but is slow.",
    "offload": "none: the whole model moves to the GPU to sample. stream: the blocks stay in CPU memory and "
    "each is copied to the GPU just before it runs (overlapped with compute), so 9B runs in a few GB of "
    "VRAM, at the cost of the copies.",
    "resident_mb": "With offload stream: MB of model weights kept on the GPU (the rest is streamed); 0 "
    "streams every block. More is faster when the card has the room.",
    "vae_name": "The FLUX.2 VAE (flux2-vae.safetensors, 32 latent channels) from models/vae.",
}


def _choices(folder: str) -> list[str]:
    """The folder's files; an empty folder shows one entry saying so (an empty list cannot be queued)."""
    return host.filenames(folder) or [empty_folder_entry(folder)]


def _path(folder: str, name: str) -> str:
    if name == empty_folder_entry(folder) and not host.filenames(folder):
        raise Flux2Error(empty_folder_message(folder))
    return host.full_path(folder, name)


class Flux2KleinModelLoader:
    DESCRIPTION = (
        "Loads a FLUX.2 [klein] diffusion model (4B, 9B, base or 9B-KV) from models/diffusion_models."
    )
    CATEGORY = "flux2_klein/loaders"
    RETURN_TYPES = (types.MODEL,)
    RETURN_NAMES = ("model",)
    OUTPUT_TOOLTIPS = ("The FLUX.2 [klein] DiT, for the FLUX.2 [klein] Sampler.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "model_name": socket(_choices("diffusion_models"), TOOLTIPS["model_name"]),
                "variant": socket(list(VARIANTS), TOOLTIPS["variant"], default="auto"),
            },
            "optional": {
                "weight_dtype": socket(
                    ["default", *WEIGHT_DTYPES], TOOLTIPS["weight_dtype"], default="default"
                ),
                "offload": socket(["none", "stream"], TOOLTIPS["offload"], default="none"),
                "resident_mb": socket(
                    "INT", TOOLTIPS["resident_mb"], default=0, min=0, max=1 << 20, step=256
                ),
            },
        }

    def load(
        self,
        model_name: str,
        variant: str,
        weight_dtype: str = "default",
        offload: str = "none",
        resident_mb=0,
    ):
        load_device, offload_device = host.devices("diffusion_model")
        dtype = WEIGHT_DTYPES.get(weight_dtype) or host.default_dtype(load_device)
        path = _path("diffusion_models", model_name)
        # A chosen dtype dequantises quantised files at load; so does Apple's MPS, which cannot hold float8.
        keep = weight_dtype == "default" and load_device.type != "mps"
        model = load_transformer(
            path, variant=variant, dtype=dtype, device=offload_device, keep_quantized=keep
        )
        if offload == "stream":  # before the patcher: it then manages (and moves) only the resident part
            enable_streaming(
                model.transformer, load_device, resident_bytes=int(resident_mb) * 2**20, move=False
            )
        patcher = host.manage(model.transformer, load_device, offload_device)
        # the 9B-KV references' K/V kept for this model live on its device: they go when it leaves it
        host.on_unload(patcher, lambda: KV_STORE.forget_model(model.transformer))
        return (types.KleinModel(model, patcher),)


class Flux2KleinTextEncoderLoader:
    DESCRIPTION = (
        "Loads the Qwen3 text encoder of FLUX.2 [klein] from models/text_encoders: Qwen3-4B for klein 4B, "
        "Qwen3-8B for klein 9B."
    )
    CATEGORY = "flux2_klein/loaders"
    RETURN_TYPES = (types.TEXT_ENCODER,)
    RETURN_NAMES = ("text_encoder",)
    OUTPUT_TOOLTIPS = ("The Qwen3 text encoder, for FLUX.2 [klein] Text Encode.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "text_encoder_name": socket(_choices("text_encoders"), TOOLTIPS["text_encoder_name"]),
            },
            "optional": {"device": socket(["default", "cpu"], TOOLTIPS["device"], default="default")},
        }

    def load(self, text_encoder_name: str, device: str = "default"):
        load_device, offload_device = host.devices("text_encoder", cpu=device == "cpu")
        path = _path("text_encoders", text_encoder_name)
        encoder = load_text_encoder(
            path,
            dtype=host.default_dtype(load_device),
            device=offload_device,
            keep_quantized=load_device.type != "mps",
        )
        return (types.KleinTextEncoder(encoder, host.manage(encoder.model, load_device, offload_device)),)


class Flux2KleinVAELoader:
    DESCRIPTION = "Loads the FLUX.2 VAE (flux2-vae.safetensors) from models/vae."
    CATEGORY = "flux2_klein/loaders"
    RETURN_TYPES = (types.VAE,)
    RETURN_NAMES = ("vae",)
    OUTPUT_TOOLTIPS = ("The FLUX.2 autoencoder, for Reference Encode and Decode.",)
    FUNCTION = "load"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae_name": socket(_choices("vae"), TOOLTIPS["vae_name"])}}

    def load(self, vae_name: str):
        load_device, offload_device = host.devices("vae")
        path = _path("vae", vae_name)
        vae = load_vae(path, dtype=host.vae_dtype(load_device), device=offload_device)
        return (types.KleinVAE(vae, host.manage(vae, load_device, offload_device)),)
