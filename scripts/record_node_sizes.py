"""Record the size ComfyUI's graph editor draws each node type at, for the workflow builder.

    python scripts/record_node_sizes.py --url http://127.0.0.1:8188   # a running ComfyUI with this pack

The editor enlarges a node to the room its inputs and widgets need (every optional widget shown, advanced ones
included), whatever size the file stores; ``--merge`` keeps the larger of two editor versions' sizes.
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workflow_builder.schemas import NODE_SPECS  # noqa: E402  (the package beside this script)
from workflow_builder.sizes import MEASURE, READY, SIZES_FILE  # noqa: E402

# Flags for a headless Chromium on a machine with no network but loopback (no background connections).
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def chromium() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def measure(page) -> dict[str, list[int]]:
    """{node type: [width, height]} for every node type the workflows use, from an open editor page."""
    page.wait_for_function(READY, timeout=120_000)
    return page.evaluate(MEASURE, sorted(NODE_SPECS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url", required=True, help="a running ComfyUI with this pack, e.g. http://127.0.0.1:8188"
    )
    parser.add_argument(
        "--merge", action="store_true", help="keep the larger of each recorded size and this editor's"
    )
    args = parser.parse_args(argv)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=CHROMIUM_FLAGS)
        page = browser.new_page()
        page.goto(args.url)
        sizes = measure(page)
        version = page.evaluate("() => window.__COMFYUI_FRONTEND_VERSION__ ?? null")
        browser.close()
    if args.merge and SIZES_FILE.exists():
        before = json.loads(SIZES_FILE.read_text(encoding="utf-8"))
        for node_type, (w, h) in before["sizes"].items():
            mine = sizes.get(node_type, [0, 0])
            sizes[node_type] = [max(w, mine[0]), max(h, mine[1])]
        versions = sorted(set(filter(None, str(before.get("frontend") or "").split(", "))) | {version})
        version = ", ".join(versions)
    rows = ",\n".join(f"    {json.dumps(k)}: {json.dumps(sizes[k])}" for k in sorted(sizes))
    SIZES_FILE.write_text(
        f'{{\n  "frontend": {json.dumps(version)},\n  "sizes": {{\n{rows}\n  }}\n}}\n', encoding="utf-8"
    )
    print(f"wrote {SIZES_FILE} (frontend {version}, {len(sizes)} node types)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
