"""The node contract (tests/fixtures/node_contract.json) is the one the node schemas give, and the script that
writes it refuses a change that would break a saved workflow or an API client."""

from __future__ import annotations

import copy
import json

from node_contract import CONTRACT_FILE
from repo_scripts import load_script

contract = load_script("build_node_contract")


def test_the_committed_contract_is_the_one_the_schemas_give():
    # a node whose id, display name, inputs or outputs change shows up here, until the file is written again
    # (and writing it refuses a breaking change: below)
    committed = CONTRACT_FILE.read_text(encoding="utf-8")
    assert contract.text(contract.expected()) == committed, "run python scripts/build_nodes.py"
    assert contract.CONTRACT_FILE.resolve() == CONTRACT_FILE.resolve()


def test_a_change_that_breaks_saved_workflows_is_refused():
    old = json.loads(CONTRACT_FILE.read_text(encoding="utf-8"))
    assert not contract.breaking_changes(old, old)

    def changed(edit) -> list[str]:
        new = copy.deepcopy(old)
        edit(new)
        return contract.breaking_changes(old, new)

    sampler = "Flux2KleinSampler"
    required, optional = old[sampler]["required"], old[sampler]["optional"]

    def renamed(name: str, to: str) -> dict:
        return {to if k == name else k: v for k, v in required.items()}

    breaking = {
        "a node removed": lambda c: c.pop(sampler),
        "the display name": lambda c: c[sampler].update(display_name="Sampler"),
        "a required input renamed": lambda c: c[sampler].update(required=renamed("seed", "noise_seed")),
        "a required input added": lambda c: c[sampler]["required"].update(sampler_name="COMBO"),
        "a required input retyped": lambda c: c[sampler]["required"].update(steps="FLOAT"),
        "required inputs reordered": lambda c: c[sampler].update(required=dict(reversed(required.items()))),
        "an optional input removed": lambda c: c[sampler]["optional"].pop("denoise"),
        "an optional input inserted": lambda c: c[sampler].update(optional={"new": "INT", **optional}),
        "an output removed": lambda c: c[sampler].update(outputs=[]),
        "the seed's control": lambda c: c[sampler].update(control_after_generate=[]),
    }
    for what, edit in breaking.items():
        assert changed(edit), what
    allowed = {
        "a new node": lambda c: c.update(Flux2KleinNew=copy.deepcopy(old[sampler])),
        "an optional input appended": lambda c: c[sampler]["optional"].update(new_input="FLOAT"),
        "an output appended": lambda c: c[sampler]["outputs"].append("IMAGE"),
        "a new category": lambda c: c[sampler].update(category="flux2_klein/other"),
        "an input made advanced": lambda c: c[sampler]["advanced"].append("denoise"),
    }
    for what, edit in allowed.items():
        assert not changed(edit), what
