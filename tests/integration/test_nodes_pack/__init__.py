"""A test-only ComfyUI node pack, loaded by the integration tests next to comfyui-flux2-klein (never shipped).

``Flux2KleinTestToNativeConditioning`` turns our FLUX2_KLEIN_CONDITIONING into native ``CONDITIONING``
with the payload's own ``to_native()``, so a native graph (CFGGuider, ReferenceLatent,
SamplerCustomAdvanced) can be fed exactly the text embedding our sampler gets. Native ComfyUI cannot load
the tiny random Qwen3 the tests use (CLIPLoader only knows the full Qwen3-4B/8B shapes), which is why the
embedding is injected.

Nothing here imports the product or ComfyUI: the payload is used by duck typing.
"""


class Flux2KleinTestToNativeConditioning:
    DESCRIPTION = "TEST ONLY: FLUX.2 [klein] conditioning -> native CONDITIONING (integration tests)."
    CATEGORY = "testing/flux2_klein"
    RETURN_TYPES = ("CONDITIONING",)
    RETURN_NAMES = ("conditioning",)
    FUNCTION = "convert"

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"conditioning": ("FLUX2_KLEIN_CONDITIONING",)}}

    def convert(self, conditioning):
        return (conditioning.to_native(),)


NODE_CLASS_MAPPINGS = {"Flux2KleinTestToNativeConditioning": Flux2KleinTestToNativeConditioning}
NODE_DISPLAY_NAME_MAPPINGS = {
    "Flux2KleinTestToNativeConditioning": "FLUX.2 [klein] TEST ONLY: to native CONDITIONING"
}
