"""``--parallel tensor|sequence``: the command line's FLUX.2 run over several processes (``parallel.py``).

Under ``torchrun --nproc-per-node N -m flux2_core generate ... --parallel MODE`` every process runs the same
``generate``; ``Ranks`` is where they differ. Rank 0 alone encodes the prompts (the text encoder never loads
elsewhere), references and the image to edit, and alone decodes and writes; its tensors are broadcast so every
process samples the same inputs with its part of the DiT. Without ``--parallel`` the single-process ``Ranks``
does nothing at all, so one code path serves both.
"""

from __future__ import annotations

import argparse
import logging

import torch

from ..devices.parallel import (
    broadcast_conditioning,
    broadcast_references,
    broadcast_tensor,
    close_distributed,
    init_distributed,
)
from ..devices.parallel_load import load_transformer_parallel, planned_weight_bytes
from ..dit.files import load_transformer
from ..errors import Flux2Error
from . import inputs

log = logging.getLogger("flux2_core")


class Ranks:
    """One process, alone: every step is its own."""

    is_main = True
    mode: str | None = None

    def __init__(self, device: torch.device):
        self.device = device

    def share_text(self, conditioning: torch.Tensor | None) -> torch.Tensor:
        return conditioning

    def share_inputs(self, references, start, mask):
        return references, start, mask

    def dit_bytes(self, path, dtype: torch.dtype, whole: int) -> int:
        return whole

    def load_transformer(self, path, variant: str, dtype: torch.dtype, keep: bool):
        return load_transformer(path, variant=variant, dtype=dtype, device="cpu", keep_quantized=keep)

    def close(self) -> None:
        pass


class ParallelRanks(Ranks):
    """This process in a ``torchrun`` group: its part of the DiT, the main rank's inputs."""

    def __init__(self, mode: str, device_name: str | None):
        self.mode = mode
        self.dist = init_distributed(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.is_main = self.dist.is_main
        self.device = self.dist.device
        if not self.is_main:  # one log and one progress bar: the main rank's; the others' problems say whose
            log.setLevel(logging.WARNING)
            log.addFilter(_RankPrefix(self.dist.rank))

    def share_text(self, conditioning):
        return broadcast_conditioning(conditioning).cpu()

    def share_inputs(self, references, start, mask):
        references = broadcast_references(references)
        start, mask = broadcast_tensor(start), broadcast_tensor(mask)
        return references, None if start is None else start.cpu(), None if mask is None else mask.cpu()

    def dit_bytes(self, path, dtype, whole):
        return planned_weight_bytes(path, self.mode, self.dist.world, dtype, self.dist.rank)

    def load_transformer(self, path, variant, dtype, keep):
        return load_transformer_parallel(path, self.mode, variant, dtype, "cpu", keep_quantized=keep)

    def close(self) -> None:
        close_distributed()


class _RankPrefix(logging.Filter):
    def __init__(self, rank: int):
        super().__init__()
        self.rank = rank

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = f"rank {self.rank}: {record.msg}"
        return True


def ranks_for(args: argparse.Namespace, fill: bool) -> Ranks:
    """The ``Ranks`` of this run, after refusing what a parallel run cannot do."""
    if args.parallel is None:
        return Ranks(inputs.device_for(args.device))
    refused = {
        "FLUX.1 Fill [dev]": fill,
        "--offload stream": args.offload != "none",
        "--lora (with --parallel tensor, each process holds slices of the layers a LoRA patches)": bool(
            args.lora
        )
        and args.parallel == "tensor",
    }
    given = [name for name, on in refused.items() if on]
    if given:
        raise Flux2Error(
            f"--parallel {args.parallel} cannot run with {', '.join(given)}: leave --parallel out"
            + (", or use --parallel sequence" if args.lora and args.parallel == "tensor" else "")
        )
    if args.device is not None and torch.device(args.device).index is not None:
        raise Flux2Error(
            f"--device {args.device}: with --parallel each process takes its own GPU (cuda:LOCAL_RANK); give "
            "--device cuda or --device cpu"
        )
    return ParallelRanks(args.parallel, args.device)
