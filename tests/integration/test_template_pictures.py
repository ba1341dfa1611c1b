"""The template cards' pictures (workflows/<name>.jpg) on ComfyUI 0.29 and on the newest core's routing.

ComfyUI up to 0.30 serves a pack's whole workflows folder under /api/workflow_templates/<pack>/ (a static
route); the newest core serves only <name>.json there, a 404 for anything else. The pack adds a route for its
pictures (nodes/template_pictures.py) that must answer only where the core's would be a 404.

* ``test_the_server_serves_every_card_picture``: the real server (COMFYUI_PATH, 0.29 here) over HTTP.
* ``test_who_answers``: the web app built as ComfyUI's server.py builds it (the pack's routes while it loads,
  then the core manager's, then the /api copies: template_routes.py, run with ComfyUI's Python), asked which
  route answers, under (a) the checkout's own ``app/custom_node_manager.py``, (b) the newest core's route as
  its source reads (json-only) and (c) when ``COMFYUI_NEWEST_MANAGER`` names a newer core's
  ``app/custom_node_manager.py``, that file run as is. (b) models the newest core's route in this test's
  words; (c) runs the core's own code, but only its manager: the rest of that core's server is not started.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from comfy_server import PACK_LINK

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / "workflows"
NAMES = sorted(p.stem for p in WORKFLOWS.glob("*.json"))
SCRIPT = Path(__file__).with_name("template_routes.py")
TITLED = "FLUX.2 klein edit"  # a workflow's title-like name: spaces and a dot


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_server_serves_every_card_picture(comfy):
    assert NAMES and sorted(comfy.get_json("/api/workflow_templates")[PACK_LINK]) == NAMES
    for name in NAMES:
        url = f"{comfy.url}/api/workflow_templates/{PACK_LINK}/{urllib.parse.quote(name)}.jpg"
        with urllib.request.urlopen(url, timeout=30) as response:
            assert response.status == 200 and response.headers["Content-Type"] == "image/jpeg", name
            assert hashlib.sha256(response.read()).hexdigest() == _sha(WORKFLOWS / f"{name}.jpg"), name
    with pytest.raises(urllib.error.HTTPError) as missing:  # no such workflow: still a 404
        urllib.request.urlopen(f"{comfy.url}/api/workflow_templates/{PACK_LINK}/no_such_workflow.jpg")
    assert missing.value.code == 404


def _answers(core: str) -> dict:
    name = "flux2_klein_4b_edit"
    base = f"/api/workflow_templates/{PACK_LINK}"
    urls = {
        "picture": f"{base}/{name}.jpg",
        "titled picture": f"{base}/{urllib.parse.quote(TITLED)}.jpg",
        "workflow": f"{base}/{name}.json",
        "missing": f"{base}/no_such_workflow.jpg",
        "outside": f"{base}/..%2F..%2Fpyproject.jpg",
        "other pack": f"/api/workflow_templates/another-pack/{name}.jpg",
    }
    python = os.environ.get("COMFYUI_PYTHON") or sys.executable
    run = subprocess.run(
        [python, str(SCRIPT), os.environ["COMFYUI_PATH"], core, str(REPO), PACK_LINK, *urls.values()],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    answered = json.loads(run.stdout.strip().splitlines()[-1])
    return {key: answered[url] for key, url in urls.items()}


def _check_common(got: dict) -> None:
    name = "flux2_klein_4b_edit"
    assert got["picture"]["status"] == 200 and got["picture"]["sha256"] == _sha(WORKFLOWS / f"{name}.jpg")
    titled = got["titled picture"]
    assert titled["status"] == 200 and titled["sha256"] == _sha(WORKFLOWS / f"{TITLED}.jpg")
    assert titled["by"] == got["picture"]["by"]
    assert got["workflow"] == {"status": 200, "sha256": _sha(WORKFLOWS / f"{name}.json"), "by": "core"}
    assert got["missing"]["status"] == 404 and got["outside"]["status"] in (403, 404)
    assert got["other pack"]["status"] == 404 and got["other pack"]["by"] != "pack"


def test_who_answers_under_this_checkouts_core():
    manager = Path(os.environ["COMFYUI_PATH"]) / "app" / "custom_node_manager.py"
    got = _answers(str(manager))
    _check_common(got)
    source = manager.read_text(encoding="utf-8")
    if "web.static" in source:  # 0.29-0.30: the core's static folder answers first; the pack's is not reached
        assert got["picture"]["by"] == "core" and got["missing"]["by"] == "core"
    else:  # a core that serves only JSON: the picture comes from the pack's route
        assert got["picture"]["by"] == "pack"


def test_who_answers_under_the_newest_cores_route():
    # the newest core's route as its source reads: /workflow_templates/{module_name}/{filename}, a 404 for a
    # name not ending in .json; the picture is the pack's, the workflow stays the core's
    got = _answers("json-only")
    _check_common(got)
    assert got["picture"]["by"] == "pack" and got["workflow"]["by"] == "core"


@pytest.mark.skipif(
    not os.environ.get("COMFYUI_NEWEST_MANAGER"),
    reason="COMFYUI_NEWEST_MANAGER (a newer core's app/custom_node_manager.py) is not set",
)
def test_who_answers_under_a_newer_cores_own_manager():
    got = _answers(os.environ["COMFYUI_NEWEST_MANAGER"])
    _check_common(got)
    newest = Path(os.environ["COMFYUI_NEWEST_MANAGER"]).read_text(encoding="utf-8")
    if "web.static" not in newest:
        assert got["picture"]["by"] == "pack"
