"""What every bundled workflow has in the same place: the columns (left to right, the way the data flows: the
models, the note and the prompts, one column per image the graph reads, the sampling), the loader group, the
prompt node, the end of the chain (decode, the inpaint composite, save) and the note.

The columns are laid out by ``sizes.arrange``; a graph that opens larger with its note and prompts under the
models has them there (``lay_out``)."""

from __future__ import annotations

from .graph import Graph, Node
from .models import models_property
from .recipe import Mode
from .sizes import arrange, least_size, opening_scale

SEED = 42  # the API workflows' fixed seed and the editor workflows' first one (then "randomize")
AUTO_TILES = {"tile_size": 0, "tile_overlap": 64}  # the VAE tiles only what does not fit
MODELS, PROMPT, GENERATE = "models", "prompt", "generate"  # the columns every workflow has
LOADER_SIZE = (290, 80)
POSITIVE_COLOR = ("#232", "#353")  # ComfyUI's usual green / red for positive / negative prompts
NEGATIVE_COLOR = ("#322", "#533")
NOTE_COLOR = ("#222", "#000")
NOTE_SIZE = (400, 300)
PROMPT_SIZE = (400, 200)
SAVE_SIZE = (270, 200)
IMAGE_SIZE = (283, 322)
MASK_NOTE = (
    "\n\nThe mask is the image's transparent area: paint it in the MaskEditor, or (headless) upload a PNG "
    "whose pixels to repaint have alpha 0."
)
MASK_HINT = "\n\nThe mask is the image's transparent area: right-click the image, *Open in MaskEditor*."
IMAGE_TITLES = {
    Mode.IMG2IMG: "Image to start from",
    Mode.INPAINT: "Image to inpaint (paint the mask in the editor)",
    Mode.OUTPAINT: "Image to extend",
    Mode.UPSCALE: "Image to enlarge",
}
OPENING_WINDOW = (1920, 1080)  # the window the layouts are chosen for (the template browser fits the graph)


def image_column(i: int) -> str:
    """The ``i``-th column of images (0: the first), between the prompts and the sampling."""
    return f"image{i + 1}"


def lay_out(g: Graph) -> None:
    """Put the graph's nodes in columns, left to right (the models, the prompts with the note on top, one
    column per image the graph reads, native sampling, the sampling), or with the prompts and the note under
    the models: of the two, the one the template browser opens at the larger scale
    (``sizes.opening_scale``)."""
    images = sorted({n.col for n in g.nodes if n.col.startswith("image")}, key=lambda c: int(c[5:]))
    middle = [c for c in ("native", "native2") if any(n.col == c for n in g.nodes)]
    order = [MODELS, PROMPT, *images, *middle, GENERATE]
    notes = [n for n in g.nodes if n.type == "MarkdownNote"]
    prompts = [n for n in g.nodes if n.col == PROMPT]
    arrange(g, order, notes)
    if not prompts:
        return
    side_by_side = opening_scale(g, OPENING_WINDOW)
    for n in prompts:
        n.col = MODELS
    arrange(g, [c for c in order if c != PROMPT], notes)
    if opening_scale(g, OPENING_WINDOW) < side_by_side:
        for n in prompts:
            n.col = PROMPT
        arrange(g, order, notes)


def loaders(g: Graph, *nodes: tuple[str, tuple, dict, tuple[str, ...]]) -> list[Node]:
    """The "Models" group: (type, size, widget values, files it reads) per loader, each with the download
    entries of its files."""
    added = [
        g.add(type_, MODELS, size, values, properties={"models": models_property(*files)})
        for type_, size, values, files in nodes
    ]
    g.group("Models", *added)
    return added


def load_image(g: Graph, col: str, title: str) -> Node:
    """A Load Image node at the top of column ``col`` (its MASK output: the image's transparent pixels)."""
    return g.add("LoadImage", col, IMAGE_SIZE, {"image": "example.png"}, title=title)


def prompt(g: Graph, type_: str, text: str, encoder: Node, slot: int = 0, negative: bool = False) -> Node:
    """A text-encode node in the prompt column: the prompt (green) or the negative prompt (red) below it."""
    color = NEGATIVE_COLOR if negative else POSITIVE_COLOR
    node = g.add(
        type_,
        PROMPT,
        PROMPT_SIZE,
        {"text": text},
        title="Negative prompt" if negative else "Prompt",
        color=color[0],
        bgcolor=color[1],
    )
    g.connect(encoder, node, "text_encoder", src_slot=slot)
    return node


def outpaint_pad(g: Graph, image: Node, col: str) -> Node:
    """FLUX.2 Outpaint Pad below the image: 256 px added on the right, a 24 px fade into the original."""
    pad = g.add(
        "Flux2KleinOutpaintPad",
        col,
        (270, 200),
        {"left": 0, "top": 0, "right": 256, "bottom": 0, "feather": 24},
    )
    g.connect(image, pad, "image")
    return pad


def note(g: Graph, text: str) -> Node:
    """The note, above the prompts (``columns`` puts it on top)."""
    lines = len(text.strip().splitlines())  # Nodes 2.0 draws the whole text: room for each line past 12
    return g.add(
        "MarkdownNote",
        PROMPT,
        (NOTE_SIZE[0], NOTE_SIZE[1] + 60 * max(0, lines - 12)),
        {"text": text},
        title="About this workflow",
        color=NOTE_COLOR[0],
        bgcolor=NOTE_COLOR[1],
    )


def finish(
    g: Graph, decode_type: str, vae: Node, sampler: Node, stitch, prefix: str, text: str, tiles=AUTO_TILES
) -> None:
    """Decode the sampler's latent below it, composite it over the original when ``stitch`` = (node, slot)
    gives an inpaint's stitch, save under ``prefix``, group it all as "Generate", and add the note."""
    decode = g.add(decode_type, GENERATE, least_size(decode_type), dict(tiles))
    g.connect(vae, decode, "vae")
    g.connect(sampler, decode, "latent")
    result, generate = decode, [decode]
    if stitch is not None:
        result = g.add("Flux2KleinComposite", GENERATE, (270, 100), {"feather": 8}, title="Composite")
        g.connect(decode, result, "image")
        g.connect(stitch[0], result, "stitch", src_slot=stitch[1])
        generate.append(result)
    save = g.add("SaveImage", GENERATE, SAVE_SIZE, {"filename_prefix": f"{prefix}/{g.name}"})
    g.connect(result, save, "images")
    g.group("Generate", *[n for n in g.nodes if n.col == GENERATE and n not in generate], *generate, save)
    note(g, text)
