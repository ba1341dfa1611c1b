"""The VAE nodes' progress bars on the fake host: FLUX.2 Decode and Encode move their node's bar per decoder
or encoder stage (a batch one image after another on one bar, from 0 to 1000 per image), and a cancel pressed
mid-decode stops it at the next stage."""

from __future__ import annotations

import pytest
import torch
from comfy_stubs import InterruptProcessingException
from klein_nodes import image


def _counts(host) -> list[tuple[int, int]]:
    return [(value, total) for value, total, _ in host.progress]


def _check(counts, total):
    values = [value for value, _ in counts]
    assert {t for _, t in counts} == {total}  # the whole total from the first update
    assert values[0] == 0 and values[-1] == total and values == sorted(values)
    assert len(set(values)) > 3


def test_decode_moves_one_bar_over_the_batch_and_gives_the_same_image(nodes, loaded, host):
    latent = torch.randn(2, 128, 4, 3, generator=torch.Generator().manual_seed(1))
    (pixels,) = nodes["Flux2KleinDecode"].execute(loaded["vae"], {"samples": latent})
    counts = _counts(host)
    _check(counts, 2000)
    stages = len(loaded["vae"].vae.decoder.stages(8, 6))
    assert len(counts) == 2 * (1 + stages)  # each image: 0, then one update per decoder stage
    expected = torch.cat([loaded["vae"].vae.decode(item) for item in latent.split(1)])
    assert torch.equal(pixels, ((expected + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1))


def test_tiled_decode_counts_every_tile(nodes, loaded, host):
    latent = torch.randn(1, 128, 12, 10, generator=torch.Generator().manual_seed(2))
    nodes["Flux2KleinDecode"].execute(loaded["vae"], {"samples": latent}, tile_size=128, tile_overlap=32)
    counts = _counts(host)
    _check(counts, 1000)
    assert len(counts) == 1 + 4 * len(loaded["vae"].vae.decoder.stages(16, 16))  # 2 x 2 tiles of 8 cells


def test_encode_moves_its_bar(nodes, loaded, host):
    nodes["Flux2KleinEncode"].execute(loaded["vae"], image(64, 80, batch=2))
    _check(_counts(host), 2000)


def test_a_cancel_during_a_decode_stops_it_at_the_next_stage(nodes, loaded, host):
    host.on_progress = lambda value, total: setattr(host, "interrupted", value > 0)
    latent = torch.randn(2, 128, 4, 3, generator=torch.Generator().manual_seed(1))
    with pytest.raises(InterruptProcessingException):
        nodes["Flux2KleinDecode"].execute(loaded["vae"], {"samples": latent})
    assert len(host.progress) == 2  # 0, the first stage; the cancel is seen before the second stage's update
