"""Where the graph editor draws a node, and how the builder keeps nodes and groups apart.

The editor draws a node's title bar above its ``pos`` and enlarges the node to the room its widgets need; its
Nodes 2.0 mode draws each node as a page element whose least size is its own (both recorded from the real
editor in ``node_sizes.json`` by ``scripts/record_node_sizes.py``: ``sizes`` the canvas's, every widget
counted; ``vue`` and ``vue_open`` the Nodes 2.0 box with its header, advanced inputs folded and shown). A node
is stored as tall as Nodes 2.0 draws it (``stored_size``: what it shows) and laid out as tall as the classic
canvas draws it (``drawn_height``), and as wide as its texts need uncut (``text_width_needed``, from the
editor's font advances and widget labels recorded beside the sizes). A group's box is its nodes' boxes with a
margin and a title band above (``formats.to_editor``). ``arrange`` puts each node in its column (left to
right, the way the data flows, every node as wide as its column); ``settle`` moves nodes down their column
until no node's drawn box, nor a group's box, runs into another's; ``check_group_titles`` refuses a group
title wider than its group.

A template opened from the template browser is fitted to the window (the editor's ``fitView``: the nodes'
boxes plus 10 px, at 0.75 of the scale that fills the window) whatever view the file stores; the editor draws
text only at a scale of at least its low-quality threshold (8 px of 14 px text: 0.571 at a device pixel
ratio of 1). ``opening_scale`` is that scale for a window size, so the builder can keep every workflow
readable as it opens.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

SIZES_FILE = Path(__file__).resolve().parent / "node_sizes.json"
TITLE_HEIGHT = 30  # the node's title bar, drawn above pos
GROUP_MARGIN = 20  # a group's box around its nodes: left, right and bottom
GROUP_TOP = 60  # from the top node's pos to the group's top: the node title and the group's title band
NODE_GAP = 30  # between two nodes of one group (or two ungrouped ones), vertically
GROUP_GAP = 20  # between boxes of different groups, or a group and a node outside it
GROUP_FONT = 24  # px: the group title's font size, as the files store it
TITLE_CHAR = 0.62  # the widest average advance of the editor's sans-serif font, per px of font size


# In the editor's page (scripts/record_node_sizes.py, and the integration tests that check the file): the
# pack's nodes are known, then a new node of each type, its size as the editor computes it, removed again.
READY = (
    "() => window.app && window.app.graph && window.LiteGraph && "
    "'Flux2KleinSampler' in window.LiteGraph.registered_node_types"
)
# A new node of each type, its size as the editor computes it (every widget shown), then removed again.
MEASURE = """(types) => {
    const sizes = {};
    for (const type of types) {
        const node = window.LiteGraph.createNode(type);
        if (!node) continue;  // a type this server does not have
        window.app.graph.add(node);
        const [w, h] = node.computeSize();
        sizes[type] = [Math.ceil(w), Math.ceil(h)];
        window.app.graph.remove(node);
    }
    return sizes;
}"""


# The same in Nodes 2.0 (the editor's Vue nodes): each new node's element, its header included, once drawn
# (the pack's web/folded_size.js leaves folded advanced inputs out of it), the same with its advanced inputs
# shown (for a node that has some), and the room the element keeps beside a combo's value: the node's width
# less the value's box, plus the box's padding.
MEASURE_VUE = """async (types) => {
    const sizes = {}, open = {}, rooms = {};
    window.app.graph.clear();
    window.app.canvas.ds.scale = 1;
    window.app.canvas.ds.offset = [0, 0];
    const drawn = async (type, showAdvanced) => {
        const node = window.LiteGraph.createNode(type);
        if (!node) return null;
        if (showAdvanced) node.showAdvanced = true;
        node.pos = [100, 100];
        window.app.graph.add(node);
        // drawn once its size holds (a Load Image's picture arrives after the node)
        let last = "";
        for (let i = 0; i < 10; i++) {
            await new Promise((resolve) => setTimeout(resolve, 400));
            const e = document.querySelector(`[data-node-id='${node.id}']`);
            const now = e ? `${e.getBoundingClientRect().width}x${e.getBoundingClientRect().height}` : "";
            if (now && now === last) break;
            last = now;
        }
        const element = document.querySelector(`[data-node-id='${node.id}']`);
        let size = null;
        if (element) {
            const r = element.getBoundingClientRect();
            size = [Math.ceil(r.width), Math.ceil(r.height)];
            const values = new Set((node.widgets ?? []).filter((w) => w.type === "combo" && w.value)
                .map((w) => String(w.value)));
            for (const e of element.querySelectorAll("*")) {
                const style = getComputedStyle(e);
                const text = e.textContent.trim();
                if (e.children.length || style.textOverflow !== "ellipsis" || !values.has(text)) continue;
                const pad = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
                const room = Math.ceil(r.width - e.getBoundingClientRect().width + pad);
                rooms[type] = Math.max(rooms[type] ?? 0, room);
            }
        }
        const advanced = (node.widgets ?? []).some((w) => w.options?.advanced);
        window.app.graph.remove(node);
        return {size, advanced};
    };
    for (const type of types) {
        const folded = await drawn(type, false);
        if (!folded || !folded.size) continue;
        sizes[type] = folded.size;
        if (folded.advanced) open[type] = (await drawn(type, true)).size;
    }
    return {sizes, open, rooms};
}"""

# The label and the number precision of each widget of each node type, as the classic canvas draws them, and
# the advance of each printable ASCII character in the canvas's widget and title fonts (the editor ships its
# font, Inter, so these are the same on every machine).
MEASURE_TEXT = """async (types) => {
    const L = window.LiteGraph;
    const fonts = {widget: `normal ${L.NODE_SUBTEXT_SIZE}px ${L.NODE_FONT}`,
                   title: `${L.NODE_TEXT_SIZE}px ${L.NODE_FONT}`};
    await Promise.all(Object.values(fonts).map((font) => document.fonts.load(font)));
    const ctx = document.createElement("canvas").getContext("2d");
    const advances = {};
    for (const [name, font] of Object.entries(fonts)) {
        ctx.font = font;
        const advance = {};
        for (let c = 32; c < 127; c++) {
            const ch = String.fromCharCode(c);
            advance[ch] = Math.round(ctx.measureText(ch).width * 100) / 100;
        }
        advances[name] = {font, advance};
    }
    const widgets = {};
    for (const type of types) {
        const node = L.createNode(type);
        if (!node) continue;
        widgets[type] = Object.fromEntries((node.widgets ?? []).map((w) => [w.name, [
            String(w.displayName ?? w.label ?? w.name), w.options?.precision ?? null]]));
    }
    return {fonts: advances, widgets};
}"""


def _record() -> dict:
    return json.loads(SIZES_FILE.read_text(encoding="utf-8")) if SIZES_FILE.exists() else {}


RECORD = _record()
MIN_SIZES = {k: tuple(v) for k, v in RECORD.get("sizes", {}).items()}  # the classic canvas, every widget
VUE_SIZES = {k: tuple(v) for k, v in RECORD.get("vue", {}).items()}  # Nodes 2.0: the box, its header included
VUE_OPEN = {k: tuple(v) for k, v in RECORD.get("vue_open", {}).items()}  # the same, advanced inputs shown
VUE_ROOMS: dict[str, int] = RECORD.get("vue_rooms", {})  # Nodes 2.0: the width a combo's value does not get
WIDGETS: dict[str, dict[str, list]] = RECORD.get("widgets", {})  # type -> widget -> [label, precision]
FONTS: dict[str, dict] = RECORD.get("fonts", {})


def least_size(node_type: str) -> tuple[float, float]:
    """The least size (below the title bar) either of the editor's renderers draws a node at."""
    classic = MIN_SIZES.get(node_type, (0, 0))
    vue = VUE_SIZES.get(node_type, (0, TITLE_HEIGHT))
    return (max(classic[0], vue[0]), max(classic[1], vue[1] - TITLE_HEIGHT))


