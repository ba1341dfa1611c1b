"""Layering: ``flux2_core`` never depends on ComfyUI, so the command line and other hosts can use it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "flux2_core"
HOST_MODULES = ("comfy", "comfy_api", "comfy_extras", "folder_paths", "server", "nodes", "latent_preview")
CORE_FILES = sorted(CORE.rglob("*.py"))  # every subpackage, at any depth
MAX_TOP_LEVEL_MODULES = 12  # the top of flux2_core is the way of the data; the rest lives in subpackages


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_walk_sees_every_subpackage():
    packages = {module_name(p) for p in CORE_FILES if p.name == "__init__.py"}
    assert {"flux2_core.dit", "flux2_core.vae", "flux2_core.text", "flux2_core.flux1"} <= packages
    folders = {module_name(p.parent / "__init__.py") for p in CORE_FILES}
    assert folders == packages, f"folders without __init__.py: {sorted(folders - packages)}"


def test_core_imports_with_comfyui_blocked():
    # A module set to None in sys.modules makes any import of it fail, even one deep inside the core.
    modules = [module_name(p) for p in CORE_FILES if p.name != "__main__.py"]
    code = (
        "import importlib, sys\n"
        f"for name in {list(HOST_MODULES)!r}: sys.modules[name] = None\n"
        f"for name in {modules!r}: importlib.import_module(name)\n"
        "leaked = [m for m in sys.modules if m.split('.')[0] in {hosts!r} and sys.modules[m] is not None]\n"
        "assert not leaked, leaked\n"
    ).replace("{hosts!r}", repr(set(HOST_MODULES)))
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=CORE.parent, timeout=300
    )
    assert result.returncode == 0, result.stderr


def test_core_source_names_no_host_module():
    # Also catches imports inside functions, which the import test above only sees when they run.
    for path in CORE_FILES:
        assert not host_imports(path), f"{path.relative_to(ROOT)} imports {host_imports(path)}"


# The node layer's seams to the host, each with the host modules it may import: ComfyUI's services
# (host.py), its V3 node API (sockets.py) and the native model classes ours subclass (native_classes.py).
HOST_SEAMS = {
    "host.py": {"folder_paths", "comfy", "latent_preview"},
    "sockets.py": {"comfy_api"},
    "native_classes.py": {"comfy"},
}


def test_only_the_nodes_host_seams_import_the_host():
    # Few places to stub in tests and to adapt when ComfyUI changes; the core is imported relatively.
    for path in (ROOT / "nodes").glob("*.py"):
        allowed = HOST_SEAMS.get(path.name, set())
        extra = set(host_imports(path)) - allowed
        assert not extra, (
            f"nodes/{path.name} imports {sorted(extra)}: only {sorted(HOST_SEAMS)} import the host"
        )
    assert {"folder_paths", "comfy"} <= set(host_imports(ROOT / "nodes" / "host.py"))
    assert host_imports(ROOT / "nodes" / "sockets.py") == ["comfy_api"]


def test_one_core_module_imports_comfy_kitchen():
    # comfy-kitchen is optional: its one importer turns its absence into a log line, never an error
    importers = [
        str(path.relative_to(ROOT))
        for path in CORE_FILES
        if any(
            (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "comfy_kitchen" for a in n.names))
            or (
                isinstance(n, ast.ImportFrom)
                and n.level == 0
                and (n.module or "").startswith("comfy_kitchen")
            )
            for n in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        )
    ]
    assert importers == ["flux2_core/weights/kitchen.py"], importers
    code = (
        "import logging, sys\n"
        "sys.modules['comfy_kitchen'] = None\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "from flux2_core.weights import kitchen\n"
        "assert kitchen.installed() is None\n"
        "assert kitchen.choose('float8_e4m3fn', kitchen.Device('cuda', (9, 0)), 'auto', None, True).path == "
        "'dequantize'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "comfy-kitchen is not available" in run.stderr and "pip install -U comfy-kitchen" in run.stderr


def test_core_files_stay_one_concept_each():
    for path in CORE_FILES:
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= 400, f"{path.relative_to(ROOT)} has {lines} lines: split it by concept"


def test_the_top_level_stays_small():
    top = sorted(p.name for p in CORE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at the top of flux2_core: {top}"


def test_no_import_circle_in_the_core():
    # Module-level imports only (a function-level import runs after every module is loaded). A package's
    # __init__ counts as a module of its own: importing ``a.b`` also runs ``a``'s __init__, unless ``a`` is
    # a package the importing module itself lies in (then it is already being imported).
    graph = {module_name(p): set(core_imports(p)) for p in CORE_FILES}
    state: dict[str, int] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for dep in sorted(graph.get(name, ())):
            assert state.get(dep) != 1, "import circle: " + " -> ".join([*path, name, dep])
            if dep not in state:
                visit(dep, [*path, name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])


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


def core_imports(path: Path) -> list[str]:
    """The core modules a file imports at module level (relative imports resolved; packages included)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = []
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if not isinstance(node, ast.ImportFrom) or node.level == 0:
            continue
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        target = ".".join(base + ([node.module] if node.module else []))
        names = [target] if node.module else [f"{target}.{alias.name}" for alias in node.names]
        for name in names:
            parts = name.split(".")  # the module and the packages above it whose __init__ runs first
            found += [".".join(parts[:i]) for i in range(2, len(parts) + 1)]
    known = {module_name(p) for p in CORE_FILES}
    own = module_name(path).split(".")
    enclosing = {".".join(own[:i]) for i in range(1, len(own) + (path.name != "__init__.py"))}
    return [name for name in found if name in known and name not in enclosing and name != module_name(path)]


def host_imports(path: Path) -> list[str]:
    """Absolute imports of host modules in a source file (anywhere in it, functions included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [alias.name.split(".")[0] for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            found.append((node.module or "").split(".")[0])
    return [name for name in found if name in HOST_MODULES]
