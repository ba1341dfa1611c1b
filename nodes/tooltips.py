"""Tooltips more than one node shows: the FLUX.2 Sampler's (FLUX.2 Tiled Refine and FLUX.2 Position
Extrapolation reuse some), quantised compute (every loader of a DiT or a control net), the VAE's tiles and a
decoded image (FLUX.2 and FLUX.1 Fill decode). Declares no node."""

from __future__ import annotations

from ..flux2_core import STEP_CACHE_HELP

SAMPLER = {
    "model": "From FLUX.2 Model Loader.",
    "positive": "The prompt, from FLUX.2 Text Encode (its text encoder must be the model's).",
    "seed": "Noise seed. The noise is drawn on the CPU, so a seed gives the same image on any device.",
    "steps": "4 for distilled and KV, about 50 for base and for dev (28 is a good trade-off for dev).",
    "guidance": "base: CFG scale (about 4; above 1 it needs a negative prompt). dev: the guidance value "
    "embedded in the model (about 4; one pass per step, no negative prompt). Distilled and KV models ignore "
    "it: keep 1.",
    "width": "Output width in pixels, a multiple of 16 (at least 64). 0: the first reference's width after "
    "its pixel cap; without references the control map's at about 1 megapixel (FLUX.2 [dev] Apply "
    "ControlNet), else 1024.",
    "height": "Output height in pixels, a multiple of 16 (at least 64). 0: the first reference's height "
    "after its pixel cap; without references the control map's at about 1 megapixel, else 1024.",
    "batch_size": "Images per run (each from its own slice of one noise draw).",
    "negative": "Negative prompt for base models with guidance > 1 (an empty prompt is the usual choice). "
    "Distilled, KV and dev models do not use it.",
    "references": "Reference images to edit or combine, from FLUX.2 Reference Encode.",
    "latent": "Optional: its shape sets width, height and batch size (e.g. EmptyFlux2LatentImage). With "
    "denoise below 1 it is the image to start from (img2img, e.g. FLUX.2 Encode); with a noise_mask "
    "(FLUX.2 Inpaint Prepare, or native Set Latent Noise Mask) only the mask's area is repainted. "
    "Otherwise its content is ignored: sampling starts from pure noise.",
    "denoise": "How much of the schedule runs from the latent: 1 repaints fully (text-to-image, or inpaint "
    "from noise), lower keeps more of the latent (img2img: the first steps are skipped, as in diffusers).",
    "kv_cache": "9B-KV model only (others ignore it): reuse keeps the references' keys/values across runs, "
    "so a new prompt or seed with the same references skips the reference pass (same output as without). "
    "off: compute every run.",
    "step_cache": STEP_CACHE_HELP,
    "sigmas": "Optional: a schedule from a native node (ManualSigmas, BasicScheduler, Flux2Scheduler, ...), "
    "run as given instead of this sampler's own: steps becomes the list's steps (a final 0 is added when "
    "missing) and denoise below 1 skips the list's first steps. Values from 1 down to 0, each below the one "
    "before.",
    "position_extrapolation": "For images past extrapolation_base on a side (4 MP and beyond): dype moves "
    "the image's RoPE frequencies per axis as the noise falls (DyPE), so one pass keeps the layout of a "
    "picture larger than the model was trained on. off, or an image within the base: today's output exactly.",
    "extrapolation_base": "Pixels per side the model handles natively (klein: 2048, trained to about 4 MP); "
    "only longer sides are extrapolated.",
}

QUANT_COMPUTE = (
    "How the layers of a quantised file multiply. auto: in their own format where the GPU can, through "
    "comfy-kitchen as native ComfyUI does (fp8 on RTX 40xx / Ada, Hopper and newer; nvfp4 and mxfp8 on "
    "Blackwell; convrot_w4a4 everywhere; W4A8 on RTX 30xx / Ampere and newer; AWQ where a GPU kernel "
    "exists; int8 and W4A8 on a CPU where they measure faster than bf16 there), else dequantised first. "
    "dequantize: always dequantised to the "
    "compute dtype first (the numerics of a bf16 matmul, slower on those GPUs). format: in format wherever "
    "a kernel exists, even comfy-kitchen's slow CPU fallback (for checking). The log says per format which "
    "ran. Memory stays the file's size either way; LoRAs add on top."
)

TILE_SIZE = (
    "Decode in square tiles of this many pixels, for large images on small cards (memory then grows with the "
    "tile, not the image). 0 = automatic: the whole image at once when it fits in free memory, else the "
    "largest tile that fits. Tiles differ slightly from a whole-image decode; larger tiles are closer."
)
TILE_OVERLAP = (
    "Pixels neighbouring tiles share; they are blended smoothly so no seam shows. Must be under half the "
    "tile size. Only used when tiling."
)

IMAGE_OUTPUT = "Images [batch, height, width, 3] in 0..1."
