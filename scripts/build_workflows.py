"""Generate every bundled workflow, in both ComfyUI formats, from one description.

    python scripts/build_workflows.py          # (re)write workflows/*.json and workflows/api/*.json
    python scripts/build_workflows.py --check  # exit 1 if the files on disk differ from what it makes

Each workflow is described once, as a small graph (nodes, widget values, links). From that graph the script
writes:

* ``workflows/<name>.json``: the graph-editor format (version 0.4) that ComfyUI's frontend saves and loads,
  with a Markdown note saying what the workflow does, which file goes into which model folder and the
  recommended settings. The seed's ``control_after_generate`` value is "randomize".
* ``workflows/api/<name>.json``: the API format that ``POST /prompt`` accepts as-is
  (``{node_id: {"class_type", "inputs", "_meta"}}``, links as ``[node_id, output_slot]``). Notes are not part
  of it (they are frontend-only), and the seed is fixed so that runs are reproducible.

Both come from the same graph, so they cannot drift apart; tests/test_workflows.py regenerates them in memory
and compares them with the committed files.
"""

from __future__ import annotations

import argparse
import json
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_DIR = REPO / "workflows"
API_DIR = WORKFLOW_DIR / "api"

SEED = 42  # the API workflows' fixed seed and the editor workflows' first one (then "randomize")

# ----------------------------------------------------------------------------------------------------
# Node schemas: what the graph editor needs to know about each node type used here.
# Link inputs and widgets are listed in the node's INPUT_TYPES order (required first, then optional).


@dataclass(frozen=True)
class Socket:
    name: str
    type: str
    optional: bool = False


@dataclass(frozen=True)
class Widget:
    name: str
    type: str  # INT / FLOAT / STRING / COMBO / IMAGEUPLOAD (as the frontend names widget inputs)
    optional: bool = False
    control_after_generate: bool = False  # the frontend adds a "randomize"/"fixed" value after it
    in_api: bool = True  # False for frontend-only widgets (LoadImage's upload button)
    label: str | None = None  # the frontend's localized_name, when it is not the name


@dataclass(frozen=True)
class NodeSpec:
    display_name: str
    inputs: tuple[Socket, ...] = ()
    widgets: tuple[Widget, ...] = ()
    outputs: tuple[tuple[str, str], ...] = ()  # (name, type)
    frontend_only: bool = False  # notes: never sent to the server


MODEL = "FLUX2_KLEIN_MODEL"
TEXT_ENCODER = "FLUX2_KLEIN_TEXT_ENCODER"
VAE = "FLUX2_KLEIN_VAE"
CONDITIONING = "FLUX2_KLEIN_CONDITIONING"
REFERENCES = "FLUX2_KLEIN_REFERENCES"
STITCH = "FLUX2_KLEIN_STITCH"
FILL_MODEL = "FLUX1_FILL_MODEL"
FILL_TEXT_ENCODER = "FLUX1_FILL_TEXT_ENCODER"
FILL_VAE = "FLUX1_FILL_VAE"
FILL_CONDITIONING = "FLUX1_FILL_CONDITIONING"

