"""The README's install lines, run (as pip's dry run, which resolves every requirement against the package
index) in the Python of the ComfyUI under test, and ``pip install -e .`` of this checkout: no package already
installed there, ComfyUI's pinned numpy, torch and the rest, changes version."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from readme_install import FOLDER, REPO, pip_lines


def _installed(python: str) -> dict[str, str]:
    out = subprocess.run([python, "-m", "pip", "list", "--format", "json"], capture_output=True, text=True)
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out.stdout)}


def _would_install(python: str, args: list[str]) -> dict[str, str]:
    run = subprocess.run(
        [python, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if run.returncode != 0:
        pytest.fail(f"pip install {' '.join(args)} fails in ComfyUI's Python:\n{run.stderr[-3000:]}")
    report = json.loads(run.stdout)
    return {
        i["metadata"]["name"].lower().replace("_", "-"): i["metadata"]["version"] for i in report["install"]
    }


@pytest.mark.parametrize(
    "args",
    [*pip_lines(), ["-e", "."]],
    ids=lambda a: " ".join(a).replace(f"ComfyUI/custom_nodes/{FOLDER}/", ""),
)
def test_no_install_line_moves_a_package_comfyui_has(args):
    python = os.environ.get("COMFYUI_PYTHON") or sys.executable
    here = [str(REPO / "requirements.txt") if a.endswith(f"{FOLDER}/requirements.txt") else a for a in args]
    here = [str(REPO) if a == "." else a for a in here]
    before = _installed(python)
    changed = {
        name: f"{before[name]} -> {version}"
        for name, version in _would_install(python, here).items()
        if name in before and before[name] != version and name != FOLDER
    }
    assert not changed, f"pip install {' '.join(args)} would change ComfyUI's packages: {changed}"
