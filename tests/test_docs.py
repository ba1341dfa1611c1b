"""The documentation's links: every relative link and image in the README, CONTRIBUTING.md and docs/ points to
a file that exists, every ``#anchor`` to a heading of its page, and the README stays short (it is also the
package's PyPI page: the details live in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [ROOT / "README.md", ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "results" / "README.md"]
    + list((ROOT / "docs").glob("**/*.md"))
)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
README_MAX_LINES = 270


def prose(text: str) -> str:
    """The page without its fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", prose(page.read_text("utf-8")), re.M)}


def broken_links(page: Path) -> list[str]:
    found = []
    for target in LINK.findall(prose(page.read_text("utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            if target.startswith(("http://", "https://")) and not re.match(r"^https?://[\w.-]+\.\w+", target):
                found.append(f"{target}: not a well-formed web address")
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            found.append(f"{target}: {path} does not exist")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            found.append(f"{target}: {linked.name} has no heading #{anchor}")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page):
    assert page.exists(), f"{page.relative_to(ROOT)} is missing"
    broken = broken_links(page)
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_every_doc_page_is_linked_from_the_readme_or_another_page():
    linked = set()
    for page in PAGES:
        for target in LINK.findall(prose(page.read_text("utf-8"))):
            if not re.match(r"^[a-z][a-z0-9+.-]*:", target) and target.partition("#")[0]:
                linked.add((page.parent / target.partition("#")[0]).resolve())
    # docs/node-help holds the hand-written parts of the node help pages: scripts/build_node_help.py makes the
    # pages (web/docs), which the editor's help panel shows
    pages = [p for p in (ROOT / "docs").glob("**/*.md") if "node-help" not in p.relative_to(ROOT).parts]
    orphans = [p.relative_to(ROOT) for p in pages if p.resolve() not in linked]
    assert not orphans, f"pages no other page links to: {orphans}"


def test_the_readme_is_short():
    lines = len((ROOT / "README.md").read_text("utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move details to docs/"


def test_the_link_check_finds_what_it_should(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading\n", "utf-8")
    page.write_text(
        "# Here\n[ok](there.md#a-heading) [self](#here) [gone](missing.md) [bad anchor](there.md#nope)\n"
        "```\n[in code](missing.md)\n```\n",
        "utf-8",
    )
    assert [b.split(":")[0] for b in broken_links(page)] == ["missing.md", "there.md#nope"]
