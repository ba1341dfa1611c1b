"""What a new user meets first in the real graph editor (headless Chromium): the template browser's section
of the pack with a thumbnail on every card, a node's help page in English and in Chinese, the Chinese node
names, and new nodes that show only what a first run needs (advanced inputs folded away in the editor's
Nodes 2.0 mode).

The editor's settings (locale, Nodes 2.0) live on the server: each test sets what it needs and puts the old
value back. Needs ``playwright`` and a Chromium; skipped with the reason without them.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from comfy_server import PACK_LINK
from node_contract import ADVANCED
from test_frontend import LAPTOP

REPO = Path(__file__).resolve().parents[2]
EDITOR_WORKFLOWS = sorted(p.stem for p in (REPO / "workflows").glob("*.json"))
READY = (
    "() => window.app && window.app.graph && window.LiteGraph && "
    "'Flux2KleinSampler' in window.LiteGraph.registered_node_types"
)
NEW_NODE = """([type, x, y]) => {
    const node = window.LiteGraph.createNode(type);
    node.pos = [x, y];
    window.app.graph.add(node);
    window.app.canvas.selectNode(node);
    window.app.canvas.setDirty(true, true);
    return node.id;
}"""
OPEN_INFO = """() => document.getElementById('vue-app').__vue_app__.config.globalProperties.$pinia
    ._s.get('rightSidePanel').openPanel('info')"""


def _setting(comfy, key: str, value=None):
    if value is None:
        with urllib.request.urlopen(f"{comfy.url}/api/settings/{key}", timeout=30) as response:
            return json.loads(response.read() or b"null")
    body = json.dumps(value).encode()
    urllib.request.urlopen(
        urllib.request.Request(f"{comfy.url}/api/settings/{key}", data=body, method="POST"), timeout=30
    ).read()


@pytest.fixture
def settings(comfy):
    """Set editor settings for one test; the old values come back after it."""
    saved = {}

    def put(key: str, value) -> None:
        saved.setdefault(key, _setting(comfy, key))
        _setting(comfy, key, value)

    yield put
    for key, value in saved.items():
        _setting(comfy, key, value if value is not None else False if key.endswith("Enabled") else "en")


def _editor(browser, comfy, responses: list | None = None):
    page = browser.new_context(viewport=LAPTOP).new_page()
    if responses is not None:
        page.on("response", lambda r: responses.append((r.status, r.url)))
    page.goto(comfy.url)
    page.wait_for_function(READY, timeout=120_000)
    page.wait_for_timeout(1000)
    for _ in range(5):  # a new user's first start opens the template browser
        if not page.locator("[role=dialog]").count():
            break
        page.keyboard.press("Escape")
        page.wait_for_timeout(300)
    return page


def test_the_template_browser_shows_the_pack_with_a_thumbnail_per_workflow(comfy, browser, settings):
    settings("Comfy.Locale", "en")
    listed = comfy.get_json("/api/workflow_templates")[PACK_LINK]
    assert sorted(listed) == EDITOR_WORKFLOWS  # the editor workflows only: no API file, no stray .json
    # the first-run workflows' old names are the same graphs as their title-like names: one card each
    cards_expected = sorted(set(EDITOR_WORKFLOWS) - {"flux2_klein_4b_text_to_image", "flux2_klein_4b_edit"})
    responses = []
    page = _editor(browser, comfy, responses)
    page.evaluate("() => window.app.extensionManager.command.execute('Comfy.BrowseTemplates')")
    section = page.get_by_text("FLUX.2 [klein]", exact=True)  # the section's name (locales/en/main.json)
    section.first.click()
    page.wait_for_timeout(2500)
    cards = page.locator("[data-testid^=template-workflow-]")
    for _ in range(40):  # the grid adds cards as the last ones scroll into view (slowly on a loaded machine)
        if cards.count() >= len(cards_expected):
            break
        cards.nth(cards.count() - 1).scroll_into_view_if_needed()
        page.wait_for_timeout(500)
    page.wait_for_timeout(500)  # no card beyond them either
    assert cards.count() == len(cards_expected)
    for i in range(cards.count()):  # the cards load their pictures as they scroll into view
        cards.nth(i).scroll_into_view_if_needed()
        page.wait_for_timeout(150)
    page.wait_for_timeout(1000)
    thumbnails = {
        urllib.parse.unquote(url.rsplit("/", 1)[1]): status
        for status, url in responses
        if f"/api/workflow_templates/{PACK_LINK}/" in url and url.endswith(".jpg")
    }
    assert thumbnails == {f"{name}.jpg": 200 for name in cards_expected}, thumbnails
    shown = page.evaluate(
        "() => Array.from(document.querySelectorAll('[role=dialog] img')).map((i) => i.currentSrc)"
    )
    assert shown and not [src for src in shown if "default-template" in src], "a card shows the placeholder"
    page.context.close()


@pytest.mark.parametrize(("locale", "heading"), [("en", "What it is for"), ("zh", "用途")])
def test_the_help_panel_shows_the_nodes_page(comfy, browser, settings, locale, heading):
    settings("Comfy.Locale", locale)
    responses = []
    page = _editor(browser, comfy, responses)
    page.evaluate(NEW_NODE, ["Flux2KleinSampler", 100, 100])
    page.evaluate(OPEN_INFO)
    page.get_by_role("heading", name=heading).first.wait_for(timeout=30_000)
    docs = [(status, url.split("/extensions/", 1)[1]) for status, url in responses if "/docs/" in url]
    # the panel asks docs/<NodeId>/<locale>.md first: the page is there, so no request fails
    assert docs and docs[0] == (200, f"{PACK_LINK}/docs/Flux2KleinSampler/{locale}.md"), docs
    assert all(status == 200 for status, _ in docs), docs
    text = page.locator("body").inner_text()
    for inp in ("steps", "guidance", "references"):  # the generated input table, with the ids
        assert inp in text
    if locale == "zh":
        assert "FLUX.2 采样器" in text and "常见错误" in text
    page.context.close()


def test_the_chinese_locale_names_the_nodes_their_inputs_and_categories(comfy, browser, settings):
    settings("Comfy.Locale", "zh")
    page = _editor(browser, comfy)
    node_id = page.evaluate(NEW_NODE, ["Flux2KleinSampler", 100, 100])
    shown = page.evaluate(
        """(id) => {
            const node = window.app.graph.getNodeById(id);
            return {title: node.title, widgets: node.widgets.map((w) => w.label ?? w.name),
                    inputs: node.inputs.map((i) => i.localized_name ?? i.label ?? i.name)};
        }""",
        node_id,
    )
    assert shown["title"] == "FLUX.2 采样器"
    assert "步数" in shown["widgets"] and "种子" in shown["widgets"]
    assert "模型" in shown["inputs"] and "参考图" in shown["inputs"]
    category = page.evaluate(
        """() => document.getElementById('vue-app').__vue_app__.config.globalProperties.$pinia
            ._s.get('nodeDef').nodeDefsByName['Flux2KleinModelLoader'].category"""
    )
    assert category == "FLUX.2 [klein]/加载器"  # flux2_klein/loaders, each segment through nodeCategories
    page.context.close()


def test_new_nodes_show_only_what_a_first_run_needs(comfy, browser, settings):
    # Nodes 2.0 (the editor's Vue nodes) folds advanced inputs away behind "Show advanced inputs"; the classic
    # canvas draws every widget, each flagged
    settings("Comfy.Locale", "en")
    settings("Comfy.VueNodes.Enabled", True)
    page = _editor(browser, comfy)
    page.evaluate(
        "() => { window.app.graph.clear(); window.app.canvas.ds.scale = 1; "
        "window.app.canvas.ds.offset = [0, 0]; }"
    )  # clear of the minimap (bottom right)
    for node_type, x in (("Flux2KleinModelLoader", 80), ("Flux2KleinSampler", 480)):
        node_id = page.evaluate(NEW_NODE, [node_type, x, 60])
        node = page.locator(f"[data-node-id='{node_id}']")
        node.wait_for(timeout=30_000)
        text = node.inner_text()
        for name in ADVANCED[node_type]:
            assert name not in text, f"{node_type}: the advanced input {name} shows on a new node"
        assert "Show advanced inputs" in text
        node.get_by_text("Show advanced inputs").click()
        page.wait_for_timeout(500)
        opened = node.inner_text()
        assert all(name in opened for name in ADVANCED[node_type]), opened
    page.context.close()
    settings("Comfy.VueNodes.Enabled", False)
    page = _editor(browser, comfy)
    flags = page.evaluate(
        """(type) => { const node = window.LiteGraph.createNode(type);
            return node.widgets.filter((w) => w.options?.advanced).map((w) => w.name); }""",
        "Flux2KleinModelLoader",
    )
    assert tuple(flags) == ADVANCED["Flux2KleinModelLoader"]
    page.context.close()
