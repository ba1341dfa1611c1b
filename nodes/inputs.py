"""Inputs more than one node takes, and the model-file lists of the loaders. Declares no node.

A loader's file list is ComfyUI's folder (never an empty list, which cannot be queued: an empty folder shows
one entry naming the file to get), and a chosen name is turned into a path only if the folder lists it.
"""

from __future__ import annotations

from ..flux2_core import MAX_SEED, QUANT_COMPUTE_MODES, Flux2Error
from . import host, tooltips
from .model_files import empty_folder_entry, empty_folder_message
from .sockets import io


def seed_input(tooltip: str) -> io.Int.Input:
    """The noise seed every sampler node takes (the editor adds its randomize / fixed control after it)."""
    return io.Int.Input("seed", tooltip=tooltip, default=0, min=0, max=MAX_SEED, control_after_generate=True)


def quant_compute_input() -> io.Combo.Input:
    """How a quantised file's layers multiply (the loaders of a DiT or a control net)."""
    return io.Combo.Input(
        "quant_compute",
        options=list(QUANT_COMPUTE_MODES),
        optional=True,
        advanced=True,
        tooltip=tooltips.QUANT_COMPUTE,
        default="auto",
    )


def tile_inputs(size_tooltip: str = tooltips.TILE_SIZE) -> list:
    """The optional ``tile_size`` and ``tile_overlap`` inputs of the nodes that run the VAE."""
    return [
        io.Int.Input(
            "tile_size",
            optional=True,
            advanced=True,
            tooltip=size_tooltip,
            default=0,
            min=0,
            max=8192,
            step=16,
        ),
        io.Int.Input(
            "tile_overlap",
            optional=True,
            advanced=True,
            tooltip=tooltips.TILE_OVERLAP,
            default=64,
            min=0,
            max=512,
            step=16,
        ),
    ]


def file_choices(folder: str, first: str | None = None) -> list[str]:
    """The folder's files; an empty folder shows one entry saying so, naming ``first`` (the file to get;
    default the klein one, ``model_files.FIRST_FILE``)."""
    return host.filenames(folder) or [empty_folder_entry(folder, first)]


def file_path(folder: str, name: str, first: str | None = None) -> str:
    """The path of a chosen file; the empty folder's entry is refused with the file to get and its link."""
    if name == empty_folder_entry(folder, first) and not host.filenames(folder):
        raise Flux2Error(empty_folder_message(folder, first))
    return host.full_path(folder, name)
