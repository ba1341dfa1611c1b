"""Every bundled editor workflow opened in the graph editor the real server serves (headless Chromium): every
node type is one the editor knows, no node but LoadImage (whose picture is the user's) is marked with an error
(a missing model file, an unknown combo value, an input the node no longer has), and every widget shows the
value the file stores. Read from the page as drawn, not from the file: no node overlaps another, no group
title is wider than its group, the opening view shows every note whole, clear of the sidebar and menus, and
the builder's recorded node sizes are the ones the editor computes.

Needs the Python package ``playwright`` and a Chromium (``/usr/bin/chromium``, or ``CHROMIUM`` naming
one); without them the test is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EDITOR_WORKFLOWS = sorted((REPO / "workflows").glob("*.json"))
CHROMIUM = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
# Flags for a headless Chromium on a machine with no network but loopback (no background connections).
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run"]  # fmt: skip
OPEN = """async (workflow) => {
    await window.app.loadGraphData(workflow, true, true, "check");
    const known = window.LiteGraph.registered_node_types;
    const nodes = window.app.graph.nodes ?? window.app.graph._nodes;
    return nodes.map((n) => ({
        id: n.id, type: n.type, known: n.type in known, error: !!n.has_errors,
        widgets: (n.widgets ?? []).filter((w) => w.serialize !== false).map((w) => w.value),
    }));
}"""


# What the editor draws: each node's box (title bar included), each group's box and its title's width in the
# group's own font, and the view.
DRAWN = """async (workflow) => {
    await window.app.loadGraphData(workflow, true, true, "check");
    const canvas = window.app.canvas;
    canvas.draw(true, true);
    const ctx = canvas.ctx;
    const nodes = window.app.graph.nodes ?? window.app.graph._nodes;
    const groups = window.app.graph.groups ?? window.app.graph._groups;
    return {
        nodes: nodes.map((n) => ({id: n.id, type: n.type, box: [...n.boundingRect]})),
        groups: groups.map((g) => {
            ctx.save();
            ctx.font = g.font || `${g.font_size}px Arial`;
            const width = ctx.measureText(g.title).width;
            ctx.restore();
            return {title: g.title, box: [...g._bounding], title_width: width};
        }),
    };
}"""
# Points inside each note's four corners, and what the page shows there: the canvas (or the note's own text,
# a DOM widget), never a sidebar, menu or toolbar over it.
NOTE_CORNERS = """async (workflow) => {
    // no missing-model dialog: this server lacks some files on purpose, and a dialog would cover the view
    const quiet = {showMissingModelsDialog: false, showMissingNodesDialog: false};
    await window.app.loadGraphData(workflow, true, true, "check", quiet);
    await new Promise((resolve) => setTimeout(resolve, 300));
    const canvas = window.app.canvas;
    const rect = canvas.canvas.getBoundingClientRect();
    const ds = canvas.ds;
    const found = [];
    for (const n of window.app.graph.nodes ?? window.app.graph._nodes) {
        if (n.type !== "MarkdownNote") continue;
        const [x0, y0, w, h] = n.boundingRect;
        for (const [px, py, dx, dy] of [[x0, y0, 6, 6], [x0 + w, y0, -6, 6], [x0, y0 + h, 6, -6],
                                        [x0 + w, y0 + h, -6, -6]]) {
            const sx = rect.left + (px + ds.offset[0]) * ds.scale + dx;
            const sy = rect.top + (py + ds.offset[1]) * ds.scale + dy;
            const el = document.elementFromPoint(sx, sy);
            const shown = !!el && (el === canvas.canvas || !!el.closest(".dom-widget"));
            found.push({node: n.id, at: [Math.round(sx), Math.round(sy)], shown,
                        inside: sx >= 0 && sy >= 0 && sx <= innerWidth && sy <= innerHeight,
                        what: el ? `${el.tagName}.${el.className}` : null});
        }
    }
    return {scale: ds.scale, corners: found};
}"""
LAPTOP = {"width": 1366, "height": 768}  # the smallest common screen the opening view must suit


def _overlap(a, b) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


@pytest.fixture(scope="module")
def editor(comfy, browser):
    page = browser.new_page(viewport=LAPTOP)
    page.goto(comfy.url)
    # the app object exists before the node definitions arrive from /object_info: wait for ours too
    ready = ("() => window.app && window.app.graph && window.LiteGraph && "
             "'Flux2KleinSampler' in window.LiteGraph.registered_node_types")  # fmt: skip
    page.wait_for_function(ready, timeout=120_000)
    # the editor's own start-up (its default graph) can still replace the first graph loaded: open one
    # until it stays, before the checks
    first = json.loads(EDITOR_WORKFLOWS[0].read_text(encoding="utf-8"))
    for _ in range(20):
        if page.evaluate(OPEN, first):
            break
        page.wait_for_timeout(500)
    yield page
    page.close()


@pytest.mark.parametrize("path", EDITOR_WORKFLOWS, ids=lambda p: p.stem)
def test_every_editor_workflow_opens_with_every_node_known(editor, path):
    workflow = json.loads(path.read_text(encoding="utf-8"))
    opened = {str(n["id"]): n for n in editor.evaluate(OPEN, workflow)}
    assert sorted(opened) == sorted(str(n["id"]) for n in workflow["nodes"]), path.name
    for node in workflow["nodes"]:
        shown = opened[str(node["id"])]
        where = f"{path.name} node {node['id']} ({node['type']})"
        assert shown["known"], f"{where}: the editor does not know this node type"
        # LoadImage's picture is the user's to choose: this server's input folder holds none of them
        if node["type"] != "LoadImage":
            assert not shown["error"], f"{where}: the editor marks it with an error"
        stored = node.get("widgets_values", [])
        if isinstance(stored, list) and node["type"] != "MarkdownNote":
            assert shown["widgets"][: len(stored)] == stored, where


@pytest.mark.parametrize("path", EDITOR_WORKFLOWS, ids=lambda p: p.stem)
def test_no_node_hides_another_and_group_titles_fit(editor, path):
    drawn = editor.evaluate(DRAWN, json.loads(path.read_text(encoding="utf-8")))
    nodes, groups = drawn["nodes"], drawn["groups"]
    clashes = [
        f"{a['type']} #{a['id']} and {b['type']} #{b['id']}"
        for i, a in enumerate(nodes)
        for b in nodes[i + 1 :]
        if _overlap(a["box"], b["box"])
    ]
    assert not clashes, f"{path.name}: overlapping nodes as drawn: {clashes}"
    for g in groups:
        assert g["title_width"] + 10 <= g["box"][2], f"{path.name}: group title {g['title']!r} overflows"
    clashes = [
        f"{a['title']} and {b['title']}"
        for i, a in enumerate(groups)
        for b in groups[i + 1 :]
        if _overlap(a["box"], b["box"])
    ]
    assert not clashes, f"{path.name}: overlapping groups: {clashes}"


@pytest.mark.parametrize("path", EDITOR_WORKFLOWS, ids=lambda p: p.stem)
def test_the_opening_view_shows_every_note_whole(editor, path):
    for _ in range(5):  # a new user's first start opens the template browser over the canvas: close it
        if not editor.locator("[role=dialog]").count():
            break
        editor.keyboard.press("Escape")
        editor.wait_for_timeout(200)
    seen = editor.evaluate(NOTE_CORNERS, json.loads(path.read_text(encoding="utf-8")))
    assert seen["scale"] >= 0.6, f"{path.name}: opens at {seen['scale']:.2f}x, too small to read the note"
    assert seen["corners"], f"{path.name}: no note"
    for corner in seen["corners"]:
        assert corner["inside"] and corner["shown"], f"{path.name}: a note corner is hidden: {corner}"


def test_the_builders_node_sizes_are_the_editors(editor):
    # the workflow builder lays nodes out at these sizes (scripts/record_node_sizes.py records them)
    sys.path.insert(0, str(REPO / "scripts" / "workflow_builder"))
    try:
        from sizes import MEASURE, MIN_SIZES  # the module alone: the builder's package imports the pack
    finally:
        sys.path.remove(str(REPO / "scripts" / "workflow_builder"))
    computed = editor.evaluate(MEASURE, sorted(MIN_SIZES))
    for node_type, (w, h) in computed.items():
        least = MIN_SIZES[node_type]
        assert w <= least[0] and h <= least[1], (
            f"{node_type}: the editor draws it at least {w}x{h}, the builder assumes {least}: run "
            "scripts/record_node_sizes.py"
        )
