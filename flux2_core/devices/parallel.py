"""One FLUX.2 DiT run by several processes with ``torch.distributed``: tensor or Ulysses sequence parallelism.

Every process (one per GPU under ``torchrun``; gloo processes on the CPU) holds the same model and runs
``sampling.sample`` unchanged with identical inputs: the text conditioning encoded on rank 0 and broadcast
(``broadcast_conditioning``), references likewise (``broadcast_references``), the same seed (the noise comes
from a CPU generator, so it is the same everywhere), steps, sizes and guidance. Every process then ends with
the same latents; rank 0 decodes and writes them. The DiT holds a ``comm`` (``dit.comm.LocalComm`` is the
one-process one) and calls it around its blocks; the blocks see none of it:

- ``tensor``: the BFL fused layout is kept and sliced as it loads (``parallel_load``); each process holds
  ``heads / p`` heads and ``1 / p`` of the MLP. Column-parallel layers (rows sliced): ``*_attn.qkv`` as
  ``[q_r; k_r; v_r]``, ``*_mlp.0`` as ``[gate_r; up_r]``, single ``linear1`` as ``[q_r; k_r; v_r; gate_r;
  up_r]``; row-parallel layers (columns sliced): ``*_attn.proj``, ``*_mlp.2``, single ``linear2`` as
  ``[attention block r, MLP block r]``. Everything else is replicated. The partial output of each
  row-parallel layer is summed with one ``all_reduce`` in a forward hook on the layer: 4 per double block
  and 1 per single block. p must divide the heads and the MLP width.
- ``sequence`` (Ulysses): weights are replicated; text and image (+ reference) tokens are split separately
  into p equal shares (zero tokens are padded to the end of each when p does not divide them; they are never
  attended to and are dropped at the end), RoPE is computed for the local ids, every attention trades the
  sequence for heads with ``all_to_all`` ([B, h, L/p, D] -> [B, h/p, L, D]; ``layers.BlockCall``), attends
  and trades back, and the image tokens are gathered after the last block. p must divide the heads.

In float32 both give the one-process result to about 1e-7 (the sums run in another order); in bfloat16 the
partial sums are rounded before they are added, so results are close, not equal (int8 layers too: their
activations are quantised per share under tensor parallelism).

A run (``torchrun --nproc-per-node N -m flux2_core generate ... --parallel tensor|sequence``), on every rank:
``d = init_distributed(device)``; ``model = load_transformer_parallel(path, mode, variant, dtype, d.device)``;
on rank 0 only, encode the prompt (and the references); ``broadcast_conditioning`` (and
``broadcast_references``, ``broadcast_tensor`` for a start latent or a mask) on every rank; ``sample`` with
the same settings; rank 0 decodes and writes; ``close_distributed``. Every rank must make the same calls in
the same order (an interrupt on one rank alone would stall the others). LoRAs apply in both modes: under
tensor parallelism each process adds its slice of every change, cut as its weight is (``lora.shard``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from ..configs import Flux2Config
from ..dit.comm import LocalComm, SequenceComm, TensorComm  # noqa: F401  (importable here)
from ..dit.layers import DoubleStreamBlock, SingleStreamBlock
from ..errors import Flux2Error
from ..references import ReferenceLatents

MODES = ("tensor", "sequence")


@dataclass(frozen=True)
class Distributed:
    """This process in the group: its rank, the number of processes, the group and its compute device."""

    rank: int
    world: int
    group: dist.ProcessGroup
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str | torch.device = "cuda") -> Distributed:
    """Join the process group ``torchrun`` describes (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT): NCCL
    with one GPU per process (``cuda:LOCAL_RANK``) for ``cuda``, gloo for ``cpu``."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        raise Flux2Error(
            "parallel runs start one process per GPU: run under torchrun, e.g. "
            "torchrun --nproc-per-node 2 -m flux2_core generate ... --parallel tensor"
        )
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise Flux2Error("--device cuda was asked for but no CUDA GPU is available")
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        backend = "nccl"
    elif device.type == "cpu":
        backend = "gloo"
    else:
        raise Flux2Error(f"parallel runs use CUDA GPUs (NCCL) or the CPU (gloo), not {device.type}")
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=collective_timeout())
    return Distributed(dist.get_rank(), dist.get_world_size(), dist.group.WORLD, device)


