"""``--parallel tensor|sequence``: the command line's FLUX.2 run over several processes (``parallel.py``).

Under ``torchrun --nproc-per-node N -m flux2_core generate ... --parallel MODE`` every process runs the same
``generate``; ``Ranks`` is where they differ. Rank 0 alone encodes the prompts (the text encoder never loads
elsewhere), references and the image to edit, and alone decodes and writes; its tensors are broadcast so every
process samples the same inputs with its part of the DiT. Without ``--parallel`` the single-process ``Ranks``
does nothing at all, so one code path serves both.

Where the other processes wait for rank 0's work (its text conditioning, then its references and image
latents), every process first takes part in a small exchange of its status. A process that stops before such
an exchange (rank 0 over a bad text encoder file, a rank that runs out of memory, an interrupt) brings its
error there instead of leaving, so every other process ends at once with "rank N stopped: ..." while the
process itself reports its own error. A process that leaves or stalls elsewhere (during sampling, whose loop
runs the DiT's collectives only) is noticed by the others' next collective, which ends with an error naming
the wait, after ``FLUX2_PARALLEL_TIMEOUT_MIN`` minutes at most.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re

import torch
import torch.distributed as dist

from ..devices.parallel import (
    TIMEOUT_ENV,
    broadcast_conditioning,
    broadcast_references,
    broadcast_tensor,
    close_distributed,
    collective_timeout,
    gather_object,
    init_distributed,
)
from ..devices.parallel_load import load_transformer_parallel, planned_weight_bytes
from ..dit.files import load_transformer
from ..errors import Flux2Error, OutOfMemory
from . import inputs

log = logging.getLogger("flux2_core")


TEXT, INPUTS = "text conditioning", "references and image latents"  # what rank 0 shares, in order


class Ranks:
    """One process, alone: every step is its own. ``with ranks:`` ends the run: the process group is left,
    and a process that stops first tells the others (``ParallelRanks``)."""

    is_main = True
    is_parallel = False
    mode: str | None = None
    on_this_host = 1  # processes of this run on this host, each with its own DiT in RAM

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace) -> None:
        try:
            if error is not None:
                self.stopping(error)
        finally:
            self.close()

    def stopping(self, error: BaseException) -> None:
        pass

    def waiting(self, what: str):
        """Around collectives: the process group's errors (a peer left, the timeout) as ``Flux2Error``."""
        return contextlib.nullcontext()

    def share_text(self, conditioning: torch.Tensor | None) -> torch.Tensor:
        return conditioning

    def share_inputs(self, references, start, mask):
        return references, start, mask

    def dit_bytes(self, path, dtype: torch.dtype, whole: int) -> int:
        return whole

    def load_transformer(self, path, variant: str, dtype: torch.dtype, keep: bool, compute: str = "auto"):
        return load_transformer(
            path, variant=variant, dtype=dtype, device="cpu", keep_quantized=keep, quant_compute=compute
        )

    def close(self) -> None:
        pass


