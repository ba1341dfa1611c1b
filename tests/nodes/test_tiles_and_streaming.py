"""Tiled VAE decode / encode through the nodes, and streaming through the model loader."""

from __future__ import annotations

import sys

import pytest
import torch
from comfy_stubs import pack_nodes
from klein_nodes import image, run_sampler


def _reserved(pack, monkeypatch):
    """Records the memory each node asks ComfyUI to keep free when it loads a model."""
    host_module = sys.modules[pack.__name__ + ".nodes.host"]
    reserved, load = [], host_module.load
    monkeypatch.setattr(
        host_module, "load", lambda patcher, memory=0: reserved.append(memory) or load(patcher, memory)
    )
    return reserved


def test_tile_inputs_are_optional_widgets(pack):
    for node_id in ("Flux2KleinDecode", "Flux2KleinReferenceEncode"):
        optional = pack_nodes(pack).classes[node_id].INPUT_TYPES()["optional"]
        size = {k: optional["tile_size"][1][k] for k in ("default", "min", "max", "step")}
        assert optional["tile_size"][0] == "INT" and size == {"default": 0, "min": 0, "max": 8192, "step": 16}
        assert optional["tile_overlap"][1]["default"] == 64 and optional["tile_overlap"][1]["max"] == 512
        assert optional["tile_size"][1]["tooltip"] and optional["tile_overlap"][1]["tooltip"]


def test_decode_tiles_and_reserves_the_tiled_estimate(nodes, loaded, pack, monkeypatch, Flux2Error):
    reserved = _reserved(pack, monkeypatch)
    vae = loaded["vae"].vae
    latent = torch.randn(1, 128, 12, 12, generator=torch.Generator().manual_seed(4))
    (pixels,) = nodes["Flux2KleinDecode"].execute(loaded["vae"], {"samples": latent}, 128, 32)
    expected = ((vae.decode(latent, 128, 32) + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1)
    torch.testing.assert_close(pixels, expected)
    assert reserved == [vae.decode_memory(192, 192, 128, 32)] and reserved[0] < vae.decode_memory(192, 192)
    reserved.clear()
    nodes["Flux2KleinDecode"].execute(loaded["vae"], {"samples": latent})  # automatic: the untiled estimate
    assert reserved == [vae.decode_memory(192, 192)]
    with pytest.raises(Flux2Error, match="smaller than half the tile"):
        nodes["Flux2KleinDecode"].execute(loaded["vae"], {"samples": latent}, 128, 64)


def test_reference_encode_tiles_and_reserves_the_tiled_estimate(nodes, loaded, pack, monkeypatch):
    reserved = _reserved(pack, monkeypatch)
    vae = loaded["vae"].vae
    (refs,) = nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], image(192, 160), tile_size=128,
                                                         tile_overlap=32)  # fmt: skip
    pixels = (image(192, 160)[0].permute(2, 0, 1) * 2 - 1)[None]
    torch.testing.assert_close(refs.latents()[0], vae.encode(pixels, 128, 32))
    assert reserved == [vae.encode_memory(192, 160, 128, 32)] and reserved[0] < vae.encode_memory(192, 160)
    reserved.clear()
    (plain,) = nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], image(192, 160))
    torch.testing.assert_close(plain.latents()[0], vae.encode(pixels))
    assert reserved == [vae.encode_memory(192, 160)]


def test_model_loader_streams_blocks_with_the_same_result(nodes, loaded):
    (streamed,) = nodes["Flux2KleinModelLoader"].execute(
        "klein_tiny.safetensors", "auto", "default", "stream", 0
    )
    net = streamed.core.transformer
    resident = sum(t.numel() for t in net.parameters())
    full = sum(t.numel() for t in loaded["model"].core.transformer.parameters())
    assert resident < 0.5 * full  # the patcher manages (and moves) only what stays resident
    assert torch.equal(run_sampler(nodes, {**loaded, "model": streamed}), run_sampler(nodes, loaded))
