"""The FLUX.1 Fill [dev] workflows: inpaint and outpaint. The sampler prepares the image itself (grow,
crop-to-mask) and hands FLUX.2 Composite what it needs; outpainting goes through the same Outpaint Pad
node."""

from __future__ import annotations

from dataclasses import dataclass

from .graph import Graph
from .layout import (
    GENERATE,
    IMAGE_TITLES,
    LOADER_SIZE,
    MASK_HINT,
    MASK_NOTE,
    SEED,
    finish,
    image_column,
    load_image,
    loaders,
    outpaint_pad,
    prompt,
)
from .notes import brief, file_rows
from .recipe import Mode
from .schemas import FILES

FILL_FILES = ("flux1-fill-dev.safetensors", "t5xxl_fp16.safetensors", "clip_l.safetensors", "ae.safetensors")
FILL_STEPS, FILL_GUIDANCE = 50, 30.0


@dataclass(frozen=True)
class FillRecipe:
    name: str
    title: str
    summary: str
    prompt: str
    mode: Mode  # INPAINT or OUTPAINT
    settings: str = ""


FILL_SETTINGS = (
    "**50 steps, guidance 30** (BFL's and diffusers' defaults): the guidance is embedded in the model, one "
    "pass per step, no negative prompt. Keep it near 30: low values (ComfyUI's usual 3.5) give blurry, "
    "washed-out fills. 20–30 steps give usable drafts. The mask is read at 0.5: white (1) is repainted, "
    "black (0) kept."
)

FILL_RECIPES = (
    FillRecipe(
        name="flux1_fill_inpaint",
        title="FLUX.1 Fill [dev]: inpaint",
        summary=(
            "Repaints the masked part of an image following the prompt with BFL's inpainting model, then "
            "puts the result back over the original, so every pixel outside the mask stays exactly as it "
            "was. Load the image in *Image to inpaint*, then right-click it and choose *Open in MaskEditor* "
            "to paint the area to repaint."
        ),
        prompt="A small wooden table with a vase of red tulips.",
        mode=Mode.INPAINT,
        settings=(
            f"{FILL_SETTINGS}\n\nThe sampler grows the mask by `grow_mask` pixels. With `crop_to_mask` on, "
            "only the mask's box plus `context` pixels is sampled, enlarged up to 4x: best for a small mask "
            "on a big picture. *Composite* blends the result in, `feather` pixels inside the mask's edge."
        ),
    ),
    FillRecipe(
        name="flux1_fill_outpaint",
        title="FLUX.1 Fill [dev]: outpaint",
        summary=(
            "Extends an image beyond its borders following the prompt with BFL's inpainting model. *Outpaint "
            "Pad* adds the space (here 256 pixels on the right; any side, multiples of 16) and the mask, "
            "fading over `feather` pixels into the original edge; the original pixels come back unchanged."
        ),
        prompt="The same scene continued to the right, seamless, same light and style.",
        mode=Mode.OUTPAINT,
        settings=(
            f"{FILL_SETTINGS}\n\nThe output is the padded canvas at its full size (scaled to at most 1 "
            "megapixel for sampling, then back)."
        ),
    ),
)


def _fill_note(r: FillRecipe) -> str:
    rows = file_rows(FILL_FILES)
    api = f"workflows/api/{r.name}.json"
    return f"""# {r.title}

{r.summary}

## Model files

| file | ComfyUI folder | where to get it |
|---|---|---|
{rows}

Pick them in the three loader nodes (the text encoder loader takes T5-XXL and CLIP-L). A wrong file (a
FLUX.2 [klein] model, a Qwen3 text encoder, `flux2-vae.safetensors`) is refused with the name of the right
one. fp8 and GGUF versions of the model and of T5-XXL load too and stay quantised in memory. The model is
gated on the Hub (FLUX.1 [dev] non-commercial licence): accept its terms there first.

## Settings

{r.settings}{MASK_NOTE if r.mode is Mode.INPAINT else ""}

## Headless

The same graph in API format is `{api}`; queue it with

```
python scripts/klein_client.py --server http://127.0.0.1:8188 --workflow {api} \\
    --image image.png --prompt "..." --seed 42 --output-dir out/
```
"""


def build_fill(r: FillRecipe) -> Graph:
    g = Graph(r.name, r.title, _fill_note(r))
    dit, t5, clip, ae = FILL_FILES
    model, te, vae = loaders(
        g,
        ("Flux1FillModelLoader", LOADER_SIZE,
         {"model_name": dit, "weight_dtype": "default", "quant_compute": "auto"}, (dit,)),
        ("Flux1FillTextEncoderLoader", LOADER_SIZE,
         {"t5_name": t5, "clip_name": clip, "device": "default"}, (t5, clip)),
        ("Flux1FillVAELoader", LOADER_SIZE, {"vae_name": ae}, (ae,)),
    )  # fmt: skip
    positive = prompt(g, "Flux1FillTextEncode", r.prompt, te)
    g.group("Prompt", positive)

    col = image_column(0)
    image = load_image(g, col, IMAGE_TITLES[r.mode])
    inputs, source = [image], image  # Load Image's MASK: its transparent pixels
    if r.mode is Mode.OUTPAINT:
        source = outpaint_pad(g, image, col)
        inputs.append(source)
    g.group(f"Image to {r.mode}", *inputs)

    sampler = g.add(
        "Flux1FillSampler",
        GENERATE,
        (270, 300),
        {
            "seed": SEED,
            "steps": FILL_STEPS,
            "guidance": FILL_GUIDANCE,
            "denoise": 1.0,
            "grow_mask": 0 if r.mode is Mode.OUTPAINT else 4,
            "crop_to_mask": False,
            "context": 64,
            "batch_size": 1,
            "step_cache": 0.0,
        },
    )
    g.connect(model, sampler, "model")
    g.connect(positive, sampler, "positive")
    g.connect(vae, sampler, "vae")
    g.connect(source, sampler, "image")
    g.connect(source, sampler, "mask", src_slot=1)
    extra = MASK_HINT if r.mode is Mode.INPAINT else ""
    text = brief(r.title, r.summary, r.settings, [FILES[name] for name in FILL_FILES], extra)
    finish(g, "Flux1FillDecode", vae, sampler, (sampler, 1), "flux1_fill", text)
    return g
