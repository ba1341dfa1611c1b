"""Record the size ComfyUI's graph editor draws each node type at, for the workflow builder.

    python scripts/record_node_sizes.py --url http://127.0.0.1:8188   # a running ComfyUI with this pack

The editor enlarges a node to the room its inputs and widgets need (every optional widget shown, advanced ones
included), whatever size the file stores; in Nodes 2.0 each node is a page element with a least size of its
own (recorded with its header, with Nodes 2.0 switched on for the measurement and back off after it), and
the room it keeps beside a combo's value. With them: each widget's label and number precision, and the
advance of each character in the canvas's fonts, so the builder can make every node wide enough that no
label, value or title is cut. ``--merge`` keeps the larger of two editor versions' figures (and of two
input folders': a Load Image is drawn taller in Nodes 2.0 with no picture to show than with one).
The builder lays the bundled workflows out with these sizes, so no
node hides another once drawn (``workflow_builder/node_sizes.json``). Needs ``playwright`` and a Chromium;
the integration tests check the recorded sizes against the editor the server serves
(tests/integration/test_frontend.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workflow_builder.schemas import NODE_SPECS  # noqa: E402  (the package beside this script)
from workflow_builder.sizes import MEASURE, MEASURE_TEXT, MEASURE_VUE, READY, SIZES_FILE  # noqa: E402

# Flags for a headless Chromium on a machine with no network but loopback (no background connections).
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def chromium() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def measure(page) -> dict[str, list[int]]:
    """{node type: [width, height]} for every node type the workflows use, from an open editor page."""
    page.wait_for_function(READY, timeout=120_000)
    return page.evaluate(MEASURE, sorted(NODE_SPECS))


def setting(url: str, key: str, value=None):
    if value is None:
        with urllib.request.urlopen(f"{url}/api/settings/{key}", timeout=30) as response:
            return json.loads(response.read() or b"null")
    body = json.dumps(value).encode()
    urllib.request.urlopen(
        urllib.request.Request(f"{url}/api/settings/{key}", data=body, method="POST"), timeout=30
    ).read()


def measure_vue(browser, url: str) -> dict:
    """{"sizes": {node type: [width, height]} of each node's Nodes 2.0 element, its header included,
    "open": the same with its advanced inputs shown (a node that has some), "rooms": {node type: the width
    its combos' values do not get}}."""
    before = setting(url, "Comfy.VueNodes.Enabled")
    setting(url, "Comfy.VueNodes.Enabled", True)
    try:
        page = browser.new_page(viewport={"width": 1920, "height": 1080})
        page.goto(url)
        page.wait_for_function(READY, timeout=120_000)
        page.wait_for_timeout(1000)
        for _ in range(5):  # a new user's first start opens the template browser
            if not page.locator("[role=dialog]").count():
                break
            page.keyboard.press("Escape")
            page.wait_for_timeout(300)
        return page.evaluate(MEASURE_VUE, sorted(NODE_SPECS))
    finally:
        setting(url, "Comfy.VueNodes.Enabled", bool(before))


def merge(before: dict, mine: dict) -> None:
    """Keep in ``mine`` the larger of each figure recorded ``before`` (another editor version) and its own."""
    for table in ("sizes", "vue", "vue_open"):
        for node_type, (w, h) in before.get(table, {}).items():
            new = mine[table].get(node_type, [0, 0])
            mine[table][node_type] = [max(w, new[0]), max(h, new[1])]
    for node_type, room in before.get("vue_rooms", {}).items():
        mine["vue_rooms"][node_type] = max(room, mine["vue_rooms"].get(node_type, 0))
    for font, recorded in before.get("fonts", {}).items():
        advance = mine["fonts"].setdefault(font, recorded)["advance"]
        for ch, width in recorded["advance"].items():
            advance[ch] = max(width, advance.get(ch, 0))
    for node_type, widgets in before.get("widgets", {}).items():
        for name, (label, precision) in widgets.items():
            mine_label, mine_precision = (
                mine["widgets"].setdefault(node_type, {}).get(name, [label, precision])
            )
            precisions = [p for p in (precision, mine_precision) if p is not None]
            mine["widgets"][node_type][name] = [
                max(label, mine_label, key=len),
                max(precisions, default=None),
            ]


def write(recorded: dict, version: str) -> None:
    def table(figures: dict) -> str:
        return ",\n".join(f"    {json.dumps(k)}: {json.dumps(figures[k])}" for k in sorted(figures))

    fonts = {name: {"font": f["font"], "advance": f["advance"]} for name, f in recorded["fonts"].items()}
    SIZES_FILE.write_text(
        f'{{\n  "frontend": {json.dumps(version)},\n'
        f'  "sizes": {{\n{table(recorded["sizes"])}\n  }},\n'
        f'  "vue": {{\n{table(recorded["vue"])}\n  }},\n'
        f'  "vue_open": {{\n{table(recorded["vue_open"])}\n  }},\n'
        f'  "vue_rooms": {{\n{table(recorded["vue_rooms"])}\n  }},\n'
        f'  "widgets": {{\n{table(recorded["widgets"])}\n  }},\n'
        f'  "fonts": {{\n{table(fonts)}\n  }}\n}}\n',
        encoding="utf-8",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", required=True, help="a running ComfyUI with this pack, e.g. http://127.0.0.1:8188"
    )
    parser.add_argument(
        "--merge", action="store_true", help="keep the larger of each recorded figure and this editor's"
    )
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS)
        page = browser.new_page()
        page.goto(args.url)
        sizes = measure(page)
        text = page.evaluate(MEASURE_TEXT, sorted(NODE_SPECS))
        version = page.evaluate("() => window.__COMFYUI_FRONTEND_VERSION__ ?? null")
        vue = measure_vue(browser, args.url)
        browser.close()
    recorded = {
        "sizes": sizes,
        "vue": vue["sizes"],
        "vue_open": vue["open"],
        "vue_rooms": vue["rooms"],
        **text,
    }
    if args.merge and SIZES_FILE.exists():
        before = json.loads(SIZES_FILE.read_text(encoding="utf-8"))
        merge(before, recorded)
        versions = sorted(set(filter(None, str(before.get("frontend") or "").split(", "))) | {version})
        version = ", ".join(versions)
    write(recorded, version)
    print(f"wrote {SIZES_FILE} (frontend {version}, {len(sizes)} node types)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
