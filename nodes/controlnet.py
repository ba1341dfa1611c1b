"""FLUX.2 [dev] with the Fun ControlNet Union: its loader, and the node that attaches it to a conditioning.

Flux2DevControlNetLoader loads ``FLUX.2-dev-Fun-Controlnet-Union(-2602).safetensors`` from models/controlnet
(``flux2_core.load_controlnet``) with a patcher of its own, loaded beside the DiT when the sampler runs.
Flux2DevApplyControlNet keeps the control map (and, for the inpaint mode, the mask and the image to inpaint)
with the conditioning; the FLUX.2 Sampler builds the control context at its output size (the maps are
resized to it) and adds the hints over the chosen part of the schedule.
"""

from __future__ import annotations

from dataclasses import replace

from ..flux2_core import MAX_CONTROL_STRENGTH, ControlSource, enable_streaming, load_controlnet
from . import convert, host, sockets, types
from .aliases import DEV
from .inputs import file_choices, file_path, quant_compute_input
from .sockets import io

FOLDER = "controlnet"
CONTROL_FILE = "FLUX.2-dev-Fun-Controlnet-Union-2602.safetensors"
ControlNetSocket = io.Custom(types.CONTROL_NET)


class Flux2DevControlNetLoader(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2DevControlNetLoader",
            search_aliases=[*DEV, "controlnet", "fun controlnet", "union", "load controlnet", "控制网"],
            display_name="FLUX.2 [dev] Fun ControlNet Loader",
            category="flux2_klein/loaders",
            description=(
                "Loads the FLUX.2 [dev] Fun ControlNet Union (alibaba-pai) from models/controlnet: one "
                "network for pose, depth, canny, HED, MLSD (2602: scribble, gray, inpaint) maps. For FLUX.2 "
                "[dev] only."
            ),
            inputs=[
                io.Combo.Input(
                    "control_net_name",
                    options=file_choices(FOLDER, CONTROL_FILE),
                    tooltip="FLUX.2-dev-Fun-Controlnet-Union(-2602).safetensors from models/controlnet "
                    "(bf16, or an fp8 version of it).",
                ),
                quant_compute_input(),
                io.Combo.Input(
                    "offload",
                    options=["none", "stream"],
                    optional=True,
                    advanced=True,
                    default="none",
                    tooltip="none: the whole control net moves to the GPU to sample (8.2 GB in bf16). "
                    "stream: its blocks stay in CPU memory and are copied to the GPU one at a time, as the "
                    "model loader's offload stream does (use both on cards that cannot hold dev).",
                ),
            ],
            outputs=[
                ControlNetSocket.Output(
                    display_name="control_net", tooltip="The control net, for FLUX.2 [dev] Apply ControlNet."
                )
            ],
        )

    @classmethod
    def execute(
        cls, control_net_name: str, quant_compute: str = "auto", offload: str = "none"
    ) -> io.NodeOutput:
        load_device, offload_device = host.devices("diffusion_model")
        net = load_controlnet(
            file_path(FOLDER, control_net_name, CONTROL_FILE),
            dtype=host.default_dtype(load_device),
            device=offload_device,
            keep_quantized=load_device.type != "mps",
            quant_compute=quant_compute,
        )
        if offload == "stream":  # before the patcher: it then manages (and moves) only the resident part
            enable_streaming(net, load_device, move=False)
        return io.NodeOutput(types.ControlNet(net, host.manage(net, load_device, offload_device)))


class Flux2DevApplyControlNet(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        fraction = {"min": 0.0, "max": 1.0, "step": 0.01}
        return io.Schema(
            node_id="Flux2DevApplyControlNet",
            search_aliases=[*DEV, "controlnet", "apply controlnet", "pose", "depth", "canny", "控制网"],
            display_name="FLUX.2 [dev] Apply ControlNet",
            category="flux2_klein/conditioning",
            description=(
                "Steers FLUX.2 [dev] with a control map (pose, depth, canny, ...; make it with a "
                "preprocessor pack or load one). With a mask and an image it inpaints under control. The "
                "FLUX.2 Sampler reads it from the conditioning."
            ),
            inputs=[
                sockets.Conditioning.Input("conditioning", tooltip="The prompt, from FLUX.2 Text Encode."),
                ControlNetSocket.Input("control_net", tooltip="From FLUX.2 [dev] Fun ControlNet Loader."),
                sockets.Vae.Input("vae", tooltip="The FLUX.2 VAE: it encodes the control map."),
                io.Image.Input(
                    "control_image",
                    tooltip="The control map (any size: resized to the output). Maps come from preprocessor "
                    "nodes (DWPose, Depth Anything, Canny) or as images.",
                ),
                io.Float.Input(
                    "strength",
                    default=0.75,
                    min=0.0,
                    max=MAX_CONTROL_STRENGTH,
                    step=0.05,
                    tooltip="How strongly the map steers: 0.65-0.80 recommended; 0 is no control.",
                ),  # fmt: skip
                io.Float.Input(
                    "start",
                    default=0.0,
                    **fraction,
                    tooltip="The fraction of the steps where control starts.",
                ),
                io.Float.Input(
                    "end", default=1.0, **fraction, tooltip="The fraction of the steps where control ends."
                ),
                io.Mask.Input(
                    "mask", optional=True, tooltip="Inpaint mode: white = regenerate (with image)."
                ),
                io.Image.Input(
                    "image", optional=True, tooltip="Inpaint mode: the picture to inpaint (with mask)."
                ),
            ],
            outputs=[
                sockets.Conditioning.Output(
                    display_name="conditioning",
                    tooltip="The prompt with the control, for the FLUX.2 Sampler.",
                )
            ],
        )

    @classmethod
    def execute(
        cls, conditioning, control_net, vae, control_image, strength, start, end, mask=None, image=None
    ) -> io.NodeOutput:
        source = ControlSource(
            control_net.net, vae.vae, convert.first_image(control_image), convert.first_mask(mask),
            convert.first_image(image), strength, start, end, load_vae=lambda: host.load(vae.patcher),
        )  # fmt: skip
        pending = types.PendingControl(source, control_net.patcher)
        return io.NodeOutput(replace(conditioning, control=pending))