NODE_SPECS: dict[str, NodeSpec] = {
    "Flux2KleinModelLoader": NodeSpec(
        "FLUX.2 Model Loader",
        widgets=(
            Widget("model_name", "COMBO"),
            Widget("variant", "COMBO"),
            Widget("weight_dtype", "COMBO", True),
            Widget("offload", "COMBO", True),
            Widget("resident_mb", "INT", True),
            Widget("devices", "STRING", True),
        ),
        outputs=(("model", MODEL),),
    ),
    "Flux2KleinTextEncoderLoader": NodeSpec(
        "FLUX.2 Text Encoder Loader",
        widgets=(Widget("text_encoder_name", "COMBO"), Widget("device", "COMBO", True)),
        outputs=(("text_encoder", TEXT_ENCODER),),
    ),
    "Flux2KleinVAELoader": NodeSpec(
        "FLUX.2 VAE Loader", widgets=(Widget("vae_name", "COMBO"),), outputs=(("vae", VAE),)
    ),
    "Flux2KleinTextEncode": NodeSpec(
        "FLUX.2 Text Encode",
        inputs=(Socket("text_encoder", TEXT_ENCODER),),
        widgets=(Widget("text", "STRING"),),
        outputs=(("conditioning", CONDITIONING),),
    ),
    "Flux2KleinReferenceEncode": NodeSpec(
        "FLUX.2 Reference Encode",
        inputs=(Socket("vae", VAE), Socket("image", "IMAGE"), Socket("references", REFERENCES, True)),
        widgets=(
            Widget("max_megapixels", "FLOAT", True),
            Widget("resize", "COMBO", True),
            Widget("tile_size", "INT", True),
            Widget("tile_overlap", "INT", True),
        ),
        outputs=(("references", REFERENCES),),
    ),
    "Flux2KleinEncode": NodeSpec(
        "FLUX.2 Encode",
        inputs=(Socket("vae", VAE), Socket("image", "IMAGE")),
        outputs=(("latent", "LATENT"),),
    ),
    "Flux2KleinInpaintPrepare": NodeSpec(
        "FLUX.2 Inpaint Prepare",
        inputs=(
            Socket("vae", VAE),
            Socket("image", "IMAGE"),
            Socket("mask", "MASK"),
            Socket("references", REFERENCES, True),
        ),
        widgets=(
            Widget("grow_mask", "INT", True),
            Widget("crop_to_mask", "BOOLEAN", True),
            Widget("context", "INT", True),
        ),
        outputs=(("latent", "LATENT"), ("references", REFERENCES), ("stitch", STITCH)),
    ),
    "Flux2KleinComposite": NodeSpec(
        "FLUX.2 Composite",
        inputs=(Socket("image", "IMAGE"), Socket("stitch", STITCH)),
        widgets=(Widget("feather", "INT"),),
        outputs=(("image", "IMAGE"),),
    ),
    "Flux2KleinOutpaintPad": NodeSpec(
        "FLUX.2 Outpaint Pad",
        inputs=(Socket("image", "IMAGE"),),
        widgets=tuple(Widget(n, "INT") for n in ("left", "top", "right", "bottom", "feather")),
        outputs=(("image", "IMAGE"), ("mask", "MASK")),
    ),
    "Flux2KleinSampler": NodeSpec(
        "FLUX.2 Sampler",
        inputs=(
            Socket("model", MODEL),
            Socket("positive", CONDITIONING),
            Socket("negative", CONDITIONING, True),
            Socket("references", REFERENCES, True),
            Socket("latent", "LATENT", True),
        ),
        widgets=(
            Widget("seed", "INT", control_after_generate=True),
            Widget("steps", "INT"),
            Widget("guidance", "FLOAT"),
            Widget("width", "INT"),
            Widget("height", "INT"),
            Widget("batch_size", "INT"),
            Widget("denoise", "FLOAT", True),
            Widget("kv_cache", "COMBO", True),
        ),
        outputs=(("latent", "LATENT"),),
    ),
    "Flux2KleinDecode": NodeSpec(
        "FLUX.2 Decode",
        inputs=(Socket("vae", VAE), Socket("latent", "LATENT")),
        widgets=(Widget("tile_size", "INT", True), Widget("tile_overlap", "INT", True)),
        outputs=(("image", "IMAGE"),),
    ),
    "Flux2KleinLoraLoader": NodeSpec(
        "FLUX.2 [klein] LoRA Loader",
        inputs=(Socket("model", MODEL), Socket("text_encoder", TEXT_ENCODER, True)),
        widgets=(
            Widget("lora_name", "COMBO"),
            Widget("strength", "FLOAT"),
            Widget("block_strengths", "STRING", True),
        ),
        outputs=(("model", MODEL), ("report", "STRING"), ("text_encoder", TEXT_ENCODER)),
    ),
    "Flux1FillModelLoader": NodeSpec(
        "FLUX.1 Fill [dev] Model Loader",
        widgets=(Widget("model_name", "COMBO"), Widget("weight_dtype", "COMBO", True)),
        outputs=(("model", FILL_MODEL),),
    ),
    "Flux1FillTextEncoderLoader": NodeSpec(
        "FLUX.1 Fill [dev] Text Encoder Loader",
        widgets=(Widget("t5_name", "COMBO"), Widget("clip_name", "COMBO"), Widget("device", "COMBO", True)),
        outputs=(("text_encoder", FILL_TEXT_ENCODER),),
    ),
    "Flux1FillVAELoader": NodeSpec(
        "FLUX.1 Fill [dev] VAE Loader", widgets=(Widget("vae_name", "COMBO"),), outputs=(("vae", FILL_VAE),)
    ),
    "Flux1FillTextEncode": NodeSpec(
        "FLUX.1 Fill [dev] Text Encode",
        inputs=(Socket("text_encoder", FILL_TEXT_ENCODER),),
        widgets=(Widget("text", "STRING"),),
        outputs=(("conditioning", FILL_CONDITIONING),),
    ),
    "Flux1FillSampler": NodeSpec(
        "FLUX.1 Fill [dev] Sampler",
        inputs=(
            Socket("model", FILL_MODEL),
            Socket("positive", FILL_CONDITIONING),
            Socket("vae", FILL_VAE),
            Socket("image", "IMAGE"),
            Socket("mask", "MASK"),
        ),
        widgets=(
            Widget("seed", "INT", control_after_generate=True),
            Widget("steps", "INT"),
            Widget("guidance", "FLOAT"),
            Widget("denoise", "FLOAT", True),
            Widget("grow_mask", "INT", True),
            Widget("crop_to_mask", "BOOLEAN", True),
            Widget("context", "INT", True),
            Widget("batch_size", "INT", True),
        ),
        outputs=(("latent", "LATENT"), ("stitch", STITCH)),
    ),
    "Flux1FillDecode": NodeSpec(
        "FLUX.1 Fill [dev] Decode",
        inputs=(Socket("vae", FILL_VAE), Socket("latent", "LATENT")),
        widgets=(Widget("tile_size", "INT", True), Widget("tile_overlap", "INT", True)),
        outputs=(("image", "IMAGE"),),
    ),
    # native ComfyUI nodes
    "PreviewAny": NodeSpec("Preview Any", inputs=(Socket("source", "*"),), outputs=(("STRING", "STRING"),)),
    "LoadImage": NodeSpec(
        "Load Image",
        widgets=(
            Widget("image", "COMBO"),
            Widget("upload", "IMAGEUPLOAD", in_api=False, label="choose file to upload"),
        ),
        outputs=(("IMAGE", "IMAGE"), ("MASK", "MASK")),
    ),
    "SaveImage": NodeSpec(
        "Save Image",
        inputs=(Socket("images", "IMAGE"),),
        widgets=(Widget("filename_prefix", "STRING"),),
        outputs=(("images", "IMAGE"),),
    ),
    "MarkdownNote": NodeSpec("Markdown Note", widgets=(Widget("text", "STRING"),), frontend_only=True),
}

