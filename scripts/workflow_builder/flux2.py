"""The FLUX.2 workflows (klein 4B / 9B / 9B-KV, FLUX.2 [dev]): one recipe each, one graph builder for all,
and the note each workflow carries. Columns run from left to right, in the direction the data flows."""

from __future__ import annotations

from dataclasses import dataclass

from .graph import Graph, Node
from .layout import (
    AUTO_TILES,
    IMAGE_TITLES,
    LOADER_SIZE,
    MASK_NOTE,
    SEED,
    X_ENCODE,
    X_LOAD,
    X_SAMPLE,
    finish,
    loaders,
    prompt,
)
from .schemas import FILES

VAE_FILE = "flux2-vae.safetensors"


@dataclass(frozen=True)
class Recipe:
    name: str
    title: str
    summary: str
    dit: str
    text_encoder: str
    variant: str
    steps: int
    guidance: float
    prompt: str
    negative: str | None = None  # None: no negative prompt (distilled / KV)
    references: int = 0
    width: int = 1024
    height: int = 1024
    settings: str = ""
    mode: str = "generate"  # generate / img2img / inpaint / outpaint
    denoise: float = 1.0
    lora: str | None = None  # a LoRA file in models/loras, applied by a LoRA Loader
    family: str = "klein"  # "klein" or "dev": which files and pairing the note describes


LORA_NOTE = """

## LoRA

Put a LoRA trained for klein 4B into `models/loras` and pick it in the **LoRA Loader** (`strength` 1 = as
trained). Every common layout loads: ai-toolkit, kohya / musubi-tuner, diffusers / PEFT, fal, OneTrainer,
DiffSynth, LyCORIS LoKr / LoHa and DoRA. The **report** (shown by Preview Any) says how many of its keys
matched and lists any that did not; a LoRA for another model (9B, FLUX.1, FLUX.2 [dev]) is refused by name.
The LoRA also reaches the text encoder when it has text-encoder keys. Chain loaders for several LoRAs;
`block_strengths` (e.g. `double=1.0, single.0-11=0.5`) scales it per block."""


def file_rows(names) -> str:
    """The note's table rows: file, folder, repos and licence, direct link."""
    return "\n".join(
        f"| `{f.name}` | `models/{f.folder}` | {f.source}" + f", [direct link]({f.url})" + " |"
        for f in (FILES[name] for name in names)
    )


KLEIN_FILES_NOTE = (
    "Pick them in the three loader nodes; a wrong pairing (4B needs Qwen3-4B, 9B needs Qwen3-8B) is reported "
    "in\nplain words before sampling. Quantised releases of the same models load too (fp8, nvfp4, int8 and "
    "GGUF files\nfor the model, fp8mixed and GGUF files for the text encoder) and stay quantised in memory."
)

DEV_FP8 = ("flux2_dev_fp8mixed.safetensors", "mistral_3_small_flux2_fp8.safetensors")
DEV_FILES_NOTE = """Or the fp8 files, half the size (they stay fp8 in memory), in the same folders:

| file | ComfyUI folder | where to get it |
|---|---|---|
{fp8}

Pick them in the three loader nodes. The model is gated on the Hub (FLUX.2 [dev] non-commercial licence):
accept its terms there first. Which model and text encoder a file holds is read from its weights: a klein
model with the Mistral encoder, this model with a Qwen3 encoder, or a FLUX.1 file (`t5xxl_fp16.safetensors`,
`clip_l.safetensors`) is refused by name, with the right file, before sampling.

## Memory and GPUs

The bf16 model holds {dit:g} GB, its text encoder {te:g} GB (fp8: {dit8:g} and {te8:g} GB). The text encoder
runs first and leaves the GPU before sampling. On **two 40-48 GB cards**, set the model loader's `devices` to
`cuda:0,cuda:1`: its blocks are split between the cards by weight bytes (about 32 GB each in bf16) and run one
after the other, the activations moved between them (the log says what each card holds). The text encoder
loader's `device` can put the encoder on a card of its own (e.g. `cuda:2`), where it stays between prompts.
One 48 GB card runs the fp8 model."""


def _files_note(r: Recipe) -> str:
    if r.family != "dev":
        return KLEIN_FILES_NOTE
    fp8 = [FILES[name] for name in DEV_FP8]
    dit, te = FILES[r.dit], FILES[r.text_encoder]
    return DEV_FILES_NOTE.format(
        fp8=file_rows(DEV_FP8), dit=dit.size_gb, te=te.size_gb, dit8=fp8[0].size_gb, te8=fp8[1].size_gb
    )