# What the classic canvas keeps of a node's width beside a widget's label and value (drawTruncatingText: two
# margins of 15 px each side, and for a stepped widget 5 px before the label and 20 px for its arrows); a
# toggle draws its label from 30 px and its value up to 40 px from the right edge. Label and value are
# drawn whole when they fit with the 5 px gap between them; else the label is cut first.
CLASSIC_ROOM = {"COMBO": 85, "INT": 85, "FLOAT": 85, "STRING": 60, "BOOLEAN": 70}
LABEL_GAP = 5
TITLE_ROOM = 60  # the title is drawn from 30 px and cut 30 px before the right edge
TEXT_SLACK = 4  # px: kerning and rounding, beside the sum of the characters' advances


def text_width(text: str, font: str = "widget") -> float:
    """The drawn width of ``text`` in the editor's canvas ``font`` (``widget`` or ``title``), from the
    recorded advances (a character outside them counts as the widest)."""
    advance = FONTS[font]["advance"]
    widest = max(advance.values())
    return sum(advance.get(c, widest) for c in str(text)) + TEXT_SLACK


def shown_texts(node_type: str, values: dict) -> list[tuple[str, str, str]]:
    """(widget type, label, value as drawn) of each widget the classic canvas draws as a label and a value."""
    from .schemas import NODE_SPECS  # the schemas import the pack; this module alone must not

    spec = NODE_SPECS[node_type]
    if spec.frontend_only:
        return []
    recorded = WIDGETS.get(node_type, {})
    texts = []
    for w in spec.widgets:
        if w.type == "IMAGEUPLOAD" or w.multiline:  # a button, or a text box of its own
            continue
        label, precision = recorded.get(w.name, [w.label or w.name, None])
        value = values[w.name]
        if w.type == "FLOAT":
            value = f"{float(value):.{3 if precision is None else int(precision)}f}"
        elif w.type == "INT":
            value = str(int(value))
        elif w.type == "BOOLEAN":
            value = "true" if value else "false"
        texts.append((w.type, label, str(value)))
        if w.control_after_generate:
            label = recorded.get("control_after_generate", ["control_after_generate"])[0]
            texts.append(("COMBO", label, "randomize"))
    return texts