class ParallelRanks(Ranks):
    """This process in a ``torchrun`` group: its part of the DiT, the main rank's inputs."""

    def __init__(self, mode: str, device_name: str | None):
        self.mode = mode
        self.dist = init_distributed(device_name or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.is_main = self.dist.is_main
        self.is_parallel = True
        self.device = self.dist.device
        self.on_this_host = processes_on_this_host(self.dist.world)
        self._next: str | None = TEXT  # the exchange every process meets next (None: none is left)
        # the status exchanges run on the CPU (gloo) under NCCL too: their long waits (rank 0 alone runs the
        # text encoder) end in an error this process reports, and a failure reaches the others from the host
        self._status_group = dist.new_group(backend="gloo", timeout=collective_timeout())
        if not self.is_main:  # one log and one progress bar: the main rank's; the others' problems say whose
            log.setLevel(logging.WARNING)
            log.addFilter(_RankPrefix(self.dist.rank))

    def share_text(self, conditioning):
        with self._exchange(TEXT, then=INPUTS):
            return broadcast_conditioning(conditioning).cpu()

    def share_inputs(self, references, start, mask):
        with self._exchange(INPUTS, then=None):
            references = broadcast_references(references)
            start, mask = broadcast_tensor(start), broadcast_tensor(mask)
        return references, None if start is None else start.cpu(), None if mask is None else mask.cpu()

    @contextlib.contextmanager
    def _exchange(self, name: str, then: str | None):
        """Every process's status (None: ready), then what rank 0 shares; any process's failure ends all."""
        self._next = None  # from here on a failure is seen by the others' collectives
        with self.waiting(f"waiting for rank 0's {name}" if not self.is_main else f"sharing the {name}"):
            stopped = [
                f"rank {r} stopped: {m}"
                for r, m in enumerate(gather_object(None, self._status_group))
                if m is not None
            ]
            if stopped:
                raise Flux2Error("; ".join(stopped))
            yield
        self._next = then

    def stopping(self, error):
        """This process stopped: it brings its error to the exchange the others wait in (or will)."""
        name, self._next = self._next, None
        if name is None:
            return
        where = f"where they wait for the {name}"
        (log.info if self.is_main else log.warning)("stopping: telling the other processes, %s", where)
        try:
            with self.waiting(f"telling the other processes that this one stopped ({where})"):
                gather_object(_describe(error), self._status_group)
        except Flux2Error as e:  # they left or stall: this process's own error is still the one to report
            log.warning("%s", e)

    @contextlib.contextmanager
    def waiting(self, what):
        try:
            yield
        except Exception as e:
            if not _group_error(e):
                raise
            raise Flux2Error(_explain(what, e)) from None

    def dit_bytes(self, path, dtype, whole):
        return planned_weight_bytes(path, self.mode, self.dist.world, dtype, self.dist.rank)

    def load_transformer(self, path, variant, dtype, keep, compute="auto"):
        return load_transformer_parallel(
            path, self.mode, variant, dtype, "cpu", keep_quantized=keep, quant_compute=compute
        )

    def close(self) -> None:
        close_distributed()


def processes_on_this_host(world: int) -> int:
    """The processes of this run on this host: torchrun's LOCAL_WORLD_SIZE, else all ``world`` of them."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "")))
    except ValueError:
        return world


def _describe(error: BaseException) -> str:
    if isinstance(error, Flux2Error):
        return str(error)
    if isinstance(error, OutOfMemory):
        return "out of memory"
    if isinstance(error, KeyboardInterrupt):
        return "interrupted"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _group_error(error: Exception) -> bool:
    """An error of the process group (NCCL's as ``DistError``, gloo's as plain ``RuntimeError``)."""
    if isinstance(error, dist.DistError):
        return True
    return type(error) is RuntimeError and re.search(r"gloo|nccl", str(error), re.IGNORECASE) is not None


def _explain(what: str, error: Exception) -> str:
    text = re.sub(r"^\[[^\]]*\]\s*", "", (str(error).strip() or "?").splitlines()[0])  # gloo's source path
    text = text.split(". ")[0].rstrip(".")  # its first sentence
    if re.search(r"timed? ?out", text, re.IGNORECASE):
        minutes = collective_timeout().total_seconds() / 60
        return (
            f"{what}: no answer from the other processes in {minutes:g} min ({TIMEOUT_ENV}): one of them "
            "stopped or stalls; see the other ranks' logs for the first error (if rank 0 is only slow, e.g. "
            f"loading a large text encoder, set {TIMEOUT_ENV} higher)"
        )
    return (
        f"{what}: another process left the run ({text[:200]}): see the other ranks' logs for the first error"
    )


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
    }
    given = [name for name, on in refused.items() if on]
    if given:
        raise Flux2Error(
            f"--parallel {args.parallel} cannot run with {', '.join(given)}: leave --parallel out"
        )
    if args.device is not None and torch.device(args.device).index is not None:
        raise Flux2Error(
            f"--device {args.device}: with --parallel each process takes its own GPU (cuda:LOCAL_RANK); give "
            "--device cuda or --device cpu"
        )
    return ParallelRanks(args.parallel, args.device)
