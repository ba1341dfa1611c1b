"""Under ``torch.compile`` the DiT is one graph: no graph break in float32 on the CPU, nor on the path a GPU
takes (the reference ops, bfloat16), with or without references, the 9B-KV cache, reference strengths or a
regional mask (also with references or the cache). The RoPE table, the attention kernel and the ops are
chosen in plain PyTorch inside the call, and nothing in it reads a clock or a Python-side cache."""

from __future__ import annotations

import pytest
import torch

from flux2_core.configs import Flux2Config
from flux2_core.dit import block_ops
from flux2_core.dit.attention import GroupedMask, KeyGroup
from flux2_core.dit.call import CallExtras, RegionalMask
from flux2_core.dit.rope import image_ids, reference_ids
from flux2_core.dit.transformer import Flux2Transformer

T, GRID, REF = 7, (4, 4), (2, 4)


def _net(dtype) -> Flux2Transformer:
    net = Flux2Transformer(Flux2Config(256, 2, 1, 2, 96))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.05 + (p.ndim == 1))
    return net.to(dtype).eval()


def _extras(name: str, net: Flux2Transformer, dtype) -> CallExtras:
    g = torch.Generator().manual_seed(1)
    ref = torch.randn(1, REF[0] * REF[1], 128, generator=g).to(dtype)
    ref_ids = reference_ids([REF])
    if name == "plain":
        return CallExtras()
    if name == "references":
        return CallExtras(references=(ref, ref_ids))
    if name == "reference strengths":
        return CallExtras(references=(ref, ref_ids), reference_bias=torch.full((8,), -0.7, dtype=dtype))
    if name == "kv cache":
        return CallExtras(kv_cache=net.encode_reference_kv(ref, ref_ids))
    tokens = T + GRID[0] * GRID[1]
    text, image = torch.arange(T), torch.arange(T, tokens)
    if name == "regions":
        groups = (KeyGroup(text, torch.cat([text, image])), KeyGroup(image, None))
        return CallExtras(regions=GroupedMask(tokens, groups))
    # a global prompt of 3 tokens, a region's 4 over the first half of the image
    glob, region, inside = text[:3], text[3:], image[: image.numel() // 2]
    groups = (
        KeyGroup(glob, torch.cat([glob, image])),
        KeyGroup(region, torch.cat([region, inside])),
        KeyGroup(inside, torch.cat([text, image])),
        KeyGroup(image[image.numel() // 2 :], torch.cat([glob, image])),
    )
    mask = RegionalMask(tokens, groups, T, 3)
    bias = torch.full((8,), -0.7, dtype=dtype)
    if name == "regions with the kv cache":
        return CallExtras(kv_cache=net.encode_reference_kv(ref, ref_ids), reference_bias=bias, regions=mask)
    return CallExtras(references=(ref, ref_ids), reference_bias=bias, regions=mask)


CASES = [
    *[
        ("cpu float32", case)
        for case in (
            "plain",
            "references",
            "reference strengths",
            "kv cache",
            "regions",
            "regions with references",
            "regions with the kv cache",
        )
    ],
    *[("gpu form (plain ops, bfloat16)", case) for case in ("plain", "references")],
]


@pytest.mark.parametrize("path, case", CASES)
def test_the_dit_traces_as_one_graph(monkeypatch, path, case):
    dtype = torch.float32 if path == "cpu float32" else torch.bfloat16
    if dtype != torch.float32:
        monkeypatch.setenv(block_ops.OPS_ENV, "plain")
    net = _net(dtype)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, GRID[0] * GRID[1], 128, generator=g).to(dtype)
    ctx = torch.randn(1, T, 96, generator=g).to(dtype)
    t = torch.tensor([0.5])
    torch._dynamo.reset()
    with torch.inference_mode():
        extras = _extras(case, net, dtype)
        eager = net(x, image_ids(*GRID), t, ctx, extras)
        explained = torch._dynamo.explain(net)(x, image_ids(*GRID), t, ctx, extras)
    torch._dynamo.reset()
    reasons = [str(b.reason).splitlines()[0] for b in explained.break_reasons]
    assert explained.graph_break_count == 0, reasons
    assert explained.graph_count == 1
    assert torch.isfinite(eager).all()


def test_under_compile_a_cpu_below_float32_runs_the_plain_ops():
    # eager, the fused ops (with their buffer and measured kernel); traced, the reference ops: one graph
    net = _net(torch.bfloat16)
    x, ctx = torch.randn(1, 16, 128).bfloat16(), torch.randn(1, T, 96).bfloat16()
    torch._dynamo.reset()
    with torch.inference_mode():
        assert block_ops.ops_for("cpu", torch.bfloat16).name == "fused"
        explained = torch._dynamo.explain(net)(x, image_ids(*GRID), torch.tensor([0.5]), ctx)
    torch._dynamo.reset()
    assert explained.graph_break_count == 0 and explained.graph_count == 1
