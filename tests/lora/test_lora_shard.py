"""A LoRA's patches cut for one process of a tensor-parallel DiT (``lora.shard``): the pieces of every rank,
put back in the weight's order, are the whole model's change (the whole runs are in
tests/devices/test_parallel.py); DoRA on a sliced layer is refused by name."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from flux2_core.configs import Flux2Config
from flux2_core.devices.parallel import tensor_plan
from flux2_core.errors import Flux2Error
from flux2_core.lora.patches import DoRAPatch, LoKrPatch
from flux2_core.lora.shard import shard_patches
from flux2_core.ops import LowRankPatch

CONFIG = Flux2Config(
    hidden_size=64, num_heads=4, depth=1, depth_single_blocks=1, context_in_dim=48, axes_dim=(4,) * 4,
    guidance_embed=True,
)  # fmt: skip
H, MLP, WORLD = 64, CONFIG.mlp_hidden_dim, 2
CPU = torch.device("cpu")


def _rank(rank: int):
    return SimpleNamespace(comm=SimpleNamespace(mode="tensor", rank=rank, world=WORLD), config=CONFIG)


def _whole(patch, rows: int, cols: int) -> torch.Tensor:
    w = torch.zeros(rows, cols)
    offset, size = patch.rows or (0, rows)
    patch.apply(w.narrow(0, offset, size))
    return w


def _gathered(layer: str, patches, rows: int, cols: int) -> torch.Tensor:
    """Every rank's cut of ``patches`` applied to its share of a zero weight, put back in the whole one."""
    split = tensor_plan(CONFIG)[layer]
    whole = torch.zeros(rows, cols)
    for rank in range(WORLD):
        local = [0, 0]
        local[split.dim], local[1 - split.dim] = split.local(WORLD), (rows, cols)[1 - split.dim]
        w = torch.zeros(*local)
        for patch in shard_patches({layer: patches}, _rank(rank), "test").get(layer, []):
            offset, size = patch.rows or (0, w.shape[0])
            patch.apply(w.narrow(0, offset, size))
        index = torch.cat([torch.arange(a, b) for a, b in split.ranges(rank, WORLD)])
        whole.index_copy_(split.dim, index, w)
    return whole


def _lokr(w1, w2, strength):
    return LoKrPatch(w1=w1, w1_a=None, w1_b=None, w2=w2, w2_a=None, w2_b=None, strength=strength)


def test_every_ranks_cut_adds_up_to_the_whole_change():
    g = torch.Generator().manual_seed(0)
    q_only = LowRankPatch(torch.randn(H, 2, generator=g), torch.randn(2, H, generator=g), 0.5, rows=(0, H))
    whole_qkv = LowRankPatch(torch.randn(3 * H, 2, generator=g), torch.randn(2, H, generator=g), 0.7)
    lokr_mlp = _lokr(torch.randn(4, 2, generator=g), torch.randn(2 * MLP // 4, 32, generator=g), 0.9)
    lokr_proj = _lokr(torch.randn(4, 4, generator=g), torch.randn(16, (H + MLP) // 4, generator=g), 1.0)
    cases = [
        ("double_blocks.0.img_attn.qkv", [q_only, whole_qkv], 3 * H, H),
        ("double_blocks.0.txt_mlp.0", [lokr_mlp], 2 * MLP, H),
        ("single_blocks.0.linear2", [lokr_proj], H, H + MLP),
        ("double_blocks.0.img_attn.proj", [LowRankPatch(torch.randn(H, 2), torch.randn(2, H))], H, H),
    ]
    for layer, patches, rows, cols in cases:
        expected = sum(_whole(p, rows, cols) for p in patches)
        torch.testing.assert_close(_gathered(layer, patches, rows, cols), expected, atol=1e-6, rtol=0)
    # a replicated layer keeps its patches as they are
    final = {"final_layer.adaLN_modulation.1": [q_only]}
    assert shard_patches(final, _rank(1), "test") == final


def test_dora_on_a_sliced_layer_is_refused_by_name():
    inner = LowRankPatch(torch.ones(3 * H, 1), torch.ones(1, H))
    dora = {"double_blocks.0.img_attn.qkv": [DoRAPatch(inner, torch.ones(3 * H, 1))]}
    with pytest.raises(Flux2Error, match="style.safetensors is a DoRA on double_blocks.0.img_attn.qkv") as e:
        shard_patches(dora, _rank(0), "style.safetensors")
    assert "--parallel sequence" in str(e.value)
