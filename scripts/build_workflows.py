"""Generate every bundled workflow, in both ComfyUI formats, from one description.

    python scripts/build_workflows.py          # (re)write workflows/*.json and workflows/api/*.json
    python scripts/build_workflows.py --check  # exit 1 if the files on disk differ from what it makes

Each workflow is described once, as a small graph (nodes, widget values, links). From that graph the script
writes:

* ``workflows/<name>.json``: the graph-editor format (version 0.4) that ComfyUI's frontend saves and loads,
  with a Markdown note saying what the workflow does, which file goes into which model folder and the
  recommended settings. The seed's ``control_after_generate`` value is "randomize".
* ``workflows/api/<name>.json``: the API format that ``POST /prompt`` accepts as-is
  (``{node_id: {"class_type", "inputs", "_meta"}}``, links as ``[node_id, output_slot]``). Notes are not part
  of it (they are frontend-only), and the seed is fixed so that runs are reproducible.
* ``docs/workflows.md``: what each workflow's short note leaves out (settings, alternatives, headless use).
* ``web/template_order.js``: the order of the template browser's cards (``workflow_builder/templates.py``).

Both come from the same graph, so they cannot drift apart, and the pack's node schemas come from the node
classes themselves (``workflow_builder/schemas.py``), so neither can drift from the nodes;
tests/workflows/test_workflows.py regenerates them in memory and compares them with the committed files.
"""

from __future__ import annotations

import argparse
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workflow_builder.fill import FILL_RECIPES, build_fill  # noqa: E402  (the package beside this script)
from workflow_builder.flux2 import build  # noqa: E402
from workflow_builder.flux2_recipes import RECIPES  # noqa: E402
from workflow_builder.formats import WORKFLOW_ID, render, to_api, to_editor  # noqa: E402
from workflow_builder.schemas import FILES, NODE_SPECS, REPO  # noqa: E402, F401  (FILES: read by the tests)
from workflow_builder.templates import ALIASES, details_page, order_script  # noqa: E402

WORKFLOW_DIR = REPO / "workflows"
API_DIR = WORKFLOW_DIR / "api"
DETAILS = REPO / "docs" / "workflows.md"
ORDER_SCRIPT = REPO / "web" / "template_order.js"


def graphs() -> list:
    return [build(r) for r in RECIPES] + [build_fill(r) for r in FILL_RECIPES]


def build_all() -> dict[str, tuple[dict, dict]]:
    """{name: (editor workflow, API workflow)} for every bundled workflow."""
    return {g.name: (to_editor(g), to_api(g)) for g in graphs()}


def expected_files() -> dict[Path, str]:
    """Every file the script writes: both formats of each workflow, the second names of the first-run
    workflows (``templates.ALIASES``: the same editor workflow under another name and id; its API format is
    the original's), the details page and the template order."""
    files = {}
    made = graphs()
    built = {g.name: (to_editor(g), to_api(g)) for g in made}
    for name, (editor, api) in built.items():
        files[WORKFLOW_DIR / f"{name}.json"] = render(editor)
        files[API_DIR / f"{name}.json"] = render(api)
    for alias, name in ALIASES.items():
        editor = {**built[name][0], "id": str(uuid.uuid5(uuid.NAMESPACE_URL, WORKFLOW_ID + alias))}
        files[WORKFLOW_DIR / f"{alias}.json"] = render(editor)
    files[DETAILS] = details_page(made)
    files[ORDER_SCRIPT] = order_script([p.stem for p in files if p.parent == WORKFLOW_DIR])
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare with the files on disk")
    args = parser.parse_args(argv)
    stale = []
    for path, text in expected_files().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(path)
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    for path in stale:
        print(("out of date: " if args.check else "wrote ") + str(path.relative_to(REPO)))
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
