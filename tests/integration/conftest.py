"""The integration tests' fixtures: a real ComfyUI server with this pack installed (``comfy_server``), a
headless Chromium for the frontend checks, and every test here marked ``comfyui`` and skipped, with the
reason, when ``COMFYUI_PATH`` is not set."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from comfy_server import INTEGRATION, SKIP_REASON, ComfyServer, serve


def pytest_collection_modifyitems(config, items):
    for item in items:
        if INTEGRATION in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.comfyui)
            if not os.environ.get("COMFYUI_PATH"):
                item.add_marker(pytest.mark.skip(reason=SKIP_REASON))


@pytest.fixture(scope="session")
def comfy(tmp_path_factory) -> ComfyServer:
    yield from serve(tmp_path_factory, with_models=True)


@pytest.fixture(scope="module")
def fp8_compute_comfy(tmp_path_factory) -> ComfyServer:
    """A server multiplying fp8 layers in fp8 on the CPU (``--supports-fp8-compute``), as on an fp8 GPU."""
    yield from serve(tmp_path_factory, with_models=True, extra_args=("--supports-fp8-compute",))


@pytest.fixture(scope="module")
def empty_comfy(tmp_path_factory) -> ComfyServer:
    """A second server whose model folders are empty, as on a newcomer's first start."""
    yield from serve(tmp_path_factory, with_models=False)


@pytest.fixture(scope="module")
def browser(comfy):
    """A headless Chromium (playwright) for the frontend checks; skipped, with the reason, without one."""
    from test_frontend import CHROMIUM, FLAGS

    sync_api = pytest.importorskip("playwright.sync_api", reason="the frontend check needs playwright")
    if not CHROMIUM:
        pytest.skip("no Chromium found (install chromium or set CHROMIUM): the frontend check needs one")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield chromium
        chromium.close()
