"""FLUX.2 Sampler's position extrapolation and FLUX.2 Tiled Refine through the nodes, under the fake host: the
core's runs, bit for bit, and the refusals."""

from __future__ import annotations

import pytest
import torch
from klein_nodes import run_sampler


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
