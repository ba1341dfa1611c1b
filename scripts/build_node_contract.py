"""Generate the node contract (``tests/fixtures/node_contract.json``) from the node schemas.

    python scripts/build_node_contract.py                   # (re)write it; refuses a change that breaks it
    python scripts/build_node_contract.py --check           # exit 1 if the file differs from the schemas
    python scripts/build_node_contract.py --allow-breaking  # write a breaking change anyway (a new major)

Saved workflows and API clients store node ids, input names and widget values in order, so per node the
contract holds its display name, category, inputs in order (required, then optional, each with its type),
the inputs the editor follows with a randomize / fixed value (which take a widget value of their own), the
output types and the inputs marked advanced. The tests hold the nodes (on the fake host and in a real
server's ``/object_info``) and the bundled workflows to it, and compare it with what this script makes, so a
schema change shows up as a change of this file. Writing it refuses what would break a saved graph
(``breaking_changes``): a node or an input removed or renamed, a type changed, an input moved, a required
input added, the seed's control changed, an output removed. New nodes, inputs appended as optional and
outputs appended are fine.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workflow_builder.schemas import NODE_DOCS, REPO, NodeDoc  # noqa: E402  (the package beside this script)

CONTRACT_FILE = REPO / "tests" / "fixtures" / "node_contract.json"


def entry(doc: NodeDoc) -> dict:
    """One node's contract, from its schema (what ComfyUI's V1 view of it serves)."""
    found = {
        "display_name": doc.display_name,
        "category": doc.category,
        "required": {i.name: i.type for i in doc.inputs if not i.optional},
        "optional": {i.name: i.type for i in doc.inputs if i.optional},
        "outputs": [kind for _, kind, _ in doc.outputs],
        "control_after_generate": [i.name for i in doc.inputs if i.control_after_generate],
        "advanced": [i.name for i in doc.inputs if i.advanced],
    }
    return {key: value for key, value in found.items() if value or key in ("required", "optional", "outputs")}


def expected() -> dict:
    return {node_id: entry(NODE_DOCS[node_id]) for node_id in sorted(NODE_DOCS)}


def text(contract: dict) -> str:
    return json.dumps(contract, indent=2) + "\n"


def breaking_changes(old: dict, new: dict) -> list[str]:
    """What ``new`` changes of ``old`` that a saved workflow or an API client would break on."""
    found = []
    for node_id, was in old.items():
        now = new.get(node_id)
        if now is None:
            found.append(f"{node_id}: removed (or renamed)")
            continue
        if now["display_name"] != was["display_name"]:
            found.append(f"{node_id}: display name {was['display_name']!r} -> {now['display_name']!r}")
        if list(now["required"].items()) != list(was["required"].items()):
            found.append(f"{node_id}: required inputs {was['required']} -> {now['required']}")
        kept = list(now["optional"].items())[: len(was["optional"])]
        if kept != list(was["optional"].items()):
            found.append(f"{node_id}: optional inputs {was['optional']} -> {now['optional']} (append only)")
        if now["outputs"][: len(was["outputs"])] != was["outputs"]:
            found.append(f"{node_id}: outputs {was['outputs']} -> {now['outputs']} (append only)")
        controls = (was.get("control_after_generate", []), now.get("control_after_generate", []))
        if controls[0] != controls[1]:
            found.append(f"{node_id}: control_after_generate {controls[0]} -> {controls[1]}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare with the file on disk")
    parser.add_argument("--allow-breaking", action="store_true", help="write even a breaking change")
    args = parser.parse_args(argv)
    contract = expected()
    committed = CONTRACT_FILE.read_text(encoding="utf-8") if CONTRACT_FILE.exists() else None
    where = CONTRACT_FILE.relative_to(REPO)
    if committed == text(contract):
        return 0
    if args.check:
        print(f"out of date: {where} (run python scripts/build_nodes.py)")
        return 1
    breaking = breaking_changes(json.loads(committed), contract) if committed else []
    if breaking and not args.allow_breaking:
        print(f"not written: these changes break saved workflows ({where}):", file=sys.stderr)
        for line in breaking:
            print(f"  {line}", file=sys.stderr)
        print("keep the old ids and inputs (add new inputs as optional, at the end)", file=sys.stderr)
        return 2
    CONTRACT_FILE.write_text(text(contract), encoding="utf-8")
    print(f"wrote {where}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
