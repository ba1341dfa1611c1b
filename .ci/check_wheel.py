"""The package users install: build the wheel, check it carries every module of flux2_core, install it into a
fresh environment and run the installed command line and an import of every public name from it.

    python .ci/check_wheel.py [--python PYTHON]

The fresh environment reuses this environment's installed dependencies (torch and the rest: its
site-packages folder is put on the new one's path, after the new one's own, without running its ``.pth``
files, so an editable install of the checkout stays out) and gets the wheel itself. The checks run from a
temporary folder, so the checkout cannot stand in for the installed package.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

IMPORT_ALL = """
import pathlib, sys
import flux2_core
where = pathlib.Path(flux2_core.__file__).resolve()
assert "site-packages" in where.parts, f"flux2_core imported from {where}, not from the installed wheel"
missing = [name for name in flux2_core.__all__ if not hasattr(flux2_core, name)]
assert not missing, missing
from flux2_core import *  # noqa: every public name
import pkgutil, importlib
modules = [m.name for m in pkgutil.walk_packages(flux2_core.__path__, "flux2_core.")]
for name in modules:
    if name != "flux2_core.__main__":
        importlib.import_module(name)
print(f"installed {where.parent}: {len(flux2_core.__all__)} public names, {len(modules)} modules")
"""


def run(*cmd, **kw) -> subprocess.CompletedProcess:
    shown = " ".join(str(c) if "\n" not in str(c) else "<script>" for c in cmd)
    print("+", shown, flush=True)
    return subprocess.run([str(c) for c in cmd], check=True, **kw)


def main() -> int:
    argparse.ArgumentParser(description=__doc__).parse_args()
    python = sys.executable
    here = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tree = tmp / "tree"  # tracked files only: no build/ or egg-info of a local build
        files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        for name in filter(None, files.decode().split("\0")):
            if (ROOT / name).is_file():
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / name, tree / name)
        run(python, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", tmp / "dist", tree)
        (wheel,) = (tmp / "dist").glob("*.whl")
        carried = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".py")}
        source = {p.relative_to(tree).as_posix() for p in (tree / "flux2_core").rglob("*.py")}
        if source - carried:
            print(f"{wheel.name} lacks {sorted(source - carried)}", file=sys.stderr)
            return 1
        print(f"{wheel.name}: all {len(source)} modules of flux2_core")
        venv = tmp / "venv"
        run(python, "-m", "venv", venv)
        (site,) = (venv / "lib").glob("python*/site-packages")
        (site / "dependencies.pth").write_text("".join(f"{p}\n" for p in here))
        python = venv / "bin" / "python"
        run(python, "-m", "pip", "install", "--quiet", "--no-deps", wheel)
        work = tmp / "elsewhere"
        work.mkdir()
        run(python, "-c", IMPORT_ALL, cwd=work)
        run(python, "-m", "flux2_core", "generate", "--help", cwd=work, stdout=subprocess.DEVNULL)
        run(venv / "bin" / "flux2-klein", "--help", cwd=work, stdout=subprocess.DEVNULL)
    print("the installed package imports and its command line runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
