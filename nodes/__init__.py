"""The node classes ComfyUI registers (V1 API). Node ids are a public contract: never rename one.

The FLUX.2 nodes serve klein and dev alike, so their display names say "FLUX.2" (their ids keep "Klein");
the LoRA loader is klein's only and keeps "[klein]" in its name."""

from .decode import Flux2KleinDecode
from .editing import Flux2KleinComposite, Flux2KleinEncode, Flux2KleinInpaintPrepare, Flux2KleinOutpaintPad
from .fill import Flux1FillDecode, Flux1FillSampler, Flux1FillTextEncode
from .fill_loaders import Flux1FillModelLoader, Flux1FillTextEncoderLoader, Flux1FillVAELoader
from .loaders import Flux2KleinModelLoader, Flux2KleinTextEncoderLoader, Flux2KleinVAELoader
from .lora import Flux2KleinLoraLoader
from .native import Flux2KleinFromNativeConditioning, Flux2KleinToNativeConditioning, Flux2KleinToNativeModel
from .reference_encode import Flux2KleinReferenceEncode
from .sampler import Flux2KleinSampler
from .text_encode import Flux2KleinTextEncode

NODE_CLASS_MAPPINGS = {
    "Flux2KleinModelLoader": Flux2KleinModelLoader,
    "Flux2KleinTextEncoderLoader": Flux2KleinTextEncoderLoader,
    "Flux2KleinVAELoader": Flux2KleinVAELoader,
    "Flux2KleinTextEncode": Flux2KleinTextEncode,
    "Flux2KleinReferenceEncode": Flux2KleinReferenceEncode,
    "Flux2KleinSampler": Flux2KleinSampler,
    "Flux2KleinDecode": Flux2KleinDecode,
    "Flux2KleinEncode": Flux2KleinEncode,
    "Flux2KleinInpaintPrepare": Flux2KleinInpaintPrepare,
    "Flux2KleinComposite": Flux2KleinComposite,
    "Flux2KleinOutpaintPad": Flux2KleinOutpaintPad,
    "Flux2KleinLoraLoader": Flux2KleinLoraLoader,
    "Flux2KleinToNativeModel": Flux2KleinToNativeModel,
    "Flux2KleinToNativeConditioning": Flux2KleinToNativeConditioning,
    "Flux2KleinFromNativeConditioning": Flux2KleinFromNativeConditioning,
    "Flux1FillModelLoader": Flux1FillModelLoader,
    "Flux1FillTextEncoderLoader": Flux1FillTextEncoderLoader,
    "Flux1FillVAELoader": Flux1FillVAELoader,
    "Flux1FillTextEncode": Flux1FillTextEncode,
    "Flux1FillSampler": Flux1FillSampler,
    "Flux1FillDecode": Flux1FillDecode,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "Flux2KleinModelLoader": "FLUX.2 Model Loader",
    "Flux2KleinTextEncoderLoader": "FLUX.2 Text Encoder Loader",
    "Flux2KleinVAELoader": "FLUX.2 VAE Loader",
    "Flux2KleinTextEncode": "FLUX.2 Text Encode",
    "Flux2KleinReferenceEncode": "FLUX.2 Reference Encode",
    "Flux2KleinSampler": "FLUX.2 Sampler",
    "Flux2KleinDecode": "FLUX.2 Decode",
    "Flux2KleinEncode": "FLUX.2 Encode",
    "Flux2KleinInpaintPrepare": "FLUX.2 Inpaint Prepare",
    "Flux2KleinComposite": "FLUX.2 Composite",
    "Flux2KleinOutpaintPad": "FLUX.2 Outpaint Pad",
    "Flux2KleinLoraLoader": "FLUX.2 [klein] LoRA Loader",
    "Flux2KleinToNativeModel": "FLUX.2 to native MODEL",
    "Flux2KleinToNativeConditioning": "FLUX.2 to native CONDITIONING",
    "Flux2KleinFromNativeConditioning": "FLUX.2 from native CONDITIONING",
    "Flux1FillModelLoader": "FLUX.1 Fill [dev] Model Loader",
    "Flux1FillTextEncoderLoader": "FLUX.1 Fill [dev] Text Encoder Loader",
    "Flux1FillVAELoader": "FLUX.1 Fill [dev] VAE Loader",
    "Flux1FillTextEncode": "FLUX.1 Fill [dev] Text Encode",
    "Flux1FillSampler": "FLUX.1 Fill [dev] Sampler",
    "Flux1FillDecode": "FLUX.1 Fill [dev] Decode",
}

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