def _note(r: Recipe) -> str:
    rows = file_rows([r.dit, r.text_encoder, "flux2-vae.safetensors"])
    api = f"workflows/api/{r.name}.json"
    names = [f"ref{i + 1}.png" for i in range(r.references)] + (["image.png"] if r.mode != "generate" else [])
    images = " ".join(f"--image {name}" for name in names)
    lora = LORA_NOTE if r.lora else ""
    return f"""# {r.title}

{r.summary}

## Model files

| file | ComfyUI folder | where to get it |
|---|---|---|
{rows}

{_files_note(r)}{lora}

## Settings

{r.settings}{MASK_NOTE if r.mode == "inpaint" else ""}

## Headless

The same graph in API format is `{api}`; queue it with

```
python scripts/klein_client.py --server http://127.0.0.1:8188 --workflow {api} \\
    --prompt "..." {images} --output-dir out/
```
"""


def build(r: Recipe) -> Graph:
    g = Graph(r.name)
    model_values = {"model_name": r.dit, "variant": r.variant, "weight_dtype": "default", "offload": "none",
                    "resident_mb": 0, "devices": ""}  # fmt: skip
    model, te, vae = loaders(
        g,
        ("Flux2KleinModelLoader", (X_LOAD, 0), (380, 130), model_values, (r.dit,)),
        ("Flux2KleinTextEncoderLoader", (X_LOAD, 180), LOADER_SIZE,
         {"text_encoder_name": r.text_encoder, "device": "default"}, (r.text_encoder,)),
        ("Flux2KleinVAELoader", (X_LOAD, 340), (380, 82), {"vae_name": VAE_FILE}, (VAE_FILE,)),
    )  # fmt: skip

    if r.lora is not None:  # model and text encoder pass through the LoRA loader
        lora = g.add(
            "Flux2KleinLoraLoader",
            (X_LOAD, 470),
            (380, 130),
            {"lora_name": r.lora, "strength": 1.0, "block_strengths": ""},
        )
        g.connect(model, lora, "model")
        g.connect(te, lora, "text_encoder")
        report = g.add("PreviewAny", (X_LOAD, 650), (380, 220), title="LoRA report")
        g.connect(lora, report, "source", src_slot=1)
        g.group("LoRA", lora, report)
        model, te_slot, te = lora, 2, lora
    else:
        te_slot = 0
    positive = prompt(g, "Flux2KleinTextEncode", r.prompt, te, te_slot)
    prompt_nodes = [positive]
    negative = None
    if r.negative is not None:
        negative = prompt(g, "Flux2KleinTextEncode", r.negative, te, te_slot, negative=True)
        prompt_nodes.append(negative)
    g.group("Prompt", *prompt_nodes)

    refs = None
    ref_nodes = []
    y = 520
    for i in range(r.references):
        image = g.add(
            "LoadImage",
            (X_LOAD, y),
            (380, 400),
            {"image": "example.png"},
            title=f"Reference image {i + 1}",
        )
        enc = g.add(
            "Flux2KleinReferenceEncode",
            (X_ENCODE, y),
            (440, 130),
            {"max_megapixels": 1.0, "resize": "crop", **AUTO_TILES},
            title=f"Reference {i + 1}",
        )
        g.connect(vae, enc, "vae")
        g.connect(image, enc, "image")
        if refs is not None:
            g.connect(refs, enc, "references")
        refs = enc
        ref_nodes += [image, enc]
        y += 460
    if ref_nodes:
        g.group(
            "References (the first one sets the output size)" if r.references > 1 else "Reference", *ref_nodes
        )

    sampler = g.add(
        "Flux2KleinSampler",
        (X_SAMPLE, 0),
        (330, 380),
        {
            "seed": SEED,
            "steps": r.steps,
            "guidance": r.guidance,
            "width": r.width,
            "height": r.height,
            "batch_size": 1,
            "denoise": r.denoise,
            "kv_cache": "reuse",
        },
    )
    g.connect(model, sampler, "model")
    g.connect(positive, sampler, "positive")
    if negative is not None:
        g.connect(negative, sampler, "negative")
    stitch = _edit_inputs(g, r, vae, refs, sampler)
    if refs is not None and stitch is None:
        g.connect(refs, sampler, "references")
    prefix = "flux2_dev" if r.family == "dev" else "flux2_klein"
    finish(g, "Flux2KleinDecode", vae, sampler, None if stitch is None else (stitch, 2), prefix, _note(r))
    return g


