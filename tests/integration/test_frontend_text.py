"""Every bundled workflow, opened the way the template browser opens it in the real graph editor (headless
Chromium), shows its texts whole:

* On the classic canvas no node's title, widget label or widget value is cut (the editor cuts a text that
  does not fit to an ellipsis: every text the canvas draws is read as it is drawn, each node at scale 1).
* In Nodes 2.0 no text in a node is cut, and a node with advanced inputs is as tall as what it shows: folded
  (the pack's web/folded_size.js), not as tall as the classic canvas's every row; or shown, where the
  workflow sets one away from its default (``showAdvanced`` in the file).

Run it under each frontend (COMFYUI_FRONTEND_ROOT names another build's static folder). Needs ``playwright``
and a Chromium; skipped with the reason without them.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from comfy_server import PACK_LINK
from test_frontend_templates import OPEN_AS_TEMPLATE, TEMPLATES, editor_pages

REPO = Path(__file__).resolve().parents[2]

# Every text the classic canvas draws, each node at scale 1 (the graph drawn a window at a time), kept when
# the editor cut it: its truncation ends a text with an ellipsis ("…", or "..." for a title) or leaves only
# "‥" or "․".
CLASSIC_CUTS = """async () => {
    await document.fonts.ready;
    const canvas = window.app.canvas;
    const nodes = window.app.graph.nodes;
    const boxes = nodes.map((n) => n.boundingRect);
    const x0 = Math.min(...boxes.map((b) => b[0])), y0 = Math.min(...boxes.map((b) => b[1]));
    const x1 = Math.max(...boxes.map((b) => b[0] + b[2])), y1 = Math.max(...boxes.map((b) => b[1] + b[3]));
    const rect = canvas.canvas.getBoundingClientRect();
    const cut = [];
    const drawn = [];
    const proto = CanvasRenderingContext2D.prototype;
    const fillText = proto.fillText;
    proto.fillText = function (text, ...rest) {
        const t = String(text);
        drawn.push(t);
        if (t.endsWith("\u2026") || t.endsWith("...") || t === "\u2025" || t === "\u2024") cut.push(t);
        return fillText.call(this, text, ...rest);
    };
    const ds = canvas.ds;
    const saved = [ds.scale, [...ds.offset]];
    try {
        ds.scale = 1;
        for (let y = y0 - 10; y < y1; y += rect.height - 40) {
            for (let x = x0 - 10; x < x1; x += rect.width - 40) {
                ds.offset = [-x, -y];
                canvas.setDirty(true, true);
                canvas.draw(true, true);
            }
        }
    } finally {
        proto.fillText = fillText;
        ds.scale = saved[0];
        ds.offset = saved[1];
        canvas.setDirty(true, true);
    }
    return {cut: [...new Set(cut)], drawn: drawn.length};
}"""

# In Nodes 2.0: every leaf text of a node's element that its box cuts, and each node with advanced inputs
# (folded, or shown where the workflow opens them): its height as drawn and its content's alone (its least
# height let go for the reading).
VUE_TEXT = """async () => {
    await new Promise((resolve) => setTimeout(resolve, 500));
    const cut = [], folded = [];
    for (const node of window.app.graph.nodes) {
        const element = document.querySelector(`[data-node-id='${node.id}']`);
        if (!element) continue;
        for (const e of element.querySelectorAll("*")) {
            const field = ["TEXTAREA", "INPUT"].includes(e.tagName);
            if (e.children.length || field || !e.textContent.trim()) continue;
            const style = getComputedStyle(e);
            const hides = style.textOverflow === "ellipsis" || ["hidden", "clip"].includes(style.overflowX);
            if (hides && e.scrollWidth > e.clientWidth + 1) {
                const text = e.textContent.trim();
                cut.push({type: node.type, text, width: e.clientWidth, needs: e.scrollWidth});
            }
        }
        if (!(node.widgets ?? []).some((w) => w.options?.advanced)) continue;
        const drawn = element.getBoundingClientRect().height;
        const [minHeight, height] = [element.style.minHeight, element.style.height];
        element.style.setProperty("min-height", "0px", "important");
        element.style.setProperty("height", "auto", "important");
        const content = element.getBoundingClientRect().height;
        element.style.minHeight = minHeight;
        element.style.height = height;
        const scale = window.app.canvas.ds.scale;
        folded.push({id: node.id, type: node.type, open: !!node.showAdvanced, drawn: drawn / scale,
                     content: content / scale});
    }
    return {cut, folded};
}"""


@pytest.fixture(scope="module")
def editors(comfy, browser):
    """An editor page (1920x1080) per renderer: the classic canvas (False) and Nodes 2.0 (True)."""
    with editor_pages(comfy, browser) as page:
        yield lambda vue: page(vue)


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_classic_canvas_cuts_no_title_label_or_value(editors, name):
    page = editors(False)
    page.evaluate(OPEN_AS_TEMPLATE, [PACK_LINK, name])
    seen = page.evaluate(CLASSIC_CUTS)
    assert seen["drawn"] > 0, f"{name}: the canvas drew no text"
    assert not seen["cut"], f"{name}: the classic canvas cuts {seen['cut']}: rebuild the workflows"


@pytest.mark.parametrize("name", TEMPLATES)
def test_nodes_2_0_cuts_no_text_and_folded_nodes_fit_what_they_show(editors, name):
    page = editors(True)
    page.evaluate(OPEN_AS_TEMPLATE, [PACK_LINK, name])
    seen = page.evaluate(VUE_TEXT)
    assert not seen["cut"], f"{name}: Nodes 2.0 cuts {seen['cut']}"
    loose = [f for f in seen["folded"] if f["drawn"] > f["content"] + 2]
    assert not loose, f"{name}: nodes taller than what they show: {loose}"


# Nodes 2.0 switched off with a workflow open: each node's size on the classic canvas once drawn, and the
# least size the classic canvas computes for it (every widget's row).
SWITCHED_OFF = """async () => {
    const set = (value) => window.app.extensionManager.setting.set("Comfy.VueNodes.Enabled", value);
    await set(false);
    await new Promise((resolve) => setTimeout(resolve, 1500));
    window.app.canvas.setDirty(true, true);
    window.app.canvas.draw(true, true);
    const sizes = window.app.graph.nodes.map((n) => ({type: n.type, size: [...n.size],
                                                      least: n.computeSize()}));
    await set(true);
    await new Promise((resolve) => setTimeout(resolve, 1500));
    return sizes;
}"""


def test_a_node_sized_folded_gets_every_row_back_on_the_classic_canvas(editors):
    page = editors(True)
    page.evaluate(OPEN_AS_TEMPLATE, [PACK_LINK, "FLUX.2 klein text to image"])
    sizes = page.evaluate(SWITCHED_OFF)
    short = [s for s in sizes if s["size"][1] + 1 < s["least"][1]]
    assert not short, f"nodes shorter than their rows once Nodes 2.0 is switched off: {short}"


def test_the_builders_text_widths_are_the_editors(editors):
    # the builder sizes nodes to their texts with these (scripts/record_node_sizes.py records them)
    sys.path.insert(0, str(REPO / "scripts" / "workflow_builder"))
    try:
        from sizes import (
            FONTS,
            MEASURE_TEXT,
            WIDGETS,
        )  # the module alone: the builder's package imports the pack
    finally:
        sys.path.remove(str(REPO / "scripts" / "workflow_builder"))
    seen = editors(False).evaluate(MEASURE_TEXT, sorted(WIDGETS))
    for font, recorded in FONTS.items():
        assert seen["fonts"][font]["font"] == recorded["font"], font
        for ch, width in seen["fonts"][font]["advance"].items():
            fix = "run scripts/record_node_sizes.py"
            assert width <= recorded["advance"][ch] + 0.01, (font, ch, width, fix)
    for node_type, widgets in seen["widgets"].items():
        for name, (label, precision) in widgets.items():
            assert name in WIDGETS[node_type], (node_type, name, "run scripts/record_node_sizes.py")
            assert len(label) <= len(WIDGETS[node_type][name][0]), (node_type, name, label)
            assert precision in (None, WIDGETS[node_type][name][1]), (node_type, name, precision)
