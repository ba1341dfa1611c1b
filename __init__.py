"""ComfyUI entry point of the FLUX.2 [klein] node pack (classic V1 node mappings).

ComfyUI loads this folder as a package under a path-derived name, so everything below is imported
relatively. Outside ComfyUI (tests, the command line, pip installs) this module exposes no nodes and imports
nothing heavy: ``folder_paths`` only exists inside ComfyUI.
"""

try:
    import folder_paths  # noqa: F401  (ComfyUI's own module: present only inside ComfyUI)
except ImportError:
    NODE_CLASS_MAPPINGS = {}
    NODE_DISPLAY_NAME_MAPPINGS = {}
else:
    from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
