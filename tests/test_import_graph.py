"""The repository's import graph, read from the source of every module (imports inside functions and
``TYPE_CHECKING`` blocks included): no import circle anywhere (the core, the nodes, the scripts, the
benchmarks, the test fixtures), no module importing a package that contains it (an arrow up), and the model
packages knowing no placement strategy (streaming, block placement and parallelism register themselves
through the hooks seam or are passed in). The layering rules against the host are in test_layering.py."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Folders whose modules are imported by top-level names (the sys.path entries of their programs), then the
# pack itself, whose modules are named from the repository root (``flux2_core.dit.files``, ``nodes.sampler``).
PATH_ROOTS = [ROOT / "scripts", ROOT / "benchmarks", ROOT / "tests" / "fixtures"]
PACK_FOLDERS = [ROOT / "flux2_core", ROOT / "nodes"]
MODEL_PACKAGES = ("flux2_core.dit", "flux2_core.vae", "flux2_core.text", "flux2_core.flux1")
PLACEMENT = "flux2_core.devices"


def module_files() -> dict[str, Path]:
    found = {}
    for root in PATH_ROOTS:
        for path in root.rglob("*.py"):
            found[_name(path, root)] = path
    for folder in PACK_FOLDERS:
        for path in folder.rglob("*.py"):
            found[_name(path, ROOT)] = path
    return found


def _name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The repository modules ``path`` imports (``from pkg import mod`` counts as importing ``pkg.mod``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".") if package else []
                up = up[: len(up) - (node.level - 1)] if node.level > 1 else up
                base = ".".join(p for p in (*up, base) if p)
            subs = [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
            # ``from pkg import mod`` imports the module; ``from pkg import name`` the package's name
            targets = [t for t in subs if t in known] + ([base] if any(t not in known for t in subs) else [])
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files)) for name, path in files.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle (one path around each), by depth-first search."""
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def test_the_graph_is_read():
    edges = graph()
    assert "flux2_core.sampling" in edges["flux2_core.cli.run"] and "workflow_builder.graph" in edges
    assert "flux2_core" in edges["nodes.sampler"]  # the node layer's relative import of the core


def test_no_import_circle_anywhere():
    found = cycles(graph())
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_module_imports_a_package_that_contains_it():
    up = [(name, target) for name, targets in graph().items() for target in targets
          if name.startswith(target + ".")]  # fmt: skip
    assert not up, f"arrows up (module -> the package it is in): {up}"


def test_the_model_packages_import_no_placement_strategy():
    wrong = [(name, target) for name, targets in graph().items() if name.startswith(MODEL_PACKAGES)
             for target in targets if target == PLACEMENT or target.startswith(PLACEMENT + ".")]  # fmt: skip
    assert not wrong, f"model code importing a placement strategy: {wrong}"


def test_the_circle_finder_finds_circles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
