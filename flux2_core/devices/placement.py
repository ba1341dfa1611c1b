"""One DiT across several devices in one process: each block on one device, activations moved between them.

For a model that fits on no single card (FLUX.2 [dev]: 64 GB of bf16 weights on two 40-48 GB cards) without
torch.distributed. The blocks are split into contiguous runs of about equal weight bytes (or in given
proportions); everything outside the blocks (embedders, modulations, the final layer) stays on the first
device, where the sampler keeps its latents. A pre-hook on every block (and on the final layer) moves the
block's tensor inputs to the device its weights are on *when it runs*, so a host that offloads some blocks
(ComfyUI unloading one card) still gets a correct, only slower, run. Blocks compute exactly as on one device:
the results are bit-identical (the same kernels run on the same values); only the copies are added.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import Flux2Error
from ..hooks import moved

HOOKS = "_flux2_placement_hooks"


@dataclass
class BlockPlacement:
    """Where each block of a model lives, and the weight bytes each device holds."""

    devices: list[torch.device]
    block_device: list[int]  # per block (run order): index into ``devices``
    bytes_per_device: list[int] = field(default_factory=list)  # weight bytes per entry of ``devices``

    def describe(self) -> str:
        parts = []
        for i, device in enumerate(self.devices):
            blocks = [b for b, d in enumerate(self.block_device) if d == i]
            span = f"blocks {blocks[0]}-{blocks[-1]}" if blocks else "no blocks"
            extra = " and the rest" if i == 0 else ""
            parts.append(f"{device}: {span}{extra}, {self.bytes_per_device[i] / 1e9:.2f} GB")
        return "; ".join(parts)


def parse_devices(text: str) -> list[torch.device]:
    """``"cuda:0,cuda:1"`` -> devices; each must exist (clear error otherwise)."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise Flux2Error("no device given: list them separated by commas, e.g. cuda:0,cuda:1")
    out = []
    for name in names:
        try:
            device = torch.device(name)
        except RuntimeError:
            raise Flux2Error(f"{name!r} is not a device name: use e.g. cuda:0,cuda:1 (or cpu)") from None
        if device.type == "cuda":
            count = torch.cuda.device_count()
            index = 0 if device.index is None else device.index
            if index >= count:
                raise Flux2Error(f"{name} does not exist: this machine has {count} CUDA device(s)")
        out.append(device)
    return out


def split_devices(text: str | None, streamed: bool = False) -> list[torch.device]:
    """The devices a loader's ``devices`` text splits the blocks across (empty text: none, the host's device),
    refused with block streaming, which copies every block to one device as it runs."""
    if not text or not text.strip():
        return []
    if streamed:
        raise Flux2Error(
            "devices and offload 'stream' cannot be combined: streaming copies every block to ComfyUI's GPU "
            "as it runs, the split keeps each block on its own card. Set offload to none to split the model, "
            "or clear devices to stream it"
        )
    return parse_devices(text)


def plan_split(block_bytes: Sequence[int], shares: Sequence[float], first_extra: int = 0) -> list[int]:
    """Device index per block: contiguous runs whose bytes follow ``shares`` (one per device); the first
    device's share also covers ``first_extra`` bytes kept there (the parts outside the blocks)."""
    if not shares or any(s < 0 for s in shares) or sum(shares) <= 0:
        raise Flux2Error(f"device shares {list(shares)} must be non-negative and not all zero")
    total = sum(block_bytes) + first_extra
    bounds, acc = [], 0.0
    for share in shares:
        acc += share / sum(shares)
        bounds.append(acc * total)
    out, filled, device = [], first_extra, 0
    for nbytes in block_bytes:
        # move on once this block's midpoint lies past the current device's bound
        while device < len(shares) - 1 and filled + nbytes / 2 > bounds[device]:
            device += 1
        out.append(device)
        filled += nbytes
    return out


def place_blocks(net: nn.Module, devices: Sequence[torch.device | str], shares=None) -> BlockPlacement:
    """Move ``net``'s blocks (``net.blocks()``, in run order) across ``devices`` and the rest to the first.

    ``shares``: relative weight bytes per device (default equal). Placing again replaces the split;
    ``remove_placement`` undoes the hooks (the weights stay where they are).
    """
    devices = [torch.device(d) for d in devices]
    remove_placement(net)
    blocks = list(net.blocks())
    block_bytes = [_bytes(block) for block in blocks]
    rest = _bytes(net) - sum(block_bytes)
    plan = plan_split(block_bytes, shares or [1.0] * len(devices), rest)
    in_blocks = {id(m) for block in blocks for m in block.modules()}
    for module in net.modules():  # the parts outside the blocks, on the first device
        if id(module) not in in_blocks:
            _move_own(module, devices[0])
    handles = []
    for block, index in zip(blocks, plan):
        block.to(devices[index])
        handles.append(block.register_forward_pre_hook(_to_own_device, with_kwargs=True))
    final = getattr(net, "final_layer", None)
    if final is not None:
        handles.append(final.register_forward_pre_hook(_to_own_device, with_kwargs=True))
    setattr(net, HOOKS, handles)
    placement = BlockPlacement(devices, plan, [rest] + [0] * (len(devices) - 1))
    for nbytes, index in zip(block_bytes, plan):
        placement.bytes_per_device[index] += nbytes
    return placement


def remove_placement(net: nn.Module) -> None:
    for handle in getattr(net, HOOKS, ()):
        handle.remove()
    if hasattr(net, HOOKS):
        delattr(net, HOOKS)


def _to_own_device(module: nn.Module, args: tuple, kwargs: dict):
    device = _device_of(module)
    if device is None:
        return None
    return moved(args, device), moved(kwargs, device)


def _device_of(module: nn.Module) -> torch.device | None:
    for tensor in module.parameters():
        return tensor.device
    for tensor in module.buffers():
        return tensor.device
    return None


def _move_own(module: nn.Module, device: torch.device) -> None:
    """Move the parameters and buffers a module holds directly (not its children's)."""
    for name, p in list(module._parameters.items()):
        if p is not None and p.device != device:
            module._parameters[name] = nn.Parameter(p.data.to(device), requires_grad=p.requires_grad)
    for name, b in list(module._buffers.items()):
        if b is not None and b.device != device:
            module._buffers[name] = b.to(device)


def _bytes(module: nn.Module) -> int:
    return sum(t.nbytes for t in module.parameters()) + sum(t.nbytes for t in module.buffers())
