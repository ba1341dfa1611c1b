"""ComfyUI's V3 node API as this pack uses it: the one module that imports ``comfy_api``.

Our payloads travel on socket types of our own (``types.MODEL`` ...), made with ``io.Custom`` so they
cannot be wired into core sockets with other interfaces; IMAGE, MASK, LATENT and native CONDITIONING /
MODEL are the core's own types. ``comfy_api.latest`` ships with ComfyUI 0.29 and later, the oldest host this
pack supports.
"""

from __future__ import annotations

from comfy_api.latest import ComfyExtension, io

from . import types

Model = io.Custom(types.MODEL)
TextEncoder = io.Custom(types.TEXT_ENCODER)
Vae = io.Custom(types.VAE)
Conditioning = io.Custom(types.CONDITIONING)
References = io.Custom(types.REFERENCES)
Stitch = io.Custom(types.STITCH)
FillModel = io.Custom(types.FILL_MODEL)
FillTextEncoder = io.Custom(types.FILL_TEXT_ENCODER)
FillVae = io.Custom(types.FILL_VAE)
FillConditioning = io.Custom(types.FILL_CONDITIONING)

__all__ = [
    "ComfyExtension", "io", "Model", "TextEncoder", "Vae", "Conditioning", "References", "Stitch",
    "FillModel", "FillTextEncoder", "FillVae", "FillConditioning", "output",
]  # fmt: skip


def output(*values, text: str = "") -> io.NodeOutput:
    """A node's outputs, with ``text`` shown on the node (and kept in the prompt's history) when not empty."""
    return io.NodeOutput(*values, ui={"text": [text]} if text else None)
