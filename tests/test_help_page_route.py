"""The pack's route for the help panel's first request (nodes/help_pages.py): which page it answers, without a
server. On a real core, in every language: tests/integration/test_help_page_server.py."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "nodes" / "help_pages.py"
spec = importlib.util.spec_from_file_location("help_pages", SOURCE)
help_pages = importlib.util.module_from_spec(spec)
spec.loader.exec_module(help_pages)
DOCS = REPO / "web" / "docs"


def test_the_editors_language_else_english():
    assert help_pages.page(DOCS, "Flux2KleinSampler", "en") == DOCS / "Flux2KleinSampler" / "en.md"
    assert help_pages.page(DOCS, "Flux2KleinSampler", "zh") == DOCS / "Flux2KleinSampler" / "zh.md"
    for locale in ("ja", "fr", "ru", "ko", "es", "zh-TW", "pt-BR"):
        assert help_pages.page(DOCS, "Flux2KleinSampler", locale) == DOCS / "Flux2KleinSampler.md", locale
    english = (DOCS / "Flux2KleinSampler.md").read_text(encoding="utf-8")
    assert english == (DOCS / "Flux2KleinSampler" / "en.md").read_text(encoding="utf-8")


def test_every_node_with_a_page_is_answered_in_any_language():
    nodes = sorted(p.stem for p in DOCS.glob("*.md"))
    assert len(nodes) >= 20
    assert all(help_pages.page(DOCS, node, "ja") == DOCS / f"{node}.md" for node in nodes)


def test_nothing_outside_the_pages_is_served(tmp_path):
    (tmp_path / "Node.md").write_text("# Node")
    (tmp_path / "secret.md").write_text("no")
    assert help_pages.page(tmp_path, "Node", "ja") == tmp_path / "Node.md"
    refused = [("Missing", "en"), ("../secret", "en"), ("Node", "../../secret"), ("Node/..", "en"),
               (".", "en"), ("Node", ""), ("Node", "e"), ("Node", "en/../x"), ("", "en")]  # fmt: skip
    for node, locale in refused:
        assert help_pages.page(tmp_path, node, locale) is None, (node, locale)


def test_the_route_is_the_packs_help_pages_only():
    assert (
        help_pages.route_path("comfyui-flux2-klein")
        == "/extensions/comfyui-flux2-klein/docs/{node}/{locale}.md"
    )
