"""The node classes this pack registers with ComfyUI (V3 API: ``io.ComfyNode``), found in this folder: a
module that declares node classes is a node module (its nodes are registered, in the order it declares them,
modules by name); the others (the host seams, the payload types, the inputs, tooltips and stores several
nodes share) declare none. A new node needs no line here. Node ids are a public contract: never rename one.

The FLUX.2 nodes serve klein and dev alike, so their display names say "FLUX.2" (their ids keep "Klein");
the LoRA loader is klein's only and keeps "[klein]" in its name."""

import importlib
import pkgutil

from .host import plain_error_names
from .requirements import report_missing_packages
from .sockets import ComfyExtension, io

# subclasses of ComfyUI's model classes, imported only when a model is converted (native_model)
ONLY_WHEN_USED = frozenset({"native_classes"})


def node_classes() -> list[type[io.ComfyNode]]:
    """Every node class the modules of this folder declare."""
    found = []
    for info in pkgutil.iter_modules(__path__):  # by name
        if info.name in ONLY_WHEN_USED:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        found += [
            value
            for value in vars(module).values()
            if isinstance(value, type)
            and issubclass(value, io.ComfyNode)
            and value.__module__ == module.__name__
        ]
    return found


NODES: list[type[io.ComfyNode]] = node_classes()


class Flux2KleinExtension(ComfyExtension):
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return list(NODES)


async def comfy_entrypoint() -> Flux2KleinExtension:
    """What ComfyUI calls when it loads this pack (V3 registration)."""
    plain_error_names()
    report_missing_packages()
    return Flux2KleinExtension()


__all__ = ["NODES", "comfy_entrypoint"]