# ----------------------------------------------------------------------------------------------------
# Model files: one table in the pack (nodes/model_files.py), read here without importing the pack.


def _model_files():
    import importlib.util

    spec = importlib.util.spec_from_file_location("model_files", REPO / "nodes" / "model_files.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["model_files"] = module  # dataclasses look the module up while building the class
    spec.loader.exec_module(module)
    return module.FILES


FILES = _model_files()


def models_property(*filenames: str) -> list[dict]:
    entries = []
    for filename in filenames:
        f = FILES[filename]
        entry = {"name": f.name}
        if f.url:
            entry["url"] = f.url
        entry["directory"] = f.folder
        entries.append(entry)
    return entries


# ----------------------------------------------------------------------------------------------------
# A tiny graph builder.


@dataclass
class Node:
    id: int
    type: str
    values: dict  # widget name -> value (every widget of the spec except frontend-only ones)
    pos: tuple[float, float]
    size: tuple[float, float]
    title: str | None = None
    color: str | None = None
    bgcolor: str | None = None
    properties: dict = field(default_factory=dict)
    links_in: dict = field(default_factory=dict)  # input name -> link id

    @property
    def spec(self) -> NodeSpec:
        return NODE_SPECS[self.type]


@dataclass
class Link:
    id: int
    src: Node
    src_slot: int
    dst: Node
    dst_input: str

    @property
    def type(self) -> str:
        return self.src.spec.outputs[self.src_slot][1]


@dataclass
class Group:
    title: str
    nodes: list[Node]
    color: str = "#3f789e"


class Graph:
    def __init__(self, name: str):
        self.name = name
        self.nodes: list[Node] = []
        self.links: list[Link] = []
        self.groups: list[Group] = []

    def add(self, type_: str, pos, size, values: dict | None = None, **kw) -> Node:
        spec = NODE_SPECS[type_]
        values = dict(values or {})
        expected = [w.name for w in spec.widgets if w.in_api or type_ == "MarkdownNote"]
        if sorted(values) != sorted(expected):
            raise ValueError(f"{type_}: widgets {sorted(values)} != {sorted(expected)}")
        node = Node(len(self.nodes) + 1, type_, values, tuple(pos), tuple(size), **kw)
        if type_ != "MarkdownNote":
            node.properties = {"Node name for S&R": type_, **node.properties}
        self.nodes.append(node)
        return node

    def connect(self, src: Node, dst: Node, dst_input: str, src_slot: int = 0) -> None:
        sockets = {s.name: s for s in dst.spec.inputs}
        if dst_input not in sockets:
            raise ValueError(f"{dst.type} has no input {dst_input!r}")
        if dst_input in dst.links_in:
            raise ValueError(f"{dst.type}.{dst_input} is already linked")
        link = Link(len(self.links) + 1, src, src_slot, dst, dst_input)
        if sockets[dst_input].type not in (link.type, "*"):
            raise ValueError(f"type mismatch: {src.type}[{src_slot}] {link.type} -> {dst.type}.{dst_input}")
        self.links.append(link)
        dst.links_in[dst_input] = link.id

    def group(self, title: str, *nodes: Node) -> None:
        self.groups.append(Group(title, list(nodes)))

    # ---- execution order (what the frontend stores as "order")
    def _order(self) -> dict[int, int]:
        deps = {n.id: {lk.src.id for lk in self.links if lk.dst is n} for n in self.nodes}
        order, done = {}, set()
        while len(done) < len(self.nodes):
            ready = [i for i in sorted(deps) if i not in done and deps[i] <= done]
            if not ready:
                raise ValueError(f"{self.name}: cycle in graph")
            order[ready[0]] = len(order)
            done.add(ready[0])
        return order

    # ---- editor format
    def to_editor(self) -> dict:
        order = self._order()
        nodes = []
        for n in self.nodes:
            spec = n.spec
            inputs = []
            for s in spec.inputs:
                entry = {"localized_name": s.name, "name": s.name}
                if s.optional:
                    entry["shape"] = 7
                entry.update(type=s.type, link=n.links_in.get(s.name))
                inputs.append(entry)
            widgets_values = []
            for w in spec.widgets:
                if n.type != "MarkdownNote":
                    entry = {"localized_name": w.label or w.name, "name": w.name}
                    if w.optional:
                        entry["shape"] = 7
                    entry.update(type=w.type, widget={"name": w.name}, link=None)
                    inputs.append(entry)
                if w.type == "IMAGEUPLOAD":
                    widgets_values.append("image")  # what the frontend stores for the upload button
                    continue
                widgets_values.append(n.values[w.name])
                if w.control_after_generate:
                    widgets_values.append("randomize")
            outputs = [
                {
                    "localized_name": name,
                    "name": name,
                    "type": type_,
                    "links": [lk.id for lk in self.links if lk.src is n and lk.src_slot == slot],
                    "slot_index": slot,
                }
                for slot, (name, type_) in enumerate(spec.outputs)
            ]
            node = {
                "id": n.id,
                "type": n.type,
                "pos": list(n.pos),
                "size": list(n.size),
                "flags": {},
                "order": order[n.id],
                "mode": 0,
                "inputs": inputs,
                "outputs": outputs,
            }
            if n.title:
                node["title"] = n.title
            node["properties"] = n.properties
            node["widgets_values"] = widgets_values
            if n.color:
                node.update(color=n.color, bgcolor=n.bgcolor)
            nodes.append(node)
        links = [
            [lk.id, lk.src.id, lk.src_slot, lk.dst.id, _input_index(lk.dst, lk.dst_input), lk.type]
            for lk in self.links
        ]
        groups = []
        for i, g in enumerate(self.groups, 1):
            x0 = min(n.pos[0] for n in g.nodes) - 20
            y0 = min(n.pos[1] for n in g.nodes) - 60
            x1 = max(n.pos[0] + n.size[0] for n in g.nodes) + 20
            y1 = max(n.pos[1] + n.size[1] for n in g.nodes) + 20
            bounding = [x0, y0, x1 - x0, y1 - y0]
            groups.append(
                {
                    "id": i,
                    "title": g.title,
                    "bounding": bounding,
                    "color": g.color,
                    "font_size": 24,
                    "flags": {},
                }
            )
        return {
            "id": str(uuid.uuid5(uuid.NAMESPACE_URL, f"comfyui-flux2-klein/workflows/{self.name}")),
            "revision": 0,
            "last_node_id": max(n.id for n in self.nodes),
            "last_link_id": max((lk.id for lk in self.links), default=0),
            "nodes": nodes,
            "links": links,
            "groups": groups,
            "config": {},
            "extra": {"ds": {"scale": 0.7, "offset": [60, 80]}},
            "version": 0.4,
        }

    # ---- API format
    def to_api(self) -> dict:
        api = {}
        for n in self.nodes:
            spec = n.spec
            if spec.frontend_only:
                continue
            inputs = {}
            for w in spec.widgets:
                if w.in_api:
                    inputs[w.name] = n.values[w.name]
            for s in spec.inputs:
                if s.name in n.links_in:
                    lk = self.links[n.links_in[s.name] - 1]
                    inputs[s.name] = [str(lk.src.id), lk.src_slot]
            api[str(n.id)] = {
                "inputs": inputs,
                "class_type": n.type,
                "_meta": {"title": n.title or spec.display_name},
            }
        return api


def _input_index(node: Node, name: str) -> int:
    return [s.name for s in node.spec.inputs].index(name)


# ----------------------------------------------------------------------------------------------------
# Layout: columns from left to right, in the direction the data flows.

AUTO_TILES = {"tile_size": 0, "tile_overlap": 64}  # the VAE tiles only what does not fit
X_NOTE, X_LOAD, X_ENCODE, X_SAMPLE, X_DECODE, X_SAVE = 0, 560, 1000, 1500, 1880, 2200
LOADER_SIZE = (380, 110)
POSITIVE_COLOR = ("#232", "#353")  # ComfyUI's usual green / red for positive / negative prompts
NEGATIVE_COLOR = ("#322", "#533")
NOTE_COLOR = ("#222", "#000")


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


def _file_rows(names) -> str:
    """The note's table rows: file, folder, repos and licence, direct link."""
    return "\n".join(
        f"| `{f.name}` | `models/{f.folder}` | {f.source}"
        + (f", [direct link]({f.url})" if f.url else "")
        + " |"
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
        fp8=_file_rows(DEV_FP8), dit=dit.size_gb, te=te.size_gb, dit8=fp8[0].size_gb, te8=fp8[1].size_gb
    )


def _note(r: Recipe) -> str:
    rows = _file_rows([r.dit, r.text_encoder, "flux2-vae.safetensors"])
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
    model = g.add(
        "Flux2KleinModelLoader",
        (X_LOAD, 0),
        (380, 130),
        {
            "model_name": r.dit,
            "variant": r.variant,
            "weight_dtype": "default",
            "offload": "none",
            "resident_mb": 0,
            "devices": "",
        },
        properties={"models": models_property(r.dit)},
    )
    te = g.add(
        "Flux2KleinTextEncoderLoader",
        (X_LOAD, 180),
        LOADER_SIZE,
        {"text_encoder_name": r.text_encoder, "device": "default"},
        properties={"models": models_property(r.text_encoder)},
    )
    vae = g.add(
        "Flux2KleinVAELoader",
        (X_LOAD, 340),
        (380, 82),
        {"vae_name": "flux2-vae.safetensors"},
        properties={"models": models_property("flux2-vae.safetensors")},
    )
    g.group("Models", model, te, vae)

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
    positive = g.add(
        "Flux2KleinTextEncode",
        (X_ENCODE, 0),
        (440, 200),
        {"text": r.prompt},
        title="Prompt",
        color=POSITIVE_COLOR[0],
        bgcolor=POSITIVE_COLOR[1],
    )
    g.connect(te, positive, "text_encoder", src_slot=te_slot)
    prompt_nodes = [positive]
    negative = None
    if r.negative is not None:
        negative = g.add(
            "Flux2KleinTextEncode",
            (X_ENCODE, 250),
            (440, 140),
            {"text": r.negative},
            title="Negative prompt",
            color=NEGATIVE_COLOR[0],
            bgcolor=NEGATIVE_COLOR[1],
        )
        g.connect(te, negative, "text_encoder", src_slot=te_slot)
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
    decode = g.add("Flux2KleinDecode", (X_DECODE, 0), (260, 120), dict(AUTO_TILES))
    g.connect(vae, decode, "vae")
    g.connect(sampler, decode, "latent")
    result, generate = decode, [sampler, decode]
    if stitch is not None:
        result = g.add("Flux2KleinComposite", (X_DECODE, 140), (260, 100), {"feather": 8}, title="Composite")
        g.connect(decode, result, "image")
        g.connect(stitch, result, "stitch", src_slot=2)
        generate.append(result)
    prefix = "flux2_dev" if r.family == "dev" else "flux2_klein"
    save = g.add("SaveImage", (X_SAVE, 0), (460, 500), {"filename_prefix": f"{prefix}/{r.name}"})
    g.connect(result, save, "images")
    g.group("Generate", *generate, save)
    g.add(
        "MarkdownNote",
        (X_NOTE, 0),
        (520, 680),
        {"text": _note(r)},
        title="About this workflow",
        color=NOTE_COLOR[0],
        bgcolor=NOTE_COLOR[1],
    )
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


MASK_NOTE = (
    "\n\nThe mask is the image's transparent area: paint it in the MaskEditor, or (headless) upload a PNG "
    "whose pixels to repaint have alpha 0."
)
IMAGE_TITLES = {
    "img2img": "Image to start from",
    "inpaint": "Image to inpaint (paint the mask in the editor)",
    "outpaint": "Image to extend",
}

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


# ----------------------------------------------------------------------------------------------------
# FLUX.1 Fill [dev]: inpaint and outpaint. The sampler prepares the image itself (grow, crop-to-mask) and
# hands FLUX.2 Composite what it needs; outpainting goes through the same Outpaint Pad node.

FILL_FILES = ("flux1-fill-dev.safetensors", "t5xxl_fp16.safetensors", "clip_l.safetensors", "ae.safetensors")
FILL_STEPS, FILL_GUIDANCE = 50, 30.0


@dataclass(frozen=True)
class FillRecipe:
    name: str
    title: str
    summary: str
    prompt: str
    mode: str  # inpaint / outpaint
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
        mode="inpaint",
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
        mode="outpaint",
        settings=(
            f"{FILL_SETTINGS}\n\nThe output is the padded canvas at its full size (scaled to at most 1 "
            "megapixel for sampling, then back)."
        ),
    ),
)


