"""What every bundled workflow has in the same place: the columns (left to right, the way the data flows),
the loader group, the prompt node, the end of the chain (decode, the inpaint composite, save) and the note."""

from __future__ import annotations

from .graph import Graph, Node
from .models import models_property
from .recipe import Mode

SEED = 42  # the API workflows' fixed seed and the editor workflows' first one (then "randomize")
AUTO_TILES = {"tile_size": 0, "tile_overlap": 64}  # the VAE tiles only what does not fit
X_NOTE, X_LOAD, X_ENCODE, X_SAMPLE, X_DECODE, X_SAVE = 0, 560, 1000, 1500, 1880, 2200
LOADER_SIZE = (380, 110)
POSITIVE_COLOR = ("#232", "#353")  # ComfyUI's usual green / red for positive / negative prompts
NEGATIVE_COLOR = ("#322", "#533")
NOTE_COLOR = ("#222", "#000")
MASK_NOTE = (
    "\n\nThe mask is the image's transparent area: paint it in the MaskEditor, or (headless) upload a PNG "
    "whose pixels to repaint have alpha 0."
)
IMAGE_TITLES = {
    Mode.IMG2IMG: "Image to start from",
    Mode.INPAINT: "Image to inpaint (paint the mask in the editor)",
    Mode.OUTPAINT: "Image to extend",
    Mode.UPSCALE: "Image to enlarge",
}
# The rows of the load column below the models: one per reference image, then the image to edit.
Y_IMAGES, IMAGE_ROW = 520, 460
IMAGE_SIZE = (380, 400)


def loaders(g: Graph, *nodes: tuple[str, tuple, tuple, dict, tuple[str, ...]]) -> list[Node]:
    """The "Models" group: (type, pos, size, widget values, files it reads) per loader, each with the
    download entries of its files."""
    added = [
        g.add(type_, pos, size, values, properties={"models": models_property(*files)})
        for type_, pos, size, values, files in nodes
    ]
    g.group("Models", *added)
    return added


def load_image(g: Graph, y: int, title: str) -> Node:
    """A Load Image node in the load column at row ``y`` (its MASK output: the image's transparent pixels)."""
    return g.add("LoadImage", (X_LOAD, y), IMAGE_SIZE, {"image": "example.png"}, title=title)


def prompt(g: Graph, type_: str, text: str, encoder: Node, slot: int = 0, negative: bool = False) -> Node:
    """A text-encode node in the encode column: the prompt (green) or the negative prompt (red) below it."""
    color = NEGATIVE_COLOR if negative else POSITIVE_COLOR
    node = g.add(
        type_,
        (X_ENCODE, 250 if negative else 0),
        (440, 140 if negative else 200),
        {"text": text},
        title="Negative prompt" if negative else "Prompt",
        color=color[0],
        bgcolor=color[1],
    )
    g.connect(encoder, node, "text_encoder", src_slot=slot)
    return node


def outpaint_pad(g: Graph, image: Node, y: int) -> Node:
    """FLUX.2 Outpaint Pad beside the image: 256 px added on the right, a 24 px fade into the original."""
    pad = g.add(
        "Flux2KleinOutpaintPad",
        (X_ENCODE, y),
        (300, 200),
        {"left": 0, "top": 0, "right": 256, "bottom": 0, "feather": 24},
    )
    g.connect(image, pad, "image")
    return pad


def finish(
    g: Graph, decode_type: str, vae: Node, sampler: Node, stitch, prefix: str, note: str, tiles=AUTO_TILES
) -> None:
    """Decode the sampler's latent, composite it over the original when ``stitch`` = (node, slot) gives an
    inpaint's stitch, save under ``prefix``, group it all as "Generate", and add the note."""
    decode = g.add(decode_type, (X_DECODE, 0), (260, 120), dict(tiles))
    g.connect(vae, decode, "vae")
    g.connect(sampler, decode, "latent")
    result, generate = decode, [sampler, decode]
    if stitch is not None:
        result = g.add("Flux2KleinComposite", (X_DECODE, 140), (260, 100), {"feather": 8}, title="Composite")
        g.connect(decode, result, "image")
        g.connect(stitch[0], result, "stitch", src_slot=stitch[1])
        generate.append(result)
    save = g.add("SaveImage", (X_SAVE, 0), (460, 500), {"filename_prefix": f"{prefix}/{g.name}"})
    g.connect(result, save, "images")
    g.group("Generate", *generate, save)
    g.add(
        "MarkdownNote",
        (X_NOTE, 0),
        (520, 680),
        {"text": note},
        title="About this workflow",
        color=NOTE_COLOR[0],
        bgcolor=NOTE_COLOR[1],
    )
