"""Loader nodes: a file chosen from ComfyUI's model folders -> a core model on its offload device + a patcher.

Files are only ever found through ``folder_paths`` (the combo lists and their paths). Each loader builds the
module on the device ComfyUI offloads it to; ``host.load`` moves it to the compute device right before use.
ComfyUI caches node outputs, so a file is loaded once until its inputs change or memory runs short. A DiT
whose blocks are split across devices (``devices``) gets one patcher per device (``split.py``).
"""

from __future__ import annotations

import logging

import torch

from ..flux2_core import (
    VARIANTS,
    Flux2Error,
    enable_streaming,
    load_text_encoder,
    load_transformer,
    load_vae,
    parse_devices,
    split_devices,
)
from . import host, sockets, types
from .aliases import KLEIN
from .inputs import file_choices, file_path, quant_compute_input
from .kv_store import KV_STORE
from .sockets import io
from .split import split_patchers

VARIANT_CHOICES = ("auto", *VARIANTS)  # distilled, base, kv (klein) and dev
WEIGHT_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
TEXT_ENCODER_DEVICES = ("default", "cpu")  # then the accelerators this machine has (cuda:0, ...)
CATEGORY = "flux2_klein/loaders"
log = logging.getLogger(__name__)

TOOLTIPS = {
    "model_name": "A FLUX.2 model from models/diffusion_models (or models/unet): klein 4B / 9B / base / "
    "9B-KV or FLUX.2 [dev] (flux2-dev.safetensors, flux2_dev_fp8mixed.safetensors); bf16, fp8, nvfp4, int8 "
    ".safetensors (BFL or ComfyUI layout) or a .gguf file. Which model it is, is read from the weights.",
    "variant": "How the weights are sampled; auto reads it from the weights, the file's metadata or its "
    "name. distilled: 4 steps, no CFG. base: about 50 steps, CFG (guidance > 1 needs a negative prompt). "
    "kv: the 9B-KV model, which computes the references' attention keys/values once and reuses them. dev: "
    "FLUX.2 [dev] (auto finds it by its guidance embedder): about 50 steps, guidance about 4 embedded in the "
    "model (one pass per step, no negative prompt).",
    "weight_dtype": "Precision the model computes in. default: bfloat16 on a GPU that supports it, else "
    "float32, and quantised files (fp8, nvfp4, int8, GGUF) stay quantised in memory, dequantised layer by "
    "layer as they run. A chosen dtype also dequantises a quantised file once, at load (more memory).",
    "text_encoder_name": "From models/text_encoders (or models/clip): qwen_3_4b.safetensors (klein 4B), "
    "qwen_3_8b.safetensors (klein 9B) or mistral_3_small_flux2_bf16.safetensors (FLUX.2 [dev], also _fp8). "
    "Qwen3: bf16, fp8mixed or GGUF (e.g. Qwen3-4B-Q8_0.gguf); Mistral: bf16 or fp8. Which one it is, is "
    "read from the weights.",
    "device": "default: where ComfyUI runs text encoders (the GPU when there is room); the encoder leaves it "
    "after each prompt, so the diffusion model has the room. cpu: always on the CPU in float32, which saves "
    "VRAM but is slow. A device (e.g. cuda:1): the encoder runs there and stays between prompts, so the "
    "diffusion model can sit on another card.",
    "offload": "none: the whole model moves to the GPU to sample. stream: the blocks stay in CPU memory and "
    "each is copied to the GPU just before it runs (overlapped with compute), so 9B runs in a few GB of "
    "VRAM, at the cost of the copies.",
    "resident_mb": "With offload stream: MB of model weights kept on the GPU (the rest is streamed); 0 "
    "streams every block. More is faster when the card has the room.",
    "devices": "Split the model's blocks across several GPUs of this machine, e.g. cuda:0,cuda:1: each "
    "block runs on one card and the activations move between them, so FLUX.2 [dev] (64 GB in bf16) fits on "
    "two 40-48 GB cards. The blocks are divided by weight bytes; the parts outside them stay on the first "
    "device. One device (cuda:1) puts the whole model there. Empty: ComfyUI's device. Not with offload "
    "stream. The memory each device holds is written to the log (and to the node's output text, in the "
    "history).",
    "vae_name": "The FLUX.2 VAE (flux2-vae.safetensors, 32 latent channels) from models/vae, for klein and "
    "dev.",
}


