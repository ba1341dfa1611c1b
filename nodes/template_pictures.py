"""The template browser's card pictures (``workflows/<name>.jpg``), served on every ComfyUI.

The template browser asks for a pack's card picture at ``/api/workflow_templates/<pack folder>/<name>.jpg``.
ComfyUI up to 0.30 serves the whole workflows folder there (a static route per pack, registered before any
other route of that path); newer ComfyUI serves only ``<name>.json`` there and answers 404 for anything else,
so the cards show a placeholder. This route answers ``<name>.jpg`` for the pack's own workflows folder only:

* where the core has its static route, that route comes first and this one is never reached;
* where the core serves only JSON, a ``.jpg`` would be a 404 there, and this route answers it instead.

A ``.json`` never matches this route, so the core keeps serving the workflows. The pack's ``__init__`` adds
the route to ComfyUI's ``PromptServer.instance.routes`` while the pack loads, before the core adds its own;
the server copies it under ``/api`` as it does every route. aiohttp is imported only when the route is added
(it is ComfyUI's, not a dependency of the pack).
"""

from __future__ import annotations

import re
from pathlib import Path

PICTURE = ".jpg"  # the type the template browser asks a pack's cards in
# a workflow's file name ("flux2_klein_4b_edit", "FLUX.2 klein edit"): no folder, no hidden file
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]*$")


def route_path(pack: str) -> str:
    """The path this route answers, without the ``/api`` the server adds in front of a copy."""
    return f"/workflow_templates/{pack}/{{name}}{PICTURE}"


def picture(folder: Path, name: str) -> Path | None:
    """The card picture of workflow ``name`` in ``folder``, or None: only a file directly in it, named like a
    workflow, with the workflow beside it."""
    if not NAME.match(name):
        return None
    path = folder / f"{name}{PICTURE}"
    if not path.is_file() or not (folder / f"{name}.json").is_file():
        return None
    return path


def add_routes(routes, pack: str, folder: Path):
    """Add the card picture route for ``pack`` (the pack's folder name under custom_nodes) to ``routes``
    (an aiohttp ``RouteTableDef``); returns its handler."""
    from aiohttp import web

    folder = Path(folder)

    async def workflow_picture(request):
        path = picture(folder, request.match_info["name"])
        if path is None:
            raise web.HTTPNotFound()
        return web.FileResponse(path)

    routes.get(route_path(pack))(workflow_picture)
    return workflow_picture
