"""The pack's route for its template cards' pictures (nodes/template_pictures.py): what it answers, without a
server. Which route answers on a real core: tests/integration/test_template_pictures.py."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "nodes" / "template_pictures.py"
spec = importlib.util.spec_from_file_location("template_pictures", SOURCE)
pictures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pictures)


def test_only_a_workflows_own_picture_is_served(tmp_path):
    (tmp_path / "edit.json").write_text("{}")
    (tmp_path / "edit.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "orphan.jpg").write_bytes(b"\xff\xd8")  # no workflow beside it
    (tmp_path / ".hidden.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / ".hidden.json").write_text("{}")
    (tmp_path / "FLUX.2 klein edit.json").write_text("{}")
    (tmp_path / "FLUX.2 klein edit.jpg").write_bytes(b"\xff\xd8")
    assert pictures.picture(tmp_path, "edit") == tmp_path / "edit.jpg"
    assert pictures.picture(tmp_path, "FLUX.2 klein edit") == tmp_path / "FLUX.2 klein edit.jpg"
    for name in ("orphan", ".hidden", "../edit", "sub/edit", "..", " edit", "missing", ""):
        assert pictures.picture(tmp_path, name) is None, name


def test_every_bundled_workflow_has_its_picture_served():
    folder = REPO / "workflows"
    names = sorted(p.stem for p in folder.glob("*.json"))
    assert names and all(pictures.picture(folder, name) == folder / f"{name}.jpg" for name in names)


def test_the_route_is_the_packs_pictures_only():
    # a .json never matches it (the core keeps serving the workflows), nor another pack's folder
    assert pictures.route_path("comfyui-flux2-klein") == "/workflow_templates/comfyui-flux2-klein/{name}.jpg"


def test_the_pack_adds_the_route_only_inside_comfyui_and_imports_its_server_lazily():
    # the module itself names no host module (nodes/ keeps the host behind its seams); the pack's __init__
    # imports ComfyUI's server inside its ComfyUI-only branch, and aiohttp only when the route is added
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    modules = {a.name for n in top if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in top if isinstance(n, ast.ImportFrom)}
    assert modules == {"__future__", "re", "pathlib"}, modules
    init = ast.parse((REPO / "__init__.py").read_text(encoding="utf-8"))
    top = [n for n in init.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not any(a.name == "server" for n in top for a in n.names)
    assert not any(isinstance(n, ast.ImportFrom) and n.module == "server" for n in top)
    branch = next(n for n in init.body if isinstance(n, ast.Try))  # `import folder_paths` ... else: ComfyUI
    inner = ast.dump(ast.Module(body=branch.orelse, type_ignores=[]))
    assert "'server'" in inner and "add_routes" in inner and "PromptServer" in inner