def _edit_inputs(g: Graph, r: Recipe, vae: Node, refs: Node | None, sampler: Node) -> Node | None:
    """The image to start from (img2img) or to inpaint / outpaint; returns the Inpaint Prepare node."""
    if r.mode == "generate":
        return None
    y = 520 + 460 * r.references
    image = g.add("LoadImage", (X_LOAD, y), (380, 400), {"image": "example.png"}, title=IMAGE_TITLES[r.mode])
    if r.mode == "img2img":
        encode = g.add("Flux2KleinEncode", (X_ENCODE, y), (300, 60))
        g.connect(vae, encode, "vae")
        g.connect(image, encode, "image")
        g.connect(encode, sampler, "latent")
        g.group("Image to start from", image, encode)
        return None
    nodes, source, mask, mask_slot = [image], image, image, 1  # Load Image's MASK: its transparent pixels
    if r.mode == "outpaint":
        pad = g.add(
            "Flux2KleinOutpaintPad",
            (X_ENCODE, y),
            (300, 200),
            {"left": 0, "top": 0, "right": 256, "bottom": 0, "feather": 24},
        )
        g.connect(image, pad, "image")
        nodes.append(pad)
        source, mask = pad, pad
    prepare = g.add(
        "Flux2KleinInpaintPrepare",
        (X_ENCODE, y + 240),
        (300, 180),
        {"grow_mask": 0 if r.mode == "outpaint" else 4, "crop_to_mask": False, "context": 64},
    )
    g.connect(vae, prepare, "vae")
    g.connect(source, prepare, "image")
    g.connect(mask, prepare, "mask", src_slot=mask_slot)
    if refs is not None:
        g.connect(refs, prepare, "references")
    g.connect(prepare, sampler, "latent")
    g.connect(prepare, sampler, "references", src_slot=1)
    g.group("Image to " + r.mode, *nodes, prepare)
    return prepare


FOX = (
    "A red fox curled up in fresh snow at sunrise, soft golden backlight, frost on its fur, "
    "shallow depth of field, wildlife photography"
)
DISTILLED_SETTINGS = (
    "Distilled model: **4 steps, guidance 1.0** (no CFG, one model pass per step, so no negative prompt). "
    "More steps rarely help. Width and height: multiples of 16, about 1–4 megapixels."
)
EDIT_SIZE = (
    "Width and height are **0**, which means *the size of the first reference image* (after it is scaled to "
    "at most `max_megapixels`, 1.0 by default, and to multiples of 16). Set them to a number to force a size."
)

