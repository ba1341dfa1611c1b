"""ComfyUI entry point of the FLUX.2 [klein] node pack (ComfyUI's V3 node API: ``comfy_entrypoint``).

ComfyUI loads this folder as a package under a path-derived name, so everything below is imported
relatively. Outside ComfyUI (tests, the command line, pip installs) this module exposes no nodes and imports
nothing heavy: ``folder_paths`` only exists inside ComfyUI.
"""

# The node help pages ComfyUI's frontend shows (web/docs/<NodeId>.md, .../<NodeId>/zh.md), served under
# /extensions/<this folder>/.
WEB_DIRECTORY = "./web"

try:
    import folder_paths  # noqa: F401  (ComfyUI's own module: present only inside ComfyUI)
except ImportError:
    __all__ = []
else:
    import os

    from .nodes import comfy_entrypoint, help_pages, template_pictures

    try:
        from server import PromptServer  # ComfyUI's web server, created before the packs load
    except ImportError:  # a host without ComfyUI's server: no template browser either
        pass
    else:
        # The template cards' pictures where the core's route would answer 404 (nodes/template_pictures.py);
        # the folder's name as ComfyUI lists the pack's templates under (not the link's target).
        _pack = os.path.dirname(os.path.abspath(__file__))
        _name = os.path.basename(_pack)
        template_pictures.add_routes(PromptServer.instance.routes, _name, os.path.join(_pack, "workflows"))
        # The help page in the editor's language, or English, at the first URL the help panel asks
        # (nodes/help_pages.py).
        help_pages.add_routes(PromptServer.instance.routes, _name, os.path.join(_pack, "web", "docs"))

    __all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