def text_width_needed(node_type: str, values: dict, title: str | None = None) -> float:
    """The least width at which the editor cuts none of a node's texts: on the classic canvas its title and
    every widget's label and value, in Nodes 2.0 every combo's value."""
    from .schemas import NODE_SPECS

    if not FONTS:
        return 0.0
    texts = shown_texts(node_type, values)
    need = text_width(title or NODE_SPECS[node_type].display_name, "title") + TITLE_ROOM
    for kind, label, value in texts:
        need = max(need, text_width(label) + LABEL_GAP + text_width(value) + CLASSIC_ROOM[kind])
    room = VUE_ROOMS.get(node_type)
    if room is not None:
        for kind, _, value in texts:
            if kind == "COMBO":
                need = max(need, text_width(value) + room)
    return need


def stored_size(
    node_type: str, size, values: dict, title: str | None = None, show_advanced: bool = False
) -> tuple[float, float]:
    """The size the file stores for a node: at least as wide as either renderer draws it and as its texts
    need, and as tall as Nodes 2.0 draws it (what it shows: its advanced inputs folded, or shown where
    ``show_advanced``). The classic canvas enlarges a node to every widget's row on opening
    (``drawn_height``); the layout makes room for that."""
    least = least_size(node_type)
    if show_advanced and node_type in VUE_OPEN:
        least = (max(least[0], VUE_OPEN[node_type][0]), least[1])
    width = math.ceil(max(size[0], least[0], text_width_needed(node_type, values, title)))
    vue = (VUE_OPEN if show_advanced else VUE_SIZES).get(node_type) or VUE_SIZES.get(node_type)
    height = vue[1] - TITLE_HEIGHT if vue else MIN_SIZES.get(node_type, (0, 0))[1]
    return (float(width), float(max(size[1], height)))


def drawn_height(node) -> float:
    """The height the classic canvas draws a node at (every widget's row)."""
    return max(node.size[1], MIN_SIZES.get(node.type, (0, 0))[1])


def title_width(title: str, font_size: int = GROUP_FONT) -> float:
    """A generous estimate of a group title's drawn width (the editor measures it with its canvas font)."""
    return len(title) * font_size * TITLE_CHAR


Box = tuple[float, float, float, float]  # x0, y0, x1, y1


def node_box(node) -> Box:
    """What the editor draws of a node: its body and the title bar above it."""
    x, y = node.pos
    return (x, y - TITLE_HEIGHT, x + node.size[0], y + drawn_height(node))


def group_box(nodes) -> Box:
    """A group's box (``formats.to_editor`` writes it): its nodes' boxes, the margins, the title band."""
    return (
        min(n.pos[0] for n in nodes) - GROUP_MARGIN,
        min(n.pos[1] for n in nodes) - GROUP_TOP,
        max(n.pos[0] + n.size[0] for n in nodes) + GROUP_MARGIN,
        max(n.pos[1] + drawn_height(n) for n in nodes) + GROUP_MARGIN,
    )


def _outer(node, group) -> Box:
    """A node's box with its group's margins: the room it claims against anything outside its group."""
    if group is None:
        return node_box(node)
    x0, y0, x1, y1 = node_box(node)
    return (x0 - GROUP_MARGIN, y0 - (GROUP_TOP - TITLE_HEIGHT), x1 + GROUP_MARGIN, y1 + GROUP_MARGIN)


def _clash(a: Box, b: Box, gap: float) -> float:
    """How far ``b`` (the lower one) must move down to sit ``gap`` below ``a``; 0 when they do not touch."""
    if a[0] >= b[2] + gap or b[0] >= a[2] + gap or a[1] >= b[3] + gap or b[1] >= a[3] + gap:
        return 0.0
    return a[3] + gap - b[1]


