"""Pictures of the pack in ComfyUI's graph editor: the template cards' thumbnails and the docs' screenshots.

    python scripts/frontend_pictures.py --url http://127.0.0.1:8188

against a running ComfyUI with this pack in ``custom_nodes`` under the folder name ``comfyui-flux2-klein``,
the model files the workflows name in its model folders (empty files are enough: the editor only checks the
names) and an ``example.png`` in its input folder. It writes:

* ``workflows/<name>.jpg`` for every bundled editor workflow: a band in the colour of its model (klein 4B,
  4B base, 9B-KV, FLUX.2 [dev], FLUX.1 Fill) with what it does in large letters, above the whole graph as the
  editor draws it, so the cards tell the workflows apart at a glance. The template browser shows it on the
  workflow's card (it asks the server for ``/api/workflow_templates/<pack folder>/<name>.jpg``).
* ``docs/images/*.png``: workflows as they open, the template browser's section of the pack, a node's help
  page in English and Chinese, the Chinese node names, and a new Model Loader and Sampler in the editor's
  Nodes 2.0 mode (advanced inputs folded away).

Needs ``playwright`` and a Chromium (``CHROMIUM`` or ``chromium`` on the PATH). It changes the editor's
settings on that server (locale, Nodes 2.0) and puts them back.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = REPO / "workflows"
IMAGES = REPO / "docs" / "images"
PACK = "comfyui-flux2-klein"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip
READY = (
    "() => window.app && window.app.graph && window.LiteGraph && "
    "'Flux2KleinSampler' in window.LiteGraph.registered_node_types"
)
THUMBNAIL = (800, 600)  # the cards show a 4:3 crop of it
BAND = 250  # px of the thumbnail's top: the model and what the workflow does, in letters a card shows
FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf"  # any bold TrueType font; PIL's own without it
MODEL_COLOURS = (  # (words in the workflow's title, its band's label, colour): the first that matches
    ("FLUX.1", "FLUX.1 Fill [dev]", "#5b5b66"),
    ("[dev]", "FLUX.2 [dev]", "#1f5fa8"),
    ("9B", "FLUX.2 [klein] 9B", "#6b3fa0"),
    ("base", "FLUX.2 [klein] 4B base", "#a8641c"),
    ("", "FLUX.2 [klein] 4B", "#23804a"),
)
RENDER = {"width": 1920, "height": 1440}  # drawn large enough for the editor to draw text, then scaled down
SCREEN = {"width": 1366, "height": 768}
README_WORKFLOWS = (
    "flux2_klein_4b_text_to_image", "flux2_klein_4b_edit", "flux2_klein_4b_multi_reference_edit"
)  # fmt: skip

# Open a workflow, quietly (no missing-file dialogs), and fit the whole graph into the canvas.
OPEN_FITTED = """async ([workflow, margin]) => {
    const quiet = {showMissingModelsDialog: false, showMissingNodesDialog: false};
    await window.app.loadGraphData(workflow, true, true, workflow.id, quiet);
    const canvas = window.app.canvas;
    canvas.show_info = false;
    const boxes = (window.app.graph.nodes ?? window.app.graph._nodes).map((n) => n.boundingRect)
        .concat((window.app.graph.groups ?? window.app.graph._groups).map((g) => g._bounding));
    const x0 = Math.min(...boxes.map((b) => b[0])), y0 = Math.min(...boxes.map((b) => b[1]));
    const x1 = Math.max(...boxes.map((b) => b[0] + b[2])), y1 = Math.max(...boxes.map((b) => b[1] + b[3]));
    const rect = canvas.canvas.getBoundingClientRect();
    const scale = Math.min((rect.width - 2 * margin) / (x1 - x0), (rect.height - 2 * margin) / (y1 - y0));
    canvas.ds.scale = scale;
    canvas.ds.offset = [(rect.width / scale - (x1 - x0)) / 2 - x0,
                        (rect.height / scale - (y1 - y0)) / 2 - y0];
    canvas.setDirty(true, true);
    canvas.draw(true, true);
}"""
OPEN_AS_SAVED = """async (workflow) => {
    const quiet = {showMissingModelsDialog: false, showMissingNodesDialog: false};
    await window.app.loadGraphData(workflow, true, true, workflow.id, quiet);
    window.app.canvas.setDirty(true, true);
    window.app.canvas.draw(true, true);
}"""
# Hide whatever the page lays over the canvas (menus, sidebar, toolbars, minimap, tabs): every element but the
# canvas, its ancestors and the nodes' DOM widgets (note and prompt text).
HIDE_OVERLAYS = """() => {
    const canvas = window.app.canvas.canvas;
    for (const el of document.body.querySelectorAll('*')) {
        if (el.contains(canvas) || el.closest('.dom-widget') || el.querySelector('.dom-widget')) continue;
        el.style.visibility = 'hidden';
    }
}"""
# The right side panel's Info tab of the selected node (the frontend's pinia store "rightSidePanel").
OPEN_INFO = """() => document.getElementById('vue-app').__vue_app__.config.globalProperties.$pinia
    ._s.get('rightSidePanel').openPanel('info')"""
SHOW_OVERLAYS = """() => { for (const el of document.querySelectorAll('[style*="visibility: hidden"]'))
    el.style.visibility = ''; }"""


def chromium() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def store_setting(url: str, key: str, value) -> None:
    body = json.dumps(value).encode()
    request = urllib.request.Request(f"{url}/api/settings/{key}", data=body, method="POST")
    urllib.request.urlopen(request, timeout=30).read()


def setting(url: str, key: str):
    with urllib.request.urlopen(f"{url}/api/settings/{key}", timeout=30) as response:
        return json.loads(response.read() or b"null")


def open_editor(page, url: str) -> None:
    page.goto(url)
    page.wait_for_function(READY, timeout=120_000)
    page.wait_for_timeout(1000)
    close_dialogs(page)


def close_dialogs(page) -> None:
    """A new user's first start opens the template browser over the canvas."""
    for _ in range(5):
        if not page.locator("[role=dialog]").count():
            return
        page.keyboard.press("Escape")
        page.wait_for_timeout(300)


