"""The words the node search finds each node by, besides its display name (V3 ``Schema.search_aliases``).

Users search for the model ("klein", "flux 2", "flux2", "dev", "fill"), for the task ("edit", "inpaint",
"img2img", "regional") or for the native node they know ("KSampler", "Load Diffusion Model", "CLIP Text
Encode"); Chinese users often type the task in Chinese. One table, so the words stay consistent."""

from __future__ import annotations

KLEIN = ("klein", "flux 2", "flux2", "flux.2")
FILL = ("flux 1 fill", "flux1 fill", "fill", "flux.1")

ALIASES: dict[str, tuple[str, ...]] = {
    "Flux2KleinModelLoader": (*KLEIN, "load diffusion model", "unet loader", "checkpoint", "flux 2 dev",
                              "gguf", "fp8", "模型加载"),
    "Flux2KleinTextEncoderLoader": (*KLEIN, "load clip", "qwen3", "mistral", "text encoder", "文本编码器"),
    "Flux2KleinVAELoader": (*KLEIN, "load vae", "vae", "VAE加载"),
    "Flux2KleinTextEncode": (*KLEIN, "clip text encode", "prompt", "positive", "negative", "提示词"),
    "Flux2KleinReferenceEncode": (*KLEIN, "reference latent", "reference image", "edit", "multi reference",
                                  "image edit", "参考图", "编辑"),
    "Flux2KleinRegionalPrompt": (*KLEIN, "regional", "region", "area prompt", "mask prompt", "区域提示词"),
    "Flux2DevControlNetLoader": ("flux 2 dev", "flux2 dev", "controlnet", "fun controlnet", "union",
                                 "load controlnet", "控制网"),
    "Flux2DevApplyControlNet": ("flux 2 dev", "flux2 dev", "controlnet", "apply controlnet", "pose", "depth",
                                "canny", "控制网"),
    "Flux2KleinSampler": (*KLEIN, "ksampler", "sampler", "generate", "text to image", "txt2img", "edit",
                          "img2img", "采样器"),
    "Flux2KleinTiledRefine": (*KLEIN, "upscale", "tiled upscale", "ultimate sd upscale", "tiled diffusion",
                              "refine", "hi-res fix", "4k", "放大", "高清修复"),
    "Flux2KleinDecode": (*KLEIN, "vae decode", "decode", "tiled decode", "解码"),
    "Flux2KleinEncode": (*KLEIN, "vae encode", "encode", "img2img", "编码"),
    "Flux2KleinInpaintPrepare": (*KLEIN, "inpaint", "mask", "inpaint crop", "局部重绘"),
    "Flux2KleinComposite": (*KLEIN, "inpaint", "composite", "stitch", "paste back", "局部重绘"),
    "Flux2KleinOutpaintPad": (*KLEIN, "outpaint", "pad image", "extend", "扩图"),
    "Flux2KleinLoraLoader": (*KLEIN, "lora", "load lora", "lycoris", "lokr", "refcontrol"),
    "Flux2KleinToNativeModel": (*KLEIN, "native", "model", "bridge", "ksampler"),
    "Flux2KleinToNativeConditioning": (*KLEIN, "native", "conditioning", "bridge", "reference latent"),
    "Flux2KleinFromNativeConditioning": (*KLEIN, "native", "conditioning", "bridge", "clip text encode"),
    "Flux2KleinPositionExtrapolation": (*KLEIN, "dype", "high resolution", "hi-res", "4k", "upscale",
                                        "rope", "ntk", "yarn", "高分辨率"),
    "Flux1FillModelLoader": (*FILL, "load diffusion model", "inpaint", "outpaint"),
    "Flux1FillTextEncoderLoader": (*FILL, "dual clip loader", "t5", "clip l"),
    "Flux1FillVAELoader": (*FILL, "load vae", "ae"),
    "Flux1FillTextEncode": (*FILL, "clip text encode", "prompt"),
    "Flux1FillSampler": (*FILL, "inpaint", "outpaint", "ksampler", "局部重绘", "扩图"),
    "Flux1FillDecode": (*FILL, "vae decode", "decode"),
}  # fmt: skip


def search_aliases(node_id: str) -> list[str]:
    """The search words of ``node_id`` (every node has some: a KeyError names a node left out)."""
    return list(ALIASES[node_id])