TIMEOUT_ENV, DEFAULT_TIMEOUT_MIN = "FLUX2_PARALLEL_TIMEOUT_MIN", 60.0


def collective_timeout() -> timedelta:
    """How long a collective waits for the other processes: long enough for rank 0 alone to load and run a
    24B text encoder while the others wait in their first broadcast (PyTorch's default, 10 minutes for
    NCCL, can fire first). ``FLUX2_PARALLEL_TIMEOUT_MIN`` sets it in minutes."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    try:
        minutes = float(raw) if raw else DEFAULT_TIMEOUT_MIN
    except ValueError:
        minutes = -1.0
    if not minutes > 0:
        raise Flux2Error(f"{TIMEOUT_ENV}={raw!r} is not a number of minutes above 0: set it to e.g. 60")
    return timedelta(minutes=minutes)


def close_distributed() -> None:
    """Leave the process group (at the end of a run)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def comm_device(group=None) -> torch.device:
    """Where the group's collectives take tensors: this process's GPU for NCCL, the CPU for gloo."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_object(obj, src: int = 0, group=None):
    """``obj`` of rank ``src`` on every rank (small picklable values: shapes, sizes, settings)."""
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group, device=comm_device(group))
    return box[0]


def gather_object(obj, group=None) -> list:
    """Every rank's ``obj`` (small picklable values), in rank order, on every rank."""
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def broadcast_tensor(tensor: torch.Tensor | None, src: int = 0, group=None) -> torch.Tensor | None:
    """Rank ``src``'s tensor (or None) on every rank, on the group's device; other ranks pass anything."""
    meta = broadcast_object(None if tensor is None else (tuple(tensor.shape), tensor.dtype), src, group)
    if meta is None:
        return None
    device = comm_device(group)
    if dist.get_rank(group) == src:
        out = tensor.to(device).contiguous()
    else:
        out = torch.empty(meta[0], dtype=meta[1], device=device)
    dist.broadcast(out, src=src, group=group)
    return out


def broadcast_conditioning(conditioning: torch.Tensor | None, src: int = 0, group=None) -> torch.Tensor:
    """The text conditioning [B, T, C] encoded on rank ``src`` (the text encoder runs there only), on every
    rank."""
    out = broadcast_tensor(conditioning, src, group)
    if out is None:
        raise Flux2Error(f"rank {src} has no text conditioning to broadcast")
    return out


def broadcast_references(references, src: int = 0, group=None):
    """Rank ``src``'s ``ReferenceLatents`` (or None) on every rank, tokens and ids on the CPU."""
    shape = None if references is None else (list(references.grid_sizes), references.strengths)
    shape = broadcast_object(shape, src, group)
    if shape is None:
        return None
    tokens = broadcast_tensor(None if references is None else references.tokens, src, group)
    ids = broadcast_tensor(None if references is None else references.ids, src, group)
    grids, strengths = shape
    return ReferenceLatents(tokens.cpu(), ids.cpu(), [tuple(g) for g in grids], tuple(strengths))


@dataclass(frozen=True)
class Split:
    """How a linear weight is sliced: along ``dim`` (0: rows, column-parallel; 1: columns, row-parallel),
    made of consecutive ``blocks`` (q, k, v, gate, up...), each cut into p equal shares."""

    dim: int
    blocks: tuple[int, ...]

    def ranges(self, rank: int, world: int) -> list[tuple[int, int]]:
        """[start, stop) of rank's share of every block, in order."""
        out, offset = [], 0
        for size in self.blocks:
            share = size // world
            out.append((offset + rank * share, offset + (rank + 1) * share))
            offset += size
        return out

    def local(self, world: int) -> int:
        return sum(self.blocks) // world


def check_world(config: Flux2Config, world: int, mode: str) -> None:
    """p must divide the heads (both modes) and the MLP width (tensor parallelism)."""
    if mode not in MODES:
        raise Flux2Error(f"unknown parallel mode {mode!r}: choose {' or '.join(MODES)}")
    heads, mlp = config.num_heads, config.mlp_hidden_dim
    if world < 1 or heads % world or (mode == "tensor" and mlp % world):
        valid = [p for p in range(1, heads + 1) if heads % p == 0 and (mode != "tensor" or mlp % p == 0)]
        widths = f" and its MLP width {mlp}" if mode == "tensor" else ""
        raise Flux2Error(
            f"{mode} parallelism over {world} processes needs a process count that divides the model's "
            f"{heads} heads{widths}: use one of {', '.join(map(str, valid))} processes"
        )


