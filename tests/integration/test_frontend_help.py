"""Every node's help page in the real editor (headless Chromium, a 1366x768 window), in English and Chinese,
and in Japanese (a language the pack has no pages in: the English page): the help panel's first request is
the page (no 404 before a fallback), and the page fits the panel (about 235 px wide there): no element nor
line of text runs past its right edge.

COMFYUI_FRONTEND_ROOT runs it under another frontend build (1.47.10 is ComfyUI 0.29's, 1.58.1 was checked
too). Needs ``playwright`` and a Chromium; skipped with the reason without them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from comfy_server import PACK_LINK
from test_frontend_pack import NEW_NODE, OPEN_INFO, _editor, settings  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[2]
NODES = sorted(p.stem for p in (REPO / "docs" / "node-help" / "en").glob("*.md"))  # a page per node
# The help panel's page: the element around its title (the node's name, the only h1 in the right panel).
WIDTHS = """() => {
    const title = [...document.querySelectorAll('h1')].filter(
        (h) => h.offsetParent && h.getBoundingClientRect().left > window.innerWidth / 2)[0];
    if (!title) return null;
    const page = title.parentElement, box = page.getBoundingClientRect();
    let right = box.right, widest = '';
    for (const el of page.querySelectorAll('*')) {
        const r = el.getBoundingClientRect();
        if (r.right > right) { right = r.right; widest = el.tagName + ' ' + el.textContent.slice(0, 60); }
    }
    const walk = document.createTreeWalker(page, NodeFilter.SHOW_TEXT);
    for (let text = walk.nextNode(); text; text = walk.nextNode()) {
        const range = document.createRange();
        range.selectNodeContents(text);
        for (const r of range.getClientRects())
            if (r.right > right) { right = r.right; widest = text.textContent.slice(0, 60); }
    }
    return {width: box.width, overflow: right - box.right, scroll: page.scrollWidth - page.clientWidth,
            widest, title: title.textContent};
}"""


@pytest.mark.parametrize("locale", ["en", "zh", "ja"])
def test_every_nodes_help_is_asked_where_it_is_and_fits_the_panel(comfy, browser, settings, locale):  # noqa: F811  (settings)
    settings("Comfy.Locale", locale)
    responses = []
    page = _editor(browser, comfy, responses)
    problems = []
    for node_type in NODES:
        responses.clear()
        page.evaluate("() => window.app.graph.clear()")
        page.evaluate(NEW_NODE, [node_type, 100, 100])
        page.evaluate(OPEN_INFO)
        for _ in range(150):  # the page arrives, then the panel renders it
            if any(f"/docs/{node_type}" in url and status == 200 for status, url in responses):
                break
            page.wait_for_timeout(200)
        page.wait_for_timeout(800)
        docs = [(status, url.split("/extensions/", 1)[1]) for status, url in responses if "/docs/" in url]
        if docs[:1] != [(200, f"{PACK_LINK}/docs/{node_type}/{locale}.md")] or len(docs) != 1:
            problems.append((node_type, "requests", docs))
        shown = page.evaluate(WIDTHS)
        if shown["overflow"] > 1 or shown["scroll"] > 1:
            problems.append((node_type, "wider than the panel", shown))
    page.context.close()
    assert not problems, problems
