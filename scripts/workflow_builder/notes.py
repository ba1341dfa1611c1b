"""What each FLUX.2 workflow says about itself: a short note on the canvas (what it does, which file goes into
which model folder, with the links, the usual settings) and a longer section of ``docs/workflows.md`` (the
settings and their reasons, the alternatives, how to queue it headless)."""

from __future__ import annotations

import re

from .layout import MASK_HINT, MASK_NOTE
from .recipe import Family, Mode, Recipe
from .schemas import FILES

LORA_NOTE = """

## LoRA

Put a LoRA trained for klein 4B into `models/loras` and pick it in the **LoRA Loader** (`strength` 1 = as
trained). Every common layout loads: ai-toolkit, kohya / musubi-tuner, diffusers / PEFT, fal, OneTrainer,
DiffSynth, LyCORIS LoKr / LoHa and DoRA. The **report** (shown by Preview Any) says how many of its keys
matched and lists any that did not; a LoRA for another model (9B, FLUX.1, FLUX.2 [dev]) is refused by name.
The LoRA also reaches the text encoder when it has text-encoder keys. Chain loaders for several LoRAs;
`block_strengths` (e.g. `double=1.0, single.0-11=0.5`) scales it per block."""


CONTROL_FILE = "FLUX.2-dev-Fun-Controlnet-Union-2602.safetensors"
CONTROL_NOTE = """

## The control map

One control net reads every kind of map: pose (OpenPose / DWPose skeletons), depth, canny, HED, MLSD, and
(2602 release) scribble and gray. Make the map with a preprocessor pack (e.g. comfyui_controlnet_aux: DWPose,
Depth Anything, Canny nodes) in place of the *Control map* Load Image, or load a map you already have. Any
size works: the map is resized to the output size, so keep its aspect ratio close to width x height.
`strength` 0.65-0.80 is the release's advice (0 = no control, up to 2); `start` / `end` (fractions of the
steps) limit when the map steers, e.g. `end` 0.5 fixes the layout and leaves the details free. With
reference images in the graph the map covers the output only (the control net's input over the reference
tokens is zeros, as in the release's pipeline)."""


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


def files_note(r: Recipe) -> str:
    if r.family is not Family.DEV:
        return KLEIN_FILES_NOTE
    fp8 = [FILES[name] for name in DEV_FP8]
    dit, te = FILES[r.dit], FILES[r.text_encoder]
    return DEV_FILES_NOTE.format(
        fp8=file_rows(DEV_FP8), dit=dit.size_gb, te=te.size_gb, dit8=fp8[0].size_gb, te8=fp8[1].size_gb
    )


def first_sentence(text: str) -> str:
    """The text's first sentence (up to the first full stop followed by a space, outside abbreviations)."""
    match = re.search(r"(?<!e\.g)(?<!i\.e)[.!?](\s|$)", text)
    return text[: match.end()].strip() if match else text


DETAILS = "docs/workflows.md"


def brief(title: str, summary: str, settings: str, files, extra: str = "") -> str:
    """The note on the canvas: the title, what it does, the files and their folders (with their links), the
    usual settings, where the rest is."""
    rows = "\n".join(
        f"- [`{f.name}`]({f.url}) in `models/{f.folder}`" if f.url else f"- `{f.name}` in `models/{f.folder}`"
        for f in files
    )
    return f"""# {title}

{first_sentence(summary)}

**Files** (the loaders offer the downloads):
{rows}

{first_sentence(settings)}{extra}

More: `{DETAILS}` in the pack; a node's help: select it, *Info* tab.
"""


class _Own:
    """A file of the user's own (a LoRA), named in the note with its folder but no link."""

    def __init__(self, name: str, folder: str):
        self.name, self.folder, self.url = name, folder, None


def short_note(r: Recipe) -> str:
    names = [r.dit, r.text_encoder, "flux2-vae.safetensors", *([CONTROL_FILE] if r.control else [])]
    files = [FILES[name] for name in names]
    if r.lora:
        files.append(FILES[r.lora] if r.lora in FILES else _Own(r.lora, "loras"))
    return brief(r.title, r.summary, r.settings, files, MASK_HINT if r.mode is Mode.INPAINT else "")


def note(r: Recipe) -> str:
    control = [CONTROL_FILE] if r.control else []
    lora_file = [r.lora] if r.lora in FILES else []
    rows = file_rows([r.dit, r.text_encoder, "flux2-vae.safetensors", *control, *lora_file])
    api = f"workflows/api/{r.name}.json"
    names = (
        [f"ref{i + 1}.png" for i in range(r.references)]
        + ([f"{r.control}.png"] if r.control else [])
        + (["image.png"] if r.mode is not Mode.GENERATE else [])
    )
    images = " ".join(f"--image {name}" for name in names)
    lora = LORA_NOTE if r.lora else ""
    return f"""# {r.title}

{r.summary}

## Model files

| file | ComfyUI folder | where to get it |
|---|---|---|
{rows}

{files_note(r)}{lora}

## Settings

{r.settings}{MASK_NOTE if r.mode is Mode.INPAINT else ""}{CONTROL_NOTE if r.control else ""}

## Headless

The same graph in API format is `{api}`; queue it with

```
python scripts/klein_client.py --server http://127.0.0.1:8188 --workflow {api} \\
    --prompt "..." {images} --output-dir out/
```
"""
