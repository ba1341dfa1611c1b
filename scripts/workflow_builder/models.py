"""The model files a workflow's loaders name: one table in the pack (``nodes/model_files.py``), read through
the pack's own import, and the per-node ``models`` entries the frontend offers as downloads."""

from __future__ import annotations

from .schemas import FILES


def models_property(*filenames: str) -> list[dict]:
    """The frontend's download entries (name, url, directory) of ``filenames``."""
    entries = []
    for filename in filenames:
        f = FILES[filename]
        entry = {"name": f.name}
        if f.url:
            entry["url"] = f.url
        entry["directory"] = f.folder
        entries.append(entry)
    return entries