def _shift(nodes, dy: float) -> None:
    for n in nodes:
        n.pos = (n.pos[0], n.pos[1] + dy)


def settle(graph) -> None:
    """Move nodes (and whole groups) down until no drawn box runs into another: nodes of one group
    ``NODE_GAP`` apart, anything else ``GROUP_GAP`` apart, group boxes included. Only ever down, so the
    columns keep their order and the loop ends."""
    group_of = {id(n): g for g in graph.groups for n in g.nodes}
    for _ in range(10 * len(graph.nodes) + 10):
        moved = False
        ordered = sorted(graph.nodes, key=lambda n: (node_box(n)[1], n.id))
        for i, b in enumerate(ordered):
            for a in ordered[:i]:
                ga, gb = group_of.get(id(a)), group_of.get(id(b))
                if ga is gb:
                    dy = _clash(node_box(a), node_box(b), NODE_GAP)
                else:
                    dy = _clash(_outer(a, ga), _outer(b, gb), GROUP_GAP)
                if dy > 0:
                    _shift([b], dy)
                    moved = True
        for g in graph.groups:  # a group's box covers more than its nodes' own boxes
            box = group_box(g.nodes)
            for n in graph.nodes:
                if group_of.get(id(n)) is g:
                    continue
                other = group_of.get(id(n))
                theirs = group_box(other.nodes) if other is not None else node_box(n)
                if theirs[1] >= box[1]:
                    dy = _clash(box, theirs, GROUP_GAP)
                    if dy > 0:
                        _shift(other.nodes if other is not None else [n], dy)
                        moved = True
        if not moved:
            return
    raise ValueError(f"{graph.name}: the layout does not settle")


def check_group_titles(graph) -> None:
    """A group title must fit its group's width (it would run into the next group's title)."""
    for g in graph.groups:
        x0, _, x1, _ = group_box(g.nodes)
        if title_width(g.title) + GROUP_MARGIN > x1 - x0:
            raise ValueError(
                f"{graph.name}: group title {g.title!r} (about {title_width(g.title):.0f} px) is wider "
                f"than its group ({x1 - x0:.0f} px): shorten it"
            )


COLUMN_GAP = 70  # between two columns' nodes: room for two group margins and the gap between groups


def arrange(graph, columns: list[str], first=()) -> None:
    """Put every node in its column (``Node.col``, in the order ``columns`` gives, left to right), each column
    as wide as its widest node and every node in it as wide, the nodes of a column in the order they were
    added (``first`` on top), then ``settle`` them."""
    x = 0
    for col in columns:
        members = [n for n in graph.nodes if n.col == col]
        if not members:
            continue
        width = max(n.size[0] for n in members)
        for n in members:
            n.pos = (x, -1 if n in first else 0)
            n.size = (width, n.size[1])
        x += width + COLUMN_GAP
    stray = [n.type for n in graph.nodes if n.col not in columns]
    if stray:
        raise ValueError(f"{graph.name}: nodes outside the columns: {stray}")
    settle(graph)


FIT_ZOOM, FIT_PADDING = 0.75, 10  # the editor's fitView: 0.75 of the filling scale, 10 px around the nodes
LOW_QUALITY_THRESHOLD = 8 / 14  # the least scale the editor draws text at (8 px of its 14 px text)


def opening_scale(graph, window: tuple[int, int]) -> float:
    """The scale a template opens at from the template browser in a window of that size (the canvas fills
    the window): the editor's fitView of the nodes' boxes."""
    boxes = [node_box(n) for n in graph.nodes]
    width = max(b[2] for b in boxes) - min(b[0] for b in boxes) + 2 * FIT_PADDING
    height = max(b[3] for b in boxes) - min(b[1] for b in boxes) + 2 * FIT_PADDING
    return FIT_ZOOM * min(window[0] / max(width, 300), window[1] / max(height, 300))


VIEW_SCALE = 0.7  # the opening zoom: the note's text stays readable
VIEW_MARGIN = (110, 80)  # screen px left of and above the graph: clear of the sidebar and the top menu


def view(graph) -> dict:
    """The opening view (``extra.ds``): the graph's top-left corner, group titles included, at
    ``VIEW_MARGIN`` from the window's corner, at ``VIEW_SCALE``. The editor shows canvas point p at screen
    (p + offset) * scale."""
    boxes = [node_box(n) for n in graph.nodes] + [group_box(g.nodes) for g in graph.groups]
    left, top = min(b[0] for b in boxes), min(b[1] for b in boxes)
    offset = [round(VIEW_MARGIN[0] / VIEW_SCALE - left), round(VIEW_MARGIN[1] / VIEW_SCALE - top)]
    return {"scale": VIEW_SCALE, "offset": offset}