def _fill_note(r: FillRecipe) -> str:
    rows = _file_rows(FILL_FILES)
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

{r.settings}{MASK_NOTE if r.mode == "inpaint" else ""}

## Headless

The same graph in API format is `{api}`; queue it with

```
python scripts/klein_client.py --server http://127.0.0.1:8188 --workflow {api} \\
    --image image.png --prompt "..." --seed 42 --output-dir out/
```
"""


def build_fill(r: FillRecipe) -> Graph:
    g = Graph(r.name)
    dit, t5, clip, ae = FILL_FILES
    model = g.add(
        "Flux1FillModelLoader",
        (X_LOAD, 0),
        LOADER_SIZE,
        {"model_name": dit, "weight_dtype": "default"},
        properties={"models": models_property(dit)},
    )
    te = g.add(
        "Flux1FillTextEncoderLoader",
        (X_LOAD, 160),
        (380, 130),
        {"t5_name": t5, "clip_name": clip, "device": "default"},
        properties={"models": models_property(t5, clip)},
    )
    vae = g.add(
        "Flux1FillVAELoader",
        (X_LOAD, 340),
        (380, 82),
        {"vae_name": ae},
        properties={"models": models_property(ae)},
    )
    g.group("Models", model, te, vae)
    positive = g.add(
        "Flux1FillTextEncode",
        (X_ENCODE, 0),
        (440, 200),
        {"text": r.prompt},
        title="Prompt",
        color=POSITIVE_COLOR[0],
        bgcolor=POSITIVE_COLOR[1],
    )
    g.connect(te, positive, "text_encoder")
    g.group("Prompt", positive)

    y = 520
    image = g.add("LoadImage", (X_LOAD, y), (380, 400), {"image": "example.png"}, title=IMAGE_TITLES[r.mode])
    inputs, source = [image], image  # Load Image's MASK: its transparent pixels
    if r.mode == "outpaint":
        source = g.add(
            "Flux2KleinOutpaintPad",
            (X_ENCODE, y),
            (300, 200),
            {"left": 0, "top": 0, "right": 256, "bottom": 0, "feather": 24},
        )
        g.connect(image, source, "image")
        inputs.append(source)
    g.group("Image to " + r.mode, *inputs)

    sampler = g.add(
        "Flux1FillSampler",
        (X_SAMPLE, 0),
        (330, 400),
        {
            "seed": SEED,
            "steps": FILL_STEPS,
            "guidance": FILL_GUIDANCE,
            "denoise": 1.0,
            "grow_mask": 0 if r.mode == "outpaint" else 4,
            "crop_to_mask": False,
            "context": 64,
            "batch_size": 1,
        },
    )
    g.connect(model, sampler, "model")
    g.connect(positive, sampler, "positive")
    g.connect(vae, sampler, "vae")
    g.connect(source, sampler, "image")
    g.connect(source, sampler, "mask", src_slot=1)
    decode = g.add("Flux1FillDecode", (X_DECODE, 0), (260, 120), dict(AUTO_TILES))
    g.connect(vae, decode, "vae")
    g.connect(sampler, decode, "latent")
    result = g.add("Flux2KleinComposite", (X_DECODE, 140), (260, 100), {"feather": 8}, title="Composite")
    g.connect(decode, result, "image")
    g.connect(sampler, result, "stitch", src_slot=1)
    save = g.add("SaveImage", (X_SAVE, 0), (460, 500), {"filename_prefix": f"flux1_fill/{r.name}"})
    g.connect(result, save, "images")
    g.group("Generate", sampler, decode, result, save)
    g.add(
        "MarkdownNote",
        (X_NOTE, 0),
        (520, 680),
        {"text": _fill_note(r)},
        title="About this workflow",
        color=NOTE_COLOR[0],
        bgcolor=NOTE_COLOR[1],
    )
    return g


# ----------------------------------------------------------------------------------------------------
# Output


def build_all() -> dict[str, tuple[dict, dict]]:
    """{name: (editor workflow, API workflow)} for every bundled workflow."""
    out = {}
    for r in RECIPES:
        g = build(r)
        out[r.name] = (g.to_editor(), g.to_api())
    for r in FILL_RECIPES:
        g = build_fill(r)
        out[r.name] = (g.to_editor(), g.to_api())
    return out


def render(obj) -> str:
    """JSON text as committed: 2-space indent, lists of plain values kept on one line."""
    return _render(obj, 0) + "\n"


def _render(obj, level: int) -> str:
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k)}: {_render(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + f"\n{pad}}}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        items = [f"{inner}{_render(v, level + 1)}" for v in obj]
        return "[\n" + ",\n".join(items) + f"\n{pad}]"
    return json.dumps(obj, ensure_ascii=False)


def expected_files() -> dict[Path, str]:
    files = {}
    for name, (editor, api) in build_all().items():
        files[WORKFLOW_DIR / f"{name}.json"] = render(editor)
        files[API_DIR / f"{name}.json"] = render(api)
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare with the files on disk")
    args = parser.parse_args(argv)
    stale = []
    for path, text in expected_files().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(("out of date: " if args.check else "wrote ") + str(path.relative_to(REPO)))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
