"""Layering: ``flux2_core`` never depends on ComfyUI, so the command line and other hosts can use it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "flux2_core"
HOST_MODULES = ("comfy", "comfy_api", "comfy_extras", "folder_paths", "server", "nodes", "latent_preview")


def test_core_imports_with_comfyui_blocked():
    # A module set to None in sys.modules makes any import of it fail, even one deep inside the core.
    modules = sorted(p.stem for p in CORE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    code = (
        "import importlib, sys\n"
        f"for name in {list(HOST_MODULES)!r}: sys.modules[name] = None\n"
        f"for name in {modules!r}: importlib.import_module('flux2_core.' + name)\n"
        "leaked = [m for m in sys.modules if m.split('.')[0] in {hosts!r} and sys.modules[m] is not None]\n"
        "assert not leaked, leaked\n"
    ).replace("{hosts!r}", repr(set(HOST_MODULES)))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=CORE.parent, timeout=300
    )
    assert result.returncode == 0, result.stderr


def test_core_source_names_no_host_module():
    # Also catches imports inside functions, which the import test above only sees when they run.
    for path in CORE.glob("*.py"):
        assert not host_imports(path), f"{path.name} imports {host_imports(path)}"


def test_only_nodes_host_imports_the_host():
    # One place to stub in tests and to adapt when ComfyUI changes; the core is imported relatively.
    for path in (ROOT / "nodes").glob("*.py"):
        if path.name != "host.py":
            assert not host_imports(path), f"nodes/{path.name} imports {host_imports(path)}"
    assert {"folder_paths", "comfy"} <= set(host_imports(ROOT / "nodes" / "host.py"))


def test_core_files_stay_one_concept_each():
    for path in CORE.glob("*.py"):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 400, f"flux2_core/{path.name} has {lines} lines: split it by concept"


def test_nodes_use_only_what_the_core_exports():
    import flux2_core

    for path in (ROOT / "nodes").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 2:
                assert node.module == "flux2_core", f"nodes/{path.name} imports flux2_core.{node.module}"
                names = {alias.name for alias in node.names}
                assert names <= set(flux2_core.__all__), (
                    f"nodes/{path.name}: {names - set(flux2_core.__all__)}"
                )


def host_imports(path: Path) -> list[str]:
    """Absolute imports of host modules in a source file (anywhere in it, functions included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.module or "").split(".")[0])
    return [name for name in found if name in HOST_MODULES]
