"""The search words several nodes share (V3 ``Schema.search_aliases``): the family a node is for. Each node
lists its words in its own schema, after these: the task ("edit", "inpaint", "img2img", "regional"), the
native node users know ("KSampler", "Load Diffusion Model", "CLIP Text Encode"), and a few Chinese words.
Declares no node."""

from __future__ import annotations

KLEIN = ("klein", "flux 2", "flux2", "flux.2")
DEV = ("flux 2 dev", "flux2 dev")
FILL = ("flux 1 fill", "flux1 fill", "fill", "flux.1")
