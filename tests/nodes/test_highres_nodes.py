"""FLUX.2 Sampler's position extrapolation and FLUX.2 Tiled Refine through the nodes, under the fake host: the
core's runs, bit for bit, and the refusals."""

from __future__ import annotations

import pytest
import torch
from klein_nodes import image, run_sampler


def test_position_extrapolation_within_its_base_is_the_plain_run(nodes, loaded):
    plain = run_sampler(nodes, loaded, width=320, height=256)
    within = run_sampler(
        nodes, loaded, width=320, height=256, position_extrapolation="dype", extrapolation_base=512
    )
    assert torch.equal(plain, within)
    past = run_sampler(
        nodes, loaded, width=320, height=256, position_extrapolation="dype", extrapolation_base=256
    )
    assert torch.isfinite(past).all() and not torch.equal(plain, past)


def test_a_bad_extrapolation_setting_is_refused(nodes, loaded, Flux2Error):
    with pytest.raises(Flux2Error, match="extrapolation base 200 px is not allowed"):
        run_sampler(nodes, loaded, position_extrapolation="dype", extrapolation_base=200)


def _refine_args(loaded, **overrides):
    args = dict(model=loaded["model"], positive=loaded["positive"], vae=loaded["vae"], image=image(128, 160),
                seed=3, steps=3, denoise=0.6, tile_size=256, tile_overlap=64)  # fmt: skip
    return {**args, **overrides}


def test_tiled_refine_of_one_tile_is_the_samplers_img2img_with_the_image_as_reference(nodes, loaded):
    args = _refine_args(loaded)
    (refined,) = nodes["Flux2KleinTiledRefine"].execute(**args)
    (latent,) = nodes["Flux2KleinEncode"].execute(loaded["vae"], args["image"])
    (refs,) = nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], args["image"])
    plain = run_sampler(nodes, loaded, seed=3, steps=3, width=160, height=128, latent=latent, denoise=0.6,
                        references=refs)  # fmt: skip
    assert torch.equal(refined["samples"], plain)


def test_tiled_refine_of_several_tiles_and_at_denoise_zero(nodes, loaded):
    args = _refine_args(loaded, image=image(448, 592))
    (refined,) = nodes["Flux2KleinTiledRefine"].execute(**args)
    (latent,) = nodes["Flux2KleinEncode"].execute(loaded["vae"], args["image"])
    assert refined["samples"].shape == latent["samples"].shape == (1, 128, 28, 37)
    assert torch.isfinite(refined["samples"]).all()
    (kept,) = nodes["Flux2KleinTiledRefine"].execute(**{**args, "denoise": 0.0})
    assert torch.equal(kept["samples"], latent["samples"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"tile_size": 256, "tile_overlap": 192}, "tile size 256 px is smaller than twice the tile overlap"),
        ({"tile_size": 1000}, "tile size 1000 px is not allowed: use a multiple of 16"),
    ],
)
def test_tiled_refine_refuses_bad_tiles_by_name(nodes, loaded, Flux2Error, overrides, message):
    with pytest.raises(Flux2Error, match=message):
        nodes["Flux2KleinTiledRefine"].execute(**_refine_args(loaded, **overrides))


def test_tiled_refine_refuses_a_canvas_beyond_the_memory_plan(nodes, loaded, host, Flux2Error):
    host.free_memory = 1024**2
    with pytest.raises(
        Flux2Error, match=r"tiled refine of 160x128 in 256 px tiles needs about .* GB but CPU"
    ):
        nodes["Flux2KleinTiledRefine"].execute(**_refine_args(loaded))
    assert host.progress == []
