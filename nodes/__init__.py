"""The node classes this pack registers with ComfyUI (V3 API: ``io.ComfyNode``). Node ids are a public
contract: never rename one.

The FLUX.2 nodes serve klein and dev alike, so their display names say "FLUX.2" (their ids keep "Klein");
the LoRA loader is klein's only and keeps "[klein]" in its name."""

from .controlnet import Flux2DevApplyControlNet, Flux2DevControlNetLoader
from .decode import Flux2KleinDecode
from .editing import Flux2KleinComposite, Flux2KleinEncode, Flux2KleinInpaintPrepare, Flux2KleinOutpaintPad
from .extrapolation import Flux2KleinPositionExtrapolation
from .fill import Flux1FillDecode, Flux1FillSampler, Flux1FillTextEncode
from .fill_loaders import Flux1FillModelLoader, Flux1FillTextEncoderLoader, Flux1FillVAELoader
from .host import plain_error_names
from .loaders import Flux2KleinModelLoader, Flux2KleinTextEncoderLoader, Flux2KleinVAELoader
from .lora import Flux2KleinLoraLoader
from .native import Flux2KleinFromNativeConditioning, Flux2KleinToNativeConditioning, Flux2KleinToNativeModel
from .reference_encode import Flux2KleinReferenceEncode
from .regional import Flux2KleinRegionalPrompt
from .requirements import report_missing_packages
from .sampler import Flux2KleinSampler
from .sockets import ComfyExtension, io
from .text_encode import Flux2KleinTextEncode
from .tiled_refine import Flux2KleinTiledRefine

NODES: list[type[io.ComfyNode]] = [
    Flux2KleinModelLoader,
    Flux2KleinTextEncoderLoader,
    Flux2KleinVAELoader,
    Flux2KleinTextEncode,
    Flux2KleinReferenceEncode,
    Flux2KleinRegionalPrompt,
    Flux2DevControlNetLoader,
    Flux2DevApplyControlNet,
    Flux2KleinSampler,
    Flux2KleinTiledRefine,
    Flux2KleinDecode,
    Flux2KleinEncode,
    Flux2KleinInpaintPrepare,
    Flux2KleinComposite,
    Flux2KleinOutpaintPad,
    Flux2KleinLoraLoader,
    Flux2KleinToNativeModel,
    Flux2KleinToNativeConditioning,
    Flux2KleinFromNativeConditioning,
    Flux2KleinPositionExtrapolation,
    Flux1FillModelLoader,
    Flux1FillTextEncoderLoader,
    Flux1FillVAELoader,
    Flux1FillTextEncode,
    Flux1FillSampler,
    Flux1FillDecode,
]


class Flux2KleinExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return list(NODES)


async def comfy_entrypoint() -> Flux2KleinExtension:
    """What ComfyUI calls when it loads this pack (V3 registration)."""
    plain_error_names()
    report_missing_packages()
    return Flux2KleinExtension()


__all__ = ["NODES", "comfy_entrypoint"]