RECIPES = (
    Recipe(
        name="flux2_klein_4b_lora",
        title="FLUX.2 [klein] 4B: text to image with a LoRA",
        summary="Text to image with the distilled klein 4B model and a LoRA on top (its report shown).",
        dit="flux-2-klein-4b.safetensors",
        text_encoder="qwen_3_4b.safetensors",
        variant="distilled",
        steps=4,
        guidance=1.0,
        prompt=FOX,
        settings=DISTILLED_SETTINGS,
        lora="flux-2-klein-4b-lora.safetensors",
    ),
    Recipe(
        name="flux2_klein_4b_text_to_image",
        title="FLUX.2 [klein] 4B: text to image",
        summary="Text to image with the distilled klein 4B model (Apache-2.0), the fastest klein.",
        dit="flux-2-klein-4b.safetensors",
        text_encoder="qwen_3_4b.safetensors",
        variant="distilled",
        steps=4,
        guidance=1.0,
        prompt=FOX,
        settings=DISTILLED_SETTINGS,
    ),
    Recipe(
        name="flux2_klein_4b_base_text_to_image",
        title="FLUX.2 [klein] 4B base: text to image",
        summary=(
            "Text to image with the undistilled klein 4B **base** model: slower (real classifier-free "
            "guidance, two model passes per step) but more varied; the model to fine-tune or train LoRAs on."
        ),
        dit="flux-2-klein-base-4b.safetensors",
        text_encoder="qwen_3_4b.safetensors",
        variant="base",
        steps=50,
        guidance=4.0,
        prompt=FOX,
        negative="",
        settings=(
            "Base model: **about 50 steps, guidance 4.0** (true CFG). The negative prompt is used; "
            "an empty one is the usual choice. Fewer steps (20–30) give usable drafts."
        ),
    ),
    Recipe(
        name="flux2_klein_4b_edit",
        title="FLUX.2 [klein] 4B: edit an image",
        summary=(
            "Edits one image following the prompt, with the distilled klein 4B model. "
            "Load your image in *Reference image 1*."
        ),
        dit="flux-2-klein-4b.safetensors",
        text_encoder="qwen_3_4b.safetensors",
        variant="distilled",
        steps=4,
        guidance=1.0,
        prompt=(
            "Turn this drawing into a photograph: a young woman with blonde hair in a pink dress standing on "
            "a green meadow under a blue sky with white clouds. Keep the pose and the composition."
        ),
        references=1,
        width=0,
        height=0,
        settings=f"{DISTILLED_SETTINGS}\n\n{EDIT_SIZE}",
    ),
    Recipe(
        name="flux2_klein_4b_multi_reference_edit",
        title="FLUX.2 [klein] 4B: combine several reference images",
        summary=(
            "Combines four reference images following the prompt (refer to them as image 1, 2, 3, 4), with "
            "the distilled klein 4B model. The references are chained: each *Reference Encode* adds one "
            "image, with its own pixel budget (`max_megapixels`) and fit (`crop`, or `resize` to keep the "
            "whole picture). For more references, copy a *Load Image* + *Reference Encode* pair and chain "
            "it (the sampler refuses, before it starts, a set that will not fit in memory); for fewer, "
            "bypass (Ctrl+B) the last pairs' *Reference Encode* nodes or delete them."
        ),
        dit="flux-2-klein-4b.safetensors",
        text_encoder="qwen_3_4b.safetensors",
        variant="distilled",
        steps=4,
        guidance=1.0,
        prompt=(
            "The person from image 1 wearing the outfit from image 2 and the hat from image 4, standing "
            "in the place shown in image 3. Natural light, photorealistic."
        ),
        references=4,
        width=0,
        height=0,
        settings=f"{DISTILLED_SETTINGS}\n\n{EDIT_SIZE} Every extra reference makes each step slower.",
    ),
    Recipe(
        name="flux2_klein_9b_kv_edit",
        title="FLUX.2 [klein] 9B-KV: fast reference editing",
        summary=(
            "Edits with one or two reference images using the klein **9B-KV** model, which computes the "
            "references' attention keys/values once and reuses them at every step, so editing costs little "
            "more than text to image. With the sampler's `kv_cache` on `reuse` (the default) they are also "
            "kept across runs: queue again with a new prompt or seed and the references are not processed "
            "again (same image as a fresh run; changing a reference, the model or its precision computes "
            "them anew). For a single reference, bypass (Ctrl+B) or delete *Reference 2*."
        ),
        dit="flux-2-klein-9b-kv.safetensors",
        text_encoder="qwen_3_8b.safetensors",
        variant="kv",
        steps=4,
        guidance=1.0,
        prompt=(
            "Put the person from image 1 in the clothes from image 2. Keep the face, the pose and the "
            "background of image 1."
        ),
        references=2,
        width=0,
        height=0,
        settings=(
            "9B-KV is distilled: **4 steps, guidance 1.0**. The 9B models need the Qwen3-8B text encoder "
            "(`qwen_3_8b.safetensors`) and are under the FLUX non-commercial licence.\n\n" + EDIT_SIZE
        ),
    ),
)


