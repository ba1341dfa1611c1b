"""A test-only ComfyUI node pack, loaded by the integration tests next to comfyui-flux2-klein (never shipped).

``Flux2KleinTestToNativeConditioning`` turns our FLUX2_KLEIN_CONDITIONING into native ``CONDITIONING``
with the payload's own ``to_native()``, so a native graph (CFGGuider, ReferenceLatent,
SamplerCustomAdvanced) can be fed exactly the text embedding our sampler gets. Native ComfyUI cannot load
the tiny random Qwen3 the tests use (CLIPLoader only knows the full Qwen3-4B/8B shapes), which is why the
embedding is injected.

``Flux1FillTestProbeConditioning`` makes, from a seed, one random text conditioning shaped like FLUX.1's
(T5-XXL states [1, L, 4096] and a CLIP-L pooled vector [1, 768]) and gives the very same tensors twice: as
native ``CONDITIONING`` and as our Fill conditioning. Native ComfyUI's CLIP-L and T5-XXL have fixed, full-size
configurations, so the Fill parity test cannot give both sides one tiny text encoder.

Nothing here imports the product or ComfyUI: the payloads are used and built by duck typing.
"""

FILL_CONDITIONING = "FLUX1_FILL_CONDITIONING"  # the socket type of our Fill text encode's output


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


class ProbeFillConditioning:
    """What our Fill sampler reads of a conditioning: T5 states and the CLIP pooled vector (float32)."""

    def __init__(self, t5, pooled):
        self.t5, self.pooled = t5, pooled


class Flux1FillTestProbeConditioning:
    DESCRIPTION = (
        "TEST ONLY: a seeded random FLUX.1 text conditioning (T5 [1, tokens, 4096], CLIP pooled [1, 768]), "
        "as native CONDITIONING and as FLUX.1 Fill conditioning (the same tensors; integration tests)."
    )
    CATEGORY = "testing/flux2_klein"
    RETURN_TYPES = ("CONDITIONING", FILL_CONDITIONING)
    RETURN_NAMES = ("native", "fill")
    FUNCTION = "emit"

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1}),
                "tokens": ("INT", {"default": 512, "min": 1, "max": 4096}),
            }
        }

    def emit(self, seed, tokens):
        import torch

        g = torch.Generator().manual_seed(seed)
        t5 = torch.randn(1, tokens, 4096, generator=g)
        pooled = torch.randn(1, 768, generator=g)
        return [[t5, {"pooled_output": pooled}]], ProbeFillConditioning(t5, pooled)


NODE_CLASS_MAPPINGS = {
    "Flux2KleinTestToNativeConditioning": Flux2KleinTestToNativeConditioning,
    "Flux1FillTestProbeConditioning": Flux1FillTestProbeConditioning,
}
NODE_DISPLAY_NAME_MAPPINGS = {
    "Flux2KleinTestToNativeConditioning": "FLUX.2 [klein] TEST ONLY: to native CONDITIONING",
    "Flux1FillTestProbeConditioning": "FLUX.1 Fill TEST ONLY: probe text conditioning",
}
