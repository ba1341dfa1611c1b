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
    from .nodes import comfy_entrypoint

    __all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
