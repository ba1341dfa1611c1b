"""FLUX.1 Fill [dev] loaders: the DiT, T5-XXL + CLIP-L (with the host's tokenizers) and the FLUX.1 VAE.

As the klein loaders: files come only from ComfyUI's folders, each module is built on its offload device and
handed to a patcher, and a wrong file (a klein DiT, a Qwen3 encoder, the FLUX.2 VAE) is refused with the
file to choose instead. FLUX.1 Fill has no float16 choice: its activations overflow there.
"""

from __future__ import annotations

import torch

from ..flux2_core import load_fill_text_encoder, load_fill_transformer, load_flux1_vae
from . import host, sockets, types
from .aliases import FILL
from .inputs import file_choices, file_path, quant_compute_input
from .sockets import io

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
CATEGORY = "flux1_fill/loaders"


class Flux1FillModelLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux1FillModelLoader",
            search_aliases=[*FILL, "load diffusion model", "inpaint", "outpaint"],
            display_name="FLUX.1 Fill [dev] Model Loader",
            category=CATEGORY,
            description=(
                "Loads the FLUX.1 Fill [dev] diffusion model (flux1-fill-dev.safetensors) from "
                "models/diffusion_models, for inpainting and outpainting."
            ),
            inputs=[
                io.Combo.Input(
                    "model_name",
                    options=file_choices("diffusion_models", DIT_FILE),
                    tooltip=TOOLTIPS["model_name"],
                ),
                io.Combo.Input(
                    "weight_dtype",
                    options=["default", *WEIGHT_DTYPES],
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["weight_dtype"],
                    default="default",
                ),  # fmt: skip
                quant_compute_input(),
            ],
            outputs=[
                sockets.FillModel.Output(
                    display_name="model", tooltip="The FLUX.1 Fill DiT, for the FLUX.1 Fill [dev] Sampler."
                )
            ],
        )

    @classmethod
    def execute(
        cls, model_name: str, weight_dtype: str = "default", quant_compute: str = "auto"
    ) -> io.NodeOutput:
        load_device, offload_device = host.devices("diffusion_model")
        dtype = WEIGHT_DTYPES.get(weight_dtype) or host.default_dtype(load_device)
        path = file_path("diffusion_models", model_name, DIT_FILE)
        # A chosen dtype dequantises quantised files at load; so does Apple's MPS, which cannot hold float8.
        keep = weight_dtype == "default" and load_device.type != "mps"
        model = load_fill_transformer(
            path, dtype=dtype, device=offload_device, keep_quantized=keep, quant_compute=quant_compute
        )
        return io.NodeOutput(
            types.FillModel(model, host.manage(model.transformer, load_device, offload_device))
        )


class Flux1FillTextEncoderLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux1FillTextEncoderLoader",
            search_aliases=[*FILL, "dual clip loader", "t5", "clip l"],
            display_name="FLUX.1 Fill [dev] Text Encoder Loader",
            category=CATEGORY,
            description=(
                "Loads FLUX.1's two text encoders from models/text_encoders: T5-XXL (t5xxl_fp16.safetensors) "
                "and CLIP-L (clip_l.safetensors), with ComfyUI's own tokenizers."
            ),
            inputs=[
                io.Combo.Input(
                    "t5_name", options=file_choices("text_encoders", T5_FILE), tooltip=TOOLTIPS["t5_name"]
                ),
                io.Combo.Input(
                    "clip_name",
                    options=file_choices("text_encoders", CLIP_FILE),
                    tooltip=TOOLTIPS["clip_name"],
                ),
                io.Combo.Input(
                    "device",
                    options=["default", "cpu"],
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["device"],
                    default="default",
                ),  # fmt: skip
            ],
            outputs=[
                sockets.FillTextEncoder.Output(
                    display_name="text_encoder",
                    tooltip="T5-XXL and CLIP-L, for FLUX.1 Fill [dev] Text Encode.",
                )
            ],
        )

    @classmethod
    def execute(cls, t5_name: str, clip_name: str, device: str = "default") -> io.NodeOutput:
        load_device, offload_device = host.devices("text_encoder", cpu=device == "cpu")
        t5_path = file_path("text_encoders", t5_name, T5_FILE)
        clip_path = file_path("text_encoders", clip_name, CLIP_FILE)
        encoder = load_fill_text_encoder(
            t5_path,
            clip_path,
            dtype=host.default_dtype(load_device),
            device=offload_device,
            tokenizers=host.tokenizer_folders(),
            keep_quantized=load_device.type != "mps",
        )
        patcher = host.manage(encoder.modules, load_device, offload_device)
        return io.NodeOutput(types.FillTextEncoderPair(encoder, patcher))


class Flux1FillVAELoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux1FillVAELoader",
            search_aliases=[*FILL, "load vae", "ae"],
            display_name="FLUX.1 Fill [dev] VAE Loader",
            category=CATEGORY,
            description="Loads the FLUX.1 VAE (ae.safetensors) from models/vae.",
            inputs=[
                io.Combo.Input(
                    "vae_name", options=file_choices("vae", VAE_FILE), tooltip=TOOLTIPS["vae_name"]
                )
            ],
            outputs=[
                sockets.FillVae.Output(
                    display_name="vae",
                    tooltip="The FLUX.1 autoencoder, for the FLUX.1 Fill [dev] Sampler and Decode.",
                )
            ],
        )

    @classmethod
    def execute(cls, vae_name: str) -> io.NodeOutput:
        load_device, offload_device = host.devices("vae")
        path = file_path("vae", vae_name, VAE_FILE)
        vae = load_flux1_vae(path, dtype=host.vae_dtype(load_device), device=offload_device)
        return io.NodeOutput(types.FillVAE(vae, host.manage(vae, load_device, offload_device)))
