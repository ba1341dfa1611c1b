"""A DiT's blocks split across several devices in one process (the model loader's ``devices``), under
ComfyUI's memory manager: one patcher per device.

A ComfyUI ModelPatcher moves the whole module it manages to its one load device, so a model split across
devices gets one patcher per device, each managing a holder of the modules placed there: the blocks of that
device and, on the first device, everything outside the blocks (embedders, modulations, final layer: where
the latents live). ``place_blocks`` plans the split (contiguous runs of blocks of about equal weight bytes)
and hooks every block, so that its inputs move to the device its weights are on when it runs. The weights
stay on the offload device the loader built them on until the sampler loads the model: all patchers in one
``load_models_gpu`` call, so ComfyUI makes room on every device before it moves anything (a text encoder
that ran on one of the cards is evicted, not overflowed). Should ComfyUI later offload one part to make
room, the hooks keep a run correct, only slower: each block computes where its weights are.
"""

from __future__ import annotations

import torch
from torch import nn

from ..flux2_core import Flux2Error, place_blocks
from . import host


def split_patchers(net: nn.Module, devices: list[torch.device], offload_device: torch.device):
    """(patchers in device order, description) for ``net`` split across ``devices`` (two or more)."""
    blocks = net.blocks()
    # The plan and the hooks only: every part is already on the offload device, so nothing moves here.
    plan = place_blocks(net, [offload_device] * len(devices)).block_device
    held: list[list[nn.Module]] = [[] for _ in devices]
    held[0] = _outside_blocks(net, blocks)
    for block, index in zip(blocks, plan):
        held[index].append(block)
    patchers = [
        host.manage(nn.ModuleList(modules), device, offload_device) for modules, device in zip(held, devices)
    ]
    total = sum(t.nbytes for t in net.state_dict().values())
    if sum(p.size for p in patchers) != total:  # a weight in no holder would never reach its device
        raise Flux2Error(
            f"{type(net).__name__} holds weights outside its blocks and its top-level parts, so its blocks "
            "cannot be split across devices: clear devices"
        )
    parts = []
    for index, (device, patcher) in enumerate(zip(devices, patchers)):
        mine = [b for b, d in enumerate(plan) if d == index]
        span = (
            f"blocks {mine[0]}-{mine[-1]}" if len(mine) > 1 else f"block {mine[0]}" if mine else "no blocks"
        )
        rest = " and the rest" if index == 0 else ""
        parts.append(f"{device}: {span}{rest}, {patcher.size / 1e9:.2f} GB")
    return patchers, "; ".join(parts)


def _outside_blocks(net: nn.Module, blocks: list[nn.Module]) -> list[nn.Module]:
    """The top-level children of ``net`` that hold no block (the block lists themselves are left out)."""
    inside = {id(m) for block in blocks for m in block.modules()}
    return [child for child in net.children() if not any(id(m) in inside for m in child.modules())]