def band_label(title: str) -> tuple[str, str, str]:
    """(model, what it does, colour) of a workflow from its note's title ("FLUX.2 [klein] 4B: edit ...")."""
    head, _, task = title.rpartition(": ")
    if not head:  # "FLUX.2 [klein] 4B base in native sampling nodes, ...": what follows the model's name
        head, task = title, title.removeprefix("FLUX.2 [klein] 4B ").removeprefix("base ")
    for words, model, colour in MODEL_COLOURS:
        if words in head:
            return model, task, colour
    raise AssertionError("the last entry matches every title")


def _font(size: int):
    from PIL import ImageFont

    return ImageFont.truetype(FONT, size) if Path(FONT).exists() else ImageFont.load_default(size)


def _wrapped(draw, text: str, font, width: int) -> list[str]:
    lines = [""]
    for word in text.split():
        candidate = f"{lines[-1]} {word}".strip()
        if draw.textlength(candidate, font=font) <= width or not lines[-1]:
            lines[-1] = candidate
        else:
            lines.append(word)
    return lines


def card_picture(graph, title: str):
    """The card's picture: the band (model, what the workflow does) above the graph's picture."""
    from PIL import Image, ImageDraw

    card = Image.new("RGB", THUMBNAIL, "#161616")
    model, task, colour = band_label(title)
    draw = ImageDraw.Draw(card)
    draw.rectangle((0, 0, THUMBNAIL[0], BAND), fill=colour)
    draw.text((36, 26), model, font=_font(40), fill="#ffffff")
    for size in (62, 52, 44, 38):  # the largest letters that say it in two lines
        big = _font(size)
        lines = _wrapped(draw, task, big, THUMBNAIL[0] - 72)
        if len(lines) <= 2:
            break
    for i, line in enumerate(lines[:2]):
        draw.text((36, 92 + (size + 10) * i), line, font=big, fill="#ffffff")
    room = (THUMBNAIL[0] - 32, THUMBNAIL[1] - BAND - 24)
    graph = graph.convert("RGB")
    graph.thumbnail(room, Image.LANCZOS)
    card.paste(graph, ((THUMBNAIL[0] - graph.width) // 2, BAND + 12 + (room[1] - graph.height) // 2))
    return card


def thumbnails(page) -> list[Path]:
    from PIL import Image

    page.set_viewport_size(RENDER)
    written = []
    for path in sorted(WORKFLOWS.glob("*.json")):
        workflow = json.loads(path.read_text(encoding="utf-8"))
        page.evaluate(OPEN_FITTED, [workflow, 16])
        page.wait_for_timeout(600)
        page.evaluate(HIDE_OVERLAYS)
        page.wait_for_timeout(300)
        page.evaluate(HIDE_OVERLAYS)
        target = path.with_suffix(".jpg")
        page.screenshot(path=str(target), type="png")
        note = next(n for n in workflow["nodes"] if n["type"] == "MarkdownNote")["widgets_values"][0]
        with Image.open(target) as shot:
            card_picture(shot, note.splitlines()[0].removeprefix("# ")).save(target, "JPEG", quality=85)
        page.evaluate(SHOW_OVERLAYS)
        written.append(target)
    return written


def workflow_screens(page) -> list[Path]:
    page.set_viewport_size(SCREEN)
    written = []
    for name in README_WORKFLOWS:
        page.evaluate(OPEN_AS_SAVED, json.loads((WORKFLOWS / f"{name}.json").read_text(encoding="utf-8")))
        page.wait_for_timeout(600)
        written.append(IMAGES / f"{name}.png")
        page.screenshot(path=str(written[-1]))
    return written


def template_browser(page) -> Path:
    page.evaluate("() => window.app.extensionManager.command.execute('Comfy.BrowseTemplates')")
    page.get_by_text("FLUX.2 [klein]", exact=True).first.click()
    page.wait_for_timeout(2500)
    target = IMAGES / "template_browser.png"
    page.screenshot(path=str(target))
    close_dialogs(page)
    return target


def help_page(page, node_type: str, name: str) -> Path:
    """A new node, selected, its help in the right side panel's Info tab."""
    page.evaluate(
        """(type) => {
            window.app.graph.clear();
            const node = window.LiteGraph.createNode(type);
            node.pos = [120, 120];
            window.app.graph.add(node);
            window.app.canvas.selectNode(node);
            window.app.canvas.ds.scale = 1; window.app.canvas.ds.offset = [0, 0];
            window.app.canvas.setDirty(true, true);
        }""",
        node_type,
    )
    page.evaluate(OPEN_INFO)
    page.wait_for_timeout(2000)
    target = IMAGES / name
    page.screenshot(path=str(target))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a running ComfyUI with this pack")
    parser.add_argument("--only", choices=("thumbnails", "screens"), help="make only one kind of picture")
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    locale, vue = setting(args.url, "Comfy.Locale"), setting(args.url, "Comfy.VueNodes.Enabled")
    written = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS)

            def fresh_page():  # a new browser context: no workflow tabs left open by the pictures before
                page = browser.new_context(viewport=SCREEN).new_page()
                open_editor(page, args.url)
                return page

            store_setting(args.url, "Comfy.Locale", "en")
            store_setting(args.url, "Comfy.VueNodes.Enabled", False)
            if args.only != "screens":
                written += thumbnails(fresh_page())
            if args.only != "thumbnails":
                written += workflow_screens(fresh_page())
                written.append(template_browser(fresh_page()))
                written.append(help_page(fresh_page(), "Flux2KleinSampler", "help_panel_en.png"))
                store_setting(args.url, "Comfy.Locale", "zh")
                written.append(help_page(fresh_page(), "Flux2KleinSampler", "help_panel_zh.png"))
                store_setting(args.url, "Comfy.Locale", "en")
                store_setting(args.url, "Comfy.VueNodes.Enabled", True)
                page = fresh_page()
                page.evaluate(
                    """() => {
                        window.app.graph.clear();
                        for (const [type, x] of [["Flux2KleinModelLoader", 80], ["Flux2KleinSampler", 560]]) {
                            const node = window.LiteGraph.createNode(type);
                            const model = node.widgets.find((w) => w.name === "model_name");
                            const file = "flux-2-klein-4b.safetensors";  // the first-run model
                            if (model && model.options.values.includes(file)) model.value = file;
                            node.pos = [x, 140];
                            window.app.graph.add(node);
                        }
                        window.app.canvas.ds.scale = 1; window.app.canvas.ds.offset = [0, 0];
                        window.app.canvas.setDirty(true, true);
                    }"""
                )
                page.wait_for_timeout(1500)
                written.append(IMAGES / "new_nodes_small.png")
                page.screenshot(path=str(written[-1]))
            browser.close()
    finally:
        store_setting(args.url, "Comfy.Locale", locale or "en")
        store_setting(args.url, "Comfy.VueNodes.Enabled", bool(vue))
    for path in written:
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
