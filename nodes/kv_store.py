"""The reference K/V of the 9B-KV model, kept across queue runs: one store for the FLUX.2 Sampler and the
native MODEL bridge, emptied of a model's entries when ComfyUI unloads it (the loader's callback). Declares no
node."""

from __future__ import annotations

from ..flux2_core import RefKVStore

KV_STORE = RefKVStore()