def tensor_plan(config: Flux2Config) -> dict[str, Split]:
    """Layer name -> its ``Split`` for tensor parallelism (the layers not named are replicated)."""
    hidden, mlp = config.hidden_size, config.mlp_hidden_dim
    plan = {}
    for i in range(config.depth):
        for stream in ("img", "txt"):
            block = f"double_blocks.{i}.{stream}"
            plan[f"{block}_attn.qkv"] = Split(0, (hidden, hidden, hidden))
            plan[f"{block}_attn.proj"] = Split(1, (hidden,))
            plan[f"{block}_mlp.0"] = Split(0, (mlp, mlp))
            plan[f"{block}_mlp.2"] = Split(1, (mlp,))
    for i in range(config.depth_single_blocks):
        plan[f"single_blocks.{i}.linear1"] = Split(0, (hidden, hidden, hidden, mlp, mlp))
        plan[f"single_blocks.{i}.linear2"] = Split(1, (hidden, mlp))
    return plan


def shard_module(module: nn.Module, plan: dict[str, Split], world: int) -> None:
    """Narrow a meta-built DiT to one process's share: the planned linear layers' shapes and the blocks'
    local head counts and widths (nothing is read or allocated)."""
    for name, split in plan.items():
        layer = module.get_submodule(name)
        if layer.bias is not None:
            raise Flux2Error(f"{name} has a bias, which tensor parallelism does not split")
        shape = [layer.out_features, layer.in_features]
        shape[split.dim] = split.local(world)
        layer.out_features, layer.in_features = shape
        layer.weight = nn.Parameter(
            torch.empty(shape, dtype=layer.weight.dtype, device="meta"), requires_grad=False
        )
    for block in module.modules():
        if isinstance(block, DoubleStreamBlock):
            for attn in (block.img_attn, block.txt_attn):
                attn.num_heads //= world
        elif isinstance(block, SingleStreamBlock):
            block.num_heads //= world
            block.hidden //= world
            block.mlp_rows //= world


def use_comm(transformer: nn.Module, comm: LocalComm) -> None:
    """Run ``transformer`` as one process of ``comm``'s group: the transformer holds the communicator, and
    under tensor parallelism each row-parallel layer sums its partial outputs in a forward hook."""
    transformer.comm = comm
    if isinstance(comm, TensorComm):
        for name, split in tensor_plan(transformer.config).items():
            if split.dim == 1:
                transformer.get_submodule(name).register_forward_hook(comm.sum_partials)


def parallelize_sequence(model, group=None) -> None:
    """Run a loaded (replicated) model with Ulysses sequence parallelism over ``group``, in place."""
    net = getattr(model, "transformer", model)
    check_world(net.config, dist.get_world_size(group), "sequence")
    use_comm(net, SequenceComm(group))


@dataclass(frozen=True)
class ParallelInfo:
    """How this process holds a parallel model: the mode, its rank of ``world``, the bytes of weights it
    holds and the tensor bytes it read from the file."""

    mode: str
    rank: int
    world: int
    weight_bytes: int
    bytes_read: int | None

    def describe(self) -> str:
        read = "" if self.bytes_read is None else f", read {self.bytes_read / 1e9:.2f} GB"
        return (
            f"{self.mode} parallel, rank {self.rank} of {self.world}: "
            f"{self.weight_bytes / 1e9:.2f} GB of weights{read}"
        )


def held_bytes(module: nn.Module) -> int:
    """Bytes of every parameter and buffer (meta tensors count their planned size)."""
    tensors = {id(t): t for t in (*module.parameters(), *module.buffers())}
    return sum(math.prod(t.shape) * t.element_size() for t in tensors.values())


def parallel_info(model) -> ParallelInfo | None:
    """The ``ParallelInfo`` of a model loaded by ``load_transformer_parallel`` (None otherwise)."""
    return getattr(getattr(model, "transformer", model), "parallel_info", None)
