"""The model files a workflow's loaders name: one table in the pack (``nodes/model_files.py``), read through
the pack's own import, and the per-node ``models`` entries the frontend offers as downloads."""

from __future__ import annotations

from .schemas import FILES


def models_property(*filenames: str) -> list[dict]:
    """The frontend's download entries (name, url, directory) of ``filenames``."""
    return [
        {"name": FILES[name].name, "url": FILES[name].url, "directory": FILES[name].folder}
        for name in filenames
    ]
