"""Which route answers the template browser's requests for this pack, under a given core's routing.

    python template_routes.py COMFYUI_PATH CORE PACK_DIR PACK_NAME URL...

Run with ComfyUI's Python (aiohttp is ComfyUI's). Builds the web app the way ComfyUI's ``server.py`` does,
in its order: the pack's routes first (the pack's ``__init__`` adds them to ``PromptServer.instance.routes``
while it loads), then the core's custom-node manager's (``CustomNodeManager.add_routes(routes, app, loaded
modules)``: a static route added to the app at once in 0.29-0.30, routes on the table in newer cores), then
every route of the table again under ``/api``, those first, then the table itself. CORE is

* a path to a core's ``app/custom_node_manager.py`` (the checkout's own, or a newer core's file): its
  ``CustomNodeManager`` is run as is, with ``folder_paths``' custom_nodes folder a temporary one holding the
  pack under PACK_NAME;
* or ``json-only``: the route newer cores add instead of the static folder, as their source reads
  (``/workflow_templates/{module_name}/{filename}``: a name not ending in ``.json`` is a 404, else the
  pack's ``<name>.json``), for when no such file is at hand.

Prints one JSON line: for each URL, its status, the SHA-256 of its body and who answered (``pack``: the
pack's route, ``core``: another route, ``none``: no route matched).
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path


def load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def json_only_core(routes, pack: str, folder: Path) -> None:
    from aiohttp import web

    @routes.get("/workflow_templates/{module_name}/{filename}")
    async def workflow_template_file(request):
        filename = request.match_info["filename"]
        if request.match_info["module_name"] != pack or not filename.endswith(".json"):
            raise web.HTTPNotFound()
        path = folder / filename
        if not path.is_file():
            raise web.HTTPNotFound()
        return web.FileResponse(path)


async def answer(app, urls: list[str], ours) -> dict:
    from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

    results = {}
    async with TestClient(TestServer(app)) as client:
        for url in urls:
            match = await app.router.resolve(make_mocked_request("GET", url, app=app))
            handler = getattr(match, "handler", None)
            who = "none" if match.http_exception is not None else "pack" if handler is ours else "core"
            response = await client.get(url)
            body = await response.read()
            results[url] = {"status": response.status, "sha256": hashlib.sha256(body).hexdigest(), "by": who}
    return results


def main(comfyui: str, core: str, pack_dir: str, pack: str, *urls: str) -> None:
    sys.argv = sys.argv[:1]  # ComfyUI's argument parser reads the command line on import
    sys.path.insert(0, comfyui)
    from aiohttp import web

    pack_dir = Path(pack_dir)
    folder = pack_dir / "workflows"
    routes = web.RouteTableDef()
    app = web.Application()
    pictures = load("template_pictures", pack_dir / "nodes" / "template_pictures.py")
    ours = pictures.add_routes(routes, pack, folder)  # as the pack's __init__ does while ComfyUI loads it
    if core == "json-only":
        json_only_core(routes, pack, folder)
    else:
        import folder_paths

        custom_nodes = Path(tempfile.mkdtemp(prefix="custom_nodes"))
        os.symlink(pack_dir, custom_nodes / pack)
        folder_paths.folder_names_and_paths["custom_nodes"] = ([str(custom_nodes)], set())
        manager = load("custom_node_manager_under_test", Path(core))
        manager.CustomNodeManager().add_routes(routes, app, [(pack, str(custom_nodes / pack))])
    api = web.RouteTableDef()  # server.py: every route again under /api, added before the table itself
    for route in routes:
        if isinstance(route, web.RouteDef):
            api.route(route.method, "/api" + route.path)(route.handler, **route.kwargs)
    app.add_routes(api)
    app.add_routes(routes)
    print(json.dumps(asyncio.run(answer(app, list(urls), ours))))


if __name__ == "__main__":
    main(*sys.argv[1:])
