"""Tiled refinement (``flux2_core.upscale.tiled``) on a tiny random klein: exact cases and refusals."""

from __future__ import annotations

import random

import pytest
import torch
from tiny_dit import make_diffusers_dit, write_bfl_file

from flux2_core import Flux2Error, load_transformer
from flux2_core.references import ReferenceLatents
from flux2_core.sampling import SampleRequest, SampleSettings, sample
from flux2_core.upscale.tiled import CANVAS_COPIES, TiledRefine, tile_grid, tiled_memory, tiled_refine


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_bfl_file(make_diffusers_dit(seed=4), tmp_path_factory.mktemp("tiled") / "klein.safetensors")
    return load_transformer(path, variant="distilled")


TEXT = torch.randn(1, 6, 24, generator=torch.Generator().manual_seed(3))


def _source(rows: int, cols: int) -> torch.Tensor:
    return torch.randn(1, 128, rows, cols, generator=torch.Generator().manual_seed(rows * 100 + cols))


def _refine(model, source, strength=0.6, order=None, **kw):
    request = TiledRefine(model, TEXT, source, steps=3, strength=strength, seed=11, **kw)
    return tiled_refine(request, order)


def test_one_tile_covering_the_image_is_plain_img2img_with_itself_as_reference(model):
    source = _source(8, 10)  # 128 x 160 px, within one 256 px tile
    settings = SampleSettings(160, 128, 3, 1.0, seed=11)
    references = ReferenceLatents.from_latents([source])
    plain = sample(SampleRequest(model, TEXT, settings, references=references, start=source, strength=0.6))
    tiled = _refine(model, source, tile_size=256, tile_overlap=64)
    assert len(tile_grid(160, 128, 256, 64).windows()) == 1
    assert torch.equal(tiled, plain)


def test_any_two_tile_orders_give_the_same_result(model):
    source = _source(28, 37)  # 448 x 592 px: 2 x 3 tiles of 256 px sharing at least 64
    grid = tile_grid(592, 448, 256, 64)
    count = len(grid.windows())
    assert count == 6
    first = _refine(model, source, tile_size=256, tile_overlap=64)
    order = list(range(count))
    random.Random(0).shuffle(order)
    assert torch.equal(first, _refine(model, source, order=order, tile_size=256, tile_overlap=64))
    assert torch.equal(first, _refine(model, source, order=order[::-1], tile_size=256, tile_overlap=64))
    assert not torch.equal(first, source)


def test_denoise_zero_returns_the_encoded_input(model):
    source = _source(28, 37)
    assert torch.equal(_refine(model, source, strength=0.0, tile_size=256, tile_overlap=64), source)


@pytest.mark.parametrize(
    "width, height, tile, overlap",
    [
        (592, 448, 256, 64),
        (2048, 2048, 1024, 128),
        (4096, 2304, 1024, 128),
        (1040, 512, 512, 0),
        (256, 256, 1024, 128),
    ],
)
def test_the_blend_weights_sum_to_one_everywhere(width, height, tile, overlap):
    grid = tile_grid(width, height, tile, overlap)
    total = torch.zeros(grid.shape, dtype=torch.float64)
    for (rows, cols), weights in zip(grid.windows(), grid.weights()):
        assert weights.shape == (rows.stop - rows.start, cols.stop - cols.start)
        assert (weights > 0).all() and weights.shape[0] <= grid.tile and weights.shape[1] <= grid.tile
        total[rows, cols] += weights.double()
    torch.testing.assert_close(total, torch.ones_like(total), atol=1e-6, rtol=0)
    for first, second in zip(grid.spans[0], grid.spans[0][1:]):  # neighbours share at least the overlap
        assert first[1] - second[0] >= grid.overlap


def test_weights_are_smooth_across_an_overlap():
    grid = tile_grid(2048, 1024, 1024, 128)  # 3 tiles in a row
    weights = grid.weights()[0]
    row = weights[0].double()
    assert row[0] == 1 and row[-1] < 0.05
    assert (row[1:] - row[:-1]).abs().max() < 0.25  # no jump: a ramp of 8 cells


@pytest.mark.parametrize(
    "tile, overlap, message",
    [
        (256, 192, "tile size 256 px is smaller than twice the tile overlap 192 px"),
        (1000, 128, "tile size 1000 px is not allowed: use a multiple of 16"),
        (1024, 100, "tile overlap 100 px is not allowed"),
    ],
)
def test_bad_tiles_are_refused_by_name(model, tile, overlap, message):
    with pytest.raises(Flux2Error, match=message):
        TiledRefine(model, TEXT, _source(8, 8), 3, 0.5, 0, tile_size=tile, tile_overlap=overlap)


def test_a_tile_steps_memory_does_not_grow_with_the_canvas(model):
    small = TiledRefine(model, TEXT, torch.zeros(1, 128, 128, 128), 3, 0.5, 0)  # 2048^2
    large = TiledRefine(model, TEXT, torch.zeros(1, 128, 256, 256), 3, 0.5, 0)  # 4096^2
    canvas = (256 * 256 - 128 * 128) * 128 * 4 * CANVAS_COPIES
    assert tiled_memory(large) - tiled_memory(small) == canvas
