"""What a DiT call carries (``dit.call``): the record every caller builds with ``call_extras``, what it
refuses, and the DiT's one entry point taking it."""

from __future__ import annotations

import pytest
import torch

from flux2_core.configs import Flux2Config
from flux2_core.dit.call import UNPLACED_REFERENCES, CallExtras, call_extras
from flux2_core.dit.control import Control
from flux2_core.dit.extrapolation import KV_AND_EXTRAPOLATION, PositionExtrapolation
from flux2_core.dit.kv_cache import RefKVCache
from flux2_core.dit.rope import image_ids, reference_ids, text_ids
from flux2_core.dit.transformer import Flux2Transformer
from flux2_core.errors import Flux2Error

REFS = (torch.ones(1, 8, 128), reference_ids([(2, 4)]))


def test_the_builder_leaves_out_what_a_call_does_not_use():
    cache = RefKVCache(1, 1)
    bias = torch.zeros(8)
    assert call_extras(references=REFS, kv_cache=cache).references is None  # the cache holds them
    empty = (torch.ones(1, 0, 128), reference_ids([]))
    assert call_extras(references=empty).references is None
    assert call_extras(reference_bias=bias).reference_bias is None  # no reference keys to bias
    assert call_extras(kv_cache=cache, reference_bias=bias).reference_bias is bias
    assert call_extras(references=REFS, reference_bias=bias).reference_bias is bias
    assert call_extras(control=Control(None, torch.zeros(1, 4, 260), 0.0)).control is None
    assert call_extras().positions is None


def test_the_builder_resolves_extrapolation_at_the_calls_noise_level():
    dype = PositionExtrapolation(256)  # 16 tokens a side natively
    assert call_extras(extrapolation=dype, sigma=0.7, grid=(8, 8)).positions is None  # within the base
    positions = call_extras(extrapolation=dype, sigma=0.7, grid=(8, 24)).positions
    assert positions is not None and positions.sigma == 0.7 and positions.grid == (8, 24)
    with pytest.raises(ValueError, match="grid"):
        call_extras(extrapolation=dype, sigma=0.7)


def test_the_record_refuses_what_cannot_go_together():
    mask = torch.ones(4, 4, dtype=torch.bool)  # a mask that cannot say which text the references read
    with pytest.raises(Flux2Error, match="does not say which text the references may read") as refused:
        CallExtras(references=REFS, regions=mask)
    assert str(refused.value) == UNPLACED_REFERENCES
    with pytest.raises(Flux2Error, match="position extrapolation"):
        call_extras(
            kv_cache=RefKVCache(1, 1), extrapolation=PositionExtrapolation(256), sigma=1.0, grid=(8, 24)
        )
    assert KV_AND_EXTRAPOLATION.startswith("position extrapolation")


def test_the_dit_takes_the_record_as_its_fifth_argument():
    net = Flux2Transformer(Flux2Config(256, 2, 1, 1, 24)).eval()
    x, ctx = torch.randn(1, 4, 128), torch.randn(1, 3, 24)
    with torch.inference_mode():
        plain = net(x, image_ids(2, 2), torch.tensor([0.5]), ctx)
        assert plain.shape == x.shape
        with pytest.raises(TypeError, match="CallExtras"):
            net(x, image_ids(2, 2), torch.tensor([0.5]), ctx, text_ids(3))  # the old call's text ids