RECIPES += (
    Recipe(
        name="flux2_klein_4b_img2img",
        title="FLUX.2 [klein] 4B: image to image",
        summary=(
            "Redraws an image following the prompt, keeping its layout and colours: the sampler starts from "
            "the image's latent instead of pure noise. Load your image in *Image to start from*."
        ),
        dit="flux-2-klein-4b.safetensors",
        text_encoder="qwen_3_4b.safetensors",
        variant="distilled",
        steps=4,
        guidance=1.0,
        prompt="A watercolour painting of the same scene, soft washes of colour, paper texture.",
        width=0,
        height=0,
        mode="img2img",
        denoise=0.75,
        settings=(
            f"{DISTILLED_SETTINGS}\n\n**denoise** sets how much changes: 1 ignores the image, lower keeps "
            "more of it (0.75 skips the first of the 4 steps, 0.5 the first two). The output takes the "
            "image's size, centre-cropped to multiples of 16."
        ),
    ),
    Recipe(
        name="flux2_klein_4b_inpaint",
        title="FLUX.2 [klein] 4B: inpaint",
        summary=(
            "Repaints the masked part of an image following the prompt and puts the result back over the "
            "original, so every pixel outside the mask stays exactly as it was. Load the image in *Image to "
            "inpaint*, then right-click it and choose *Open in MaskEditor* to paint the area to repaint."
        ),
        dit="flux-2-klein-4b.safetensors",
        text_encoder="qwen_3_4b.safetensors",
        variant="distilled",
        steps=4,
        guidance=1.0,
        prompt="A small wooden table with a vase of red tulips.",
        width=0,
        height=0,
        mode="inpaint",
        settings=(
            f"{DISTILLED_SETTINGS}\n\n*Inpaint Prepare* grows the mask by `grow_mask` pixels and passes the "
            "image to the sampler twice: as the latent to keep outside the mask and as reference 1. With "
            "`crop_to_mask` on, only the mask's box plus `context` pixels is sampled, enlarged up to 4x: "
            "best for a small mask on a big picture. *Composite* blends the result in, `feather` pixels "
            "inside the mask's edge."
        ),
    ),
    Recipe(
        name="flux2_klein_4b_outpaint",
        title="FLUX.2 [klein] 4B: outpaint",
        summary=(
            "Extends an image beyond its borders following the prompt. *Outpaint Pad* adds the space (here "
            "256 pixels on the right; any side, multiples of 16) and the mask, fading over `feather` pixels "
            "into the original edge; the original pixels come back unchanged."
        ),
        dit="flux-2-klein-4b.safetensors",
        text_encoder="qwen_3_4b.safetensors",
        variant="distilled",
        steps=4,
        guidance=1.0,
        prompt="The same scene continued to the right, seamless, same light and style.",
        width=0,
        height=0,
        mode="outpaint",
        settings=f"{DISTILLED_SETTINGS}\n\nThe output is the padded canvas at its full size.",
    ),
)


# ----------------------------------------------------------------------------------------------------
# FLUX.2 [dev]: the same nodes, the dev DiT and its Mistral text encoder.

DEV_DIT, DEV_TEXT_ENCODER = "flux2-dev.safetensors", "mistral_3_small_flux2_bf16.safetensors"
DEV_SETTINGS = (
    "FLUX.2 [dev]: **50 steps, guidance 4.0**. The guidance value is embedded in the model (guidance-"
    "distilled): one model pass per step, no negative prompt. 28 steps is a good trade-off (BFL). Width and "
    "height: multiples of 16, about 1–4 megapixels."
)

RECIPES += (
    Recipe(
        name="flux2_dev_text_to_image",
        title="FLUX.2 [dev]: text to image",
        summary=(
            "Text to image with **FLUX.2 [dev]**, Black Forest Labs' 32B model (FLUX.2 [dev] non-commercial "
            "licence), and its Mistral-Small-3.2-24B text encoder."
        ),
        dit=DEV_DIT,
        text_encoder=DEV_TEXT_ENCODER,
        variant="dev",
        steps=50,
        guidance=4.0,
        prompt=FOX,
        settings=DEV_SETTINGS,
        family="dev",
    ),
    Recipe(
        name="flux2_dev_multi_reference_edit",
        title="FLUX.2 [dev]: combine several reference images",
        summary=(
            "Combines three reference images following the prompt (refer to them as image 1, 2, 3), with "
            "FLUX.2 [dev]. The references are chained: each *Reference Encode* adds one image, with its own "
            "pixel budget (`max_megapixels`) and fit (`crop`, or `resize` to keep the whole picture). For "
            "more references (BFL recommends at most 6 for dev), copy a *Load Image* + *Reference Encode* "
            "pair and chain it; for fewer, bypass (Ctrl+B) the last pair's *Reference Encode* or delete it."
        ),
        dit=DEV_DIT,
        text_encoder=DEV_TEXT_ENCODER,
        variant="dev",
        steps=50,
        guidance=4.0,
        prompt=(
            "The person from image 1 wearing the jacket from image 2, standing in the street shown in image "
            "3. Natural light, photorealistic."
        ),
        references=3,
        width=0,
        height=0,
        settings=f"{DEV_SETTINGS}\n\n{EDIT_SIZE} Every extra reference makes each step slower.",
        family="dev",
    ),
)
