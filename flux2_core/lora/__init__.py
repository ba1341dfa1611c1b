"""LoRAs of every common trainer layout, applied at compute time: reading a file (``read``), naming its keys
in ours (``keys``), matching it to a model (``match``) and refusing one made for another (``refusals``),
building the weight patches (``patches``), the report of what matched (``report``), preparing a LoRA for
one model (``prepare``) and applying it for a run (``apply``)."""

from .apply import applied, attach, detach, patched
from .keys import DIT, TE
from .prepare import Lora, prepare_lora
from .read import LoraFile, read_lora
from .report import BlockStrengths, LoraReport, parse_block_strengths

__all__ = [
    "DIT",
    "TE",
    "BlockStrengths",
    "Lora",
    "LoraFile",
    "LoraReport",
    "applied",
    "attach",
    "detach",
    "parse_block_strengths",
    "patched",
    "prepare_lora",
    "read_lora",
]
