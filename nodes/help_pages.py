"""The nodes' help pages for an editor in any language, with no 404 before the page.

The editor's help panel asks ``/extensions/<pack folder>/docs/<NodeId>/<locale>.md`` first and only on a 404
falls back to ``docs/<NodeId>.md``. The pack ships each page in English and Chinese
(``web/docs/<NodeId>/en.md``, ``zh.md``) and in English as ``<NodeId>.md``; an editor set to Japanese,
French, Russian or any other language would get a 404 before the English page. This route answers that
first request itself: the page in the editor's language where the pack has it, else the English page.

ComfyUI adds the routes packs register before the static route of each pack's web folder, so this route
answers these paths (and only these: every other file under ``/extensions/<pack folder>/`` stays the static
route's). aiohttp is imported only when the route is added (it is ComfyUI's, not a dependency of the pack).
"""

from __future__ import annotations

import re
from pathlib import Path

NODE = re.compile(r"^[A-Za-z0-9_]+$")  # a node id: no folder, no dot
LOCALE = re.compile(r"^[A-Za-z]{2,3}(-[A-Za-z0-9]{2,8})?$")  # "en", "zh", "zh-TW", "pt-BR"


def route_path(pack: str) -> str:
    """The path this route answers, without the ``/api`` the server adds in front of a copy."""
    return f"/extensions/{pack}/docs/{{node}}/{{locale}}.md"


def page(docs: Path, node: str, locale: str) -> Path | None:
    """The help page of ``node`` for an editor in ``locale`` in the ``docs`` folder (``web/docs``): the
    locale's own page, else the English one; None for a node with no page or a name that is not a node id
    or a locale."""
    if not NODE.match(node) or not LOCALE.match(locale):
        return None
    for path in (docs / node / f"{locale}.md", docs / f"{node}.md"):
        if path.is_file():
            return path
    return None


def add_routes(routes, pack: str, docs: Path):
    """Add the help page route for ``pack`` (the pack's folder name under custom_nodes) to ``routes`` (an
    aiohttp ``RouteTableDef``); returns its handler."""
    from aiohttp import web

    docs = Path(docs)

    async def help_page(request):
        path = page(docs, request.match_info["node"], request.match_info["locale"])
        if path is None:
            raise web.HTTPNotFound()
        return web.FileResponse(path, headers={"Content-Type": "text/markdown; charset=utf-8"})

    routes.get(route_path(pack))(help_page)
    return help_page