class Flux2KleinModelLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinModelLoader",
            search_aliases=[
                *KLEIN,
                "load diffusion model",
                "unet loader",
                "checkpoint",
                "flux 2 dev",
                "gguf",
                "fp8",
                "模型加载",
            ],  # fmt: skip
            display_name="FLUX.2 Model Loader",
            category=CATEGORY,
            description=(
                "Loads a FLUX.2 diffusion model from models/diffusion_models: klein (4B, 9B, base or 9B-KV) "
                "or FLUX.2 [dev], told apart by the weights. devices splits its blocks across several GPUs."
            ),
            inputs=[
                io.Combo.Input(
                    "model_name", options=file_choices("diffusion_models"), tooltip=TOOLTIPS["model_name"]
                ),
                io.Combo.Input(
                    "variant", options=list(VARIANT_CHOICES), tooltip=TOOLTIPS["variant"], default="auto"
                ),
                io.Combo.Input(
                    "weight_dtype",
                    options=["default", *WEIGHT_DTYPES],
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["weight_dtype"],
                    default="default",
                ),  # fmt: skip
                io.Combo.Input(
                    "offload",
                    options=["none", "stream"],
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["offload"],
                    default="none",
                ),  # fmt: skip
                io.Int.Input(
                    "resident_mb",
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["resident_mb"],
                    default=0,
                    min=0,
                    max=1 << 20,
                    step=256,
                ),  # fmt: skip
                io.String.Input(
                    "devices",
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["devices"],
                    default="",
                    multiline=False,
                ),
                quant_compute_input(),
            ],
            outputs=[
                sockets.Model.Output(display_name="model", tooltip="The FLUX.2 DiT, for the FLUX.2 Sampler.")
            ],
        )

    @classmethod
    def validate_inputs(cls, devices=None):
        if devices and devices.strip():  # a linked value arrives as None and is checked at run time
            try:
                parse_devices(devices)
            except Flux2Error as e:
                return str(e)
        return True

    @classmethod
    def execute(cls, model_name: str, variant: str, weight_dtype: str = "default", offload: str = "none",
                resident_mb=0, devices: str = "", quant_compute: str = "auto") -> io.NodeOutput:  # fmt: skip
        chosen = split_devices(devices, streamed=offload == "stream")
        load_device, offload_device = host.devices("diffusion_model", device=chosen[0] if chosen else None)
        dtype = WEIGHT_DTYPES.get(weight_dtype) or host.default_dtype(load_device)
        # A chosen dtype dequantises quantised files at load; so does Apple's MPS, which cannot hold float8.
        keep = weight_dtype == "default" and all(d.type != "mps" for d in (chosen or [load_device]))
        path = file_path("diffusion_models", model_name)
        model = load_transformer(path, variant=variant, dtype=dtype, device=offload_device,
                                 keep_quantized=keep, quant_compute=quant_compute)  # fmt: skip
        if offload == "stream":  # before the patcher: it then manages (and moves) only the resident part
            resident = int(resident_mb) * 2**20
            enable_streaming(model.transformer, load_device, resident_bytes=resident, move=False)
        if len(chosen) > 1:
            patchers, split = split_patchers(model.transformer, chosen, offload_device)
            log.info("%s split across %d devices: %s", model_name, len(chosen), split)
        else:
            patchers, split = [host.manage(model.transformer, load_device, offload_device)], ""
        for patcher in patchers:
            # the 9B-KV references' K/V kept for this model live on its device: they go when it leaves it
            host.on_unload(patcher, lambda: KV_STORE.forget_model(model.transformer))
        loaded = types.KleinModel(model, patchers[0], tuple(patchers[1:]), split)
        # the memory per device of a split, also in the node's output text (the executed message, /history)
        return sockets.output(loaded, text=split)


class Flux2KleinTextEncoderLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinTextEncoderLoader",
            search_aliases=[*KLEIN, "load clip", "qwen3", "mistral", "text encoder", "文本编码器"],
            display_name="FLUX.2 Text Encoder Loader",
            category=CATEGORY,
            description=(
                "Loads the text encoder of a FLUX.2 model from models/text_encoders: Qwen3-4B for klein 4B, "
                "Qwen3-8B for klein 9B, Mistral-Small-3.2-24B for FLUX.2 [dev] (told apart by the weights)."
            ),
            inputs=[
                io.Combo.Input(
                    "text_encoder_name",
                    options=file_choices("text_encoders"),
                    tooltip=TOOLTIPS["text_encoder_name"],
                ),
                io.Combo.Input(
                    "device",
                    options=[*TEXT_ENCODER_DEVICES, *_accelerators()],
                    optional=True,
                    advanced=True,
                    tooltip=TOOLTIPS["device"],
                    default="default",
                ),  # fmt: skip
            ],
            outputs=[
                sockets.TextEncoder.Output(
                    display_name="text_encoder",
                    tooltip="The Qwen3 or Mistral text encoder, for FLUX.2 Text Encode.",
                )
            ],
        )

    @classmethod
    def execute(cls, text_encoder_name: str, device: str = "default"):
        chosen = parse_devices(device)[0] if device not in TEXT_ENCODER_DEVICES else None
        load_device, offload_device = host.devices("text_encoder", cpu=device == "cpu", device=chosen)
        path = file_path("text_encoders", text_encoder_name)
        encoder = load_text_encoder(
            path,
            dtype=host.default_dtype(load_device),
            device=offload_device,
            keep_quantized=load_device.type != "mps",
        )  # a FLUX.1 T5 / CLIP file is refused by name, with the files FLUX.2 needs
        patcher = host.manage(encoder.model, load_device, offload_device)
        return io.NodeOutput(types.KleinTextEncoder(encoder, patcher, keep_loaded=chosen is not None))


def _accelerators() -> list[str]:
    """The accelerators of this machine by name (cuda:0, cuda:1, ...), for the text encoder's device."""
    names = [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        names += [f"xpu:{i}" for i in range(xpu.device_count())]
    return names


class Flux2KleinVAELoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinVAELoader",
            search_aliases=[*KLEIN, "load vae", "vae", "VAE加载"],
            display_name="FLUX.2 VAE Loader",
            category=CATEGORY,
            description=(
                "Loads the FLUX.2 VAE (flux2-vae.safetensors, the same for klein and dev) from models/vae."
            ),
            inputs=[io.Combo.Input("vae_name", options=file_choices("vae"), tooltip=TOOLTIPS["vae_name"])],
            outputs=[
                sockets.Vae.Output(
                    display_name="vae", tooltip="The FLUX.2 autoencoder, for Reference Encode and Decode."
                )
            ],
        )

    @classmethod
    def execute(cls, vae_name: str):
        load_device, offload_device = host.devices("vae")
        path = file_path("vae", vae_name)
        vae = load_vae(path, dtype=host.vae_dtype(load_device), device=offload_device)
        return io.NodeOutput(types.KleinVAE(vae, host.manage(vae, load_device, offload_device)))
