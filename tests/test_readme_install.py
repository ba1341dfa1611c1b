"""The README's install lines for ComfyUI users: the folder name the clone gives is the one the pip line
reads, the registry id is the project's, and neither line can move a package ComfyUI pins (mistral-common,
whose requirements pin numpy below ComfyUI's, only with --no-deps and never a default requirement). A real
ComfyUI's Python runs the same lines in tests/integration/test_install_lines.py."""

from __future__ import annotations

import re

import tomllib
from readme_install import FOLDER, REPO, install_section, pip_lines

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))


def _names(requirements: list[str]) -> set[str]:
    return {
        re.split(r"[<>=!~\[; ]", r.strip(), maxsplit=1)[0].lower().replace("_", "-") for r in requirements
    }


def test_the_clone_and_the_pip_line_name_the_same_folder():
    section = install_section()
    assert f"git clone <this repository's URL> {FOLDER}" in section
    assert [f"ComfyUI/custom_nodes/{FOLDER}/requirements.txt"] == [
        line[1] for line in pip_lines() if line[0] == "-r"
    ]
    assert f"ComfyUI\\custom_nodes\\{FOLDER}\\requirements.txt" in section  # the Windows portable line


def test_the_registry_id_is_the_projects():
    assert f"comfy node install {PYPROJECT['project']['name']}" in install_section()
    assert PYPROJECT["project"]["name"] == FOLDER


def test_mistral_common_only_without_its_requirements():
    assert ["--no-deps", "mistral-common"] in pip_lines()
    assert "mistral-common" not in _names(PYPROJECT["project"]["dependencies"])
    assert "mistral-common" in _names(PYPROJECT["project"]["optional-dependencies"]["flux2-dev"])
    requirements = (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()
    listed = _names([r for r in requirements if r.strip() and not r.startswith("#")])
    assert "mistral-common" not in listed
    # what ComfyUI's Python gets is what the package itself needs, less torch (ComfyUI brings it)
    assert listed == _names(PYPROJECT["project"]["dependencies"]) - {"torch"}
