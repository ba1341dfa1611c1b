"""The help panel's first request answered on the real server (ComfyUI 0.29) in any editor language
(nodes/help_pages.py): the pack's page in that language, else the English page, never a 404 for a node with
a page; every other file of the pack's web folder still served by the core's static route."""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from comfy_server import PACK_LINK

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "web" / "docs"


def _get(comfy, path: str) -> tuple[int, str, str]:
    url = f"{comfy.url}/extensions/{urllib.parse.quote(PACK_LINK)}/{path}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return response.status, response.headers.get("Content-Type", ""), response.read().decode("utf-8")
    except urllib.error.HTTPError as error:
        return error.code, "", ""


@pytest.mark.parametrize(
    "locale, page",
    [("en", "Flux2KleinSampler/en.md"), ("zh", "Flux2KleinSampler/zh.md"), ("ja", "Flux2KleinSampler.md"),
     ("fr", "Flux2KleinSampler.md"), ("zh-TW", "Flux2KleinSampler.md"), ("pt-BR", "Flux2KleinSampler.md")],
)  # fmt: skip
def test_the_first_request_is_the_page_in_any_language(comfy, locale, page):
    status, kind, text = _get(comfy, f"docs/Flux2KleinSampler/{locale}.md")
    assert status == 200 and kind.startswith("text/markdown"), (locale, status, kind)
    assert text == (DOCS / page).read_text(encoding="utf-8"), locale


def test_every_node_is_answered_in_a_language_the_pack_has_no_pages_in(comfy):
    nodes = sorted(p.stem for p in DOCS.glob("*.md"))
    for node in nodes:
        status, _, text = _get(comfy, f"docs/{node}/ko.md")
        assert status == 200 and text == (DOCS / f"{node}.md").read_text(encoding="utf-8"), node


def test_no_page_no_answer_and_the_rest_of_the_folder_is_the_cores(comfy):
    assert _get(comfy, "docs/NoSuchNode/ja.md")[0] == 404
    assert _get(comfy, "docs/..%2F..%2F__init__/ja.md")[0] == 404
    status, _, text = _get(comfy, "docs/Flux2KleinSampler.md")
    assert status == 200 and text == (DOCS / "Flux2KleinSampler.md").read_text(encoding="utf-8")
    status, _, text = _get(comfy, "template_order.js")
    assert status == 200 and text == (REPO / "web" / "template_order.js").read_text(encoding="utf-8")
