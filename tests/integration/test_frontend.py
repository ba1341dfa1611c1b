"""Every bundled editor workflow opened in the graph editor the real server serves (headless Chromium): every
node type is one the editor knows, no node but LoadImage (whose picture is the user's) is marked with an error
(a missing model file, an unknown combo value, an input the node no longer has), and every widget shows the
value the file stores.

Needs the Python package ``playwright`` and a Chromium (``/usr/bin/chromium``, or ``CHROMIUM`` naming
one); without them the test is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import shutil
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


@pytest.fixture(scope="module")
def editor(comfy):
    sync_api = pytest.importorskip("playwright.sync_api", reason="the frontend check needs playwright")
    if not CHROMIUM:
        pytest.skip("no Chromium found (install chromium or set CHROMIUM): the frontend check needs one")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = browser.new_page()
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
        browser.close()


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
