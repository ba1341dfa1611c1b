"""Position extrapolation (DyPE) for targets past the base size, and the schedule of large images.

Exact by construction: a target no larger than the base on both sides runs today's table, so its output is
today's bit for bit. Past the base, the image rows' h and w frequencies are checked against the upstream DyPE
reference (guyyariv/DyPE, read from ``DYPE_PATH``: see ``dype_reference``), and the rest of the table (time
axis, text axis, text rows) against today's.
"""

from __future__ import annotations

import math

import pytest
import torch
from dype_reference import reference

from flux2_core.configs import VARIANTS, Flux2Config
from flux2_core.dit.extrapolation import (
    PositionExtrapolation,
    Positions,
    axis_frequencies,
    extrapolated_table,
    native_frequencies,
    position_extrapolation,
)
from flux2_core.dit.rope import image_ids, reference_ids, rope_table, text_ids
from flux2_core.dit.transformer import Flux2Model, Flux2Transformer
from flux2_core.errors import Flux2Error
from flux2_core.references import ReferenceLatents
from flux2_core.sampling import SampleRequest, SampleSettings, compute_empirical_mu, get_sigmas, sample

KLEIN_AXES, THETA = (32, 32, 32, 32), 2000
BASE = 128  # tokens: the default base of 2048 px
# Noise levels from pure noise down; below about 0.09 the upstream code's clamp turns a ramp over (see the
# module docstring of flux2_core.dit.extrapolation), so the comparison keeps the levels its ramps are upright
SIGMAS = [1.0, 0.99, 0.96, 0.9, 0.7, 0.5, 0.34, 0.3, 0.2, 0.15, 0.1, 0.05, 0.03]


def _tiny_net(seed: int = 0) -> Flux2Transformer:
    net = Flux2Transformer(Flux2Config(32, 2, 1, 1, 24, axes_dim=(4, 4, 4, 4))).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            std = 0.3 if p.ndim == 1 else 1.0 / p.shape[1] ** 0.5
            p.copy_(torch.randn(p.shape, generator=generator) * std + (1.0 if p.ndim == 1 else 0.0))
    return net


@pytest.fixture(scope="module")
def model():
    return Flux2Model(_tiny_net(), VARIANTS["distilled"], "tiny klein")


def _sample(model, width, height, extrapolation=None, references=None, steps=3):
    settings = SampleSettings(width, height, steps, 1.0, seed=5)
    text = torch.randn(1, 7, 24, generator=torch.Generator().manual_seed(1))
    return sample(SampleRequest(model, text, settings, references=references, extrapolation=extrapolation))


def _references(sizes):
    generator = torch.Generator().manual_seed(2)
    latents = [torch.randn(1, 128, h, w, generator=generator) for h, w in sizes]
    return ReferenceLatents.from_latents(latents)


@pytest.mark.parametrize("width, height, base", [(256, 256, 256), (256, 192, 256), (512, 320, 2048)])
def test_a_target_within_the_base_is_todays_output_bit_for_bit(model, width, height, base):
    refs = _references([(24, 24), (height // 16, width // 16)])
    plain = _sample(model, width, height, references=refs)
    extrapolated = _sample(model, width, height, PositionExtrapolation(base), references=refs)
    assert torch.equal(plain, extrapolated)


def test_a_target_past_the_base_changes_the_output(model):
    refs = _references([(20, 16)])
    plain = _sample(model, 256, 320, references=refs)
    extrapolated = _sample(model, 256, 320, PositionExtrapolation(256), references=refs)
    assert torch.isfinite(extrapolated).all()
    assert not torch.allclose(plain, extrapolated, atol=1e-4)


def _ids(grid, ref_grids=((16, 16),), num_text=9):
    return torch.cat([text_ids(num_text), image_ids(*grid), reference_ids(list(ref_grids))]), num_text


@pytest.mark.parametrize("sigma", [1.0, 0.6, 0.02, 0.0])
def test_only_the_image_rows_h_and_w_axes_change(sigma):
    ids, num_text = _ids((256, 192), ((40, 300), (16, 16)))
    today = rope_table(ids, KLEIN_AXES, THETA)
    table = extrapolated_table(ids, num_text, KLEIN_AXES, THETA, Positions(BASE, (256, 192), sigma))
    assert torch.isfinite(table).all()
    assert torch.equal(table[:num_text], today[:num_text])  # every text token
    assert torch.equal(table[:, :16], today[:, :16])  # time axis
    assert torch.equal(table[:, 48:], today[:, 48:])  # text axis
    image = slice(num_text, None)
    assert not torch.equal(table[image, 16:48], today[image, 16:48])


def test_each_axis_on_its_own():
    """A side within the base keeps its native table even when the other side is extrapolated."""
    ids, num_text = _ids((256, 96))
    today = rope_table(ids, KLEIN_AXES, THETA)
    table = extrapolated_table(ids, num_text, KLEIN_AXES, THETA, Positions(BASE, (256, 96), 0.7))
    assert torch.equal(table[:, 32:48], today[:, 32:48])  # w: 96 tokens
    assert not torch.equal(table[num_text:, 16:32], today[num_text:, 16:32])  # h: 256 tokens


@pytest.mark.parametrize("sigma", [0.0, 1e-9, 0.01, 0.02])
def test_native_frequencies_as_the_noise_ends(sigma):
    """The multiplicative schedule returns to native frequencies; the attention scale stays (no NaN)."""
    freqs, scale = axis_frequencies(32, THETA, 256, BASE, sigma)
    assert freqs.dtype == torch.float64
    assert torch.equal(freqs, native_frequencies(32, THETA))
    assert scale == pytest.approx(1 + 0.1 * math.log(2))


def test_the_blend_at_full_noise():
    """High frequencies native, the middle NTK-scaled, the low ones position-interpolated (s = 2)."""
    freqs, _ = axis_frequencies(32, THETA, 256, BASE, 1.0)
    base = native_frequencies(32, THETA)
    assert torch.equal(freqs[0], base[0])
    torch.testing.assert_close(freqs[-4:], base[-4:] / 2, rtol=1e-12, atol=0)
    assert ((freqs <= base) & (freqs >= base / 2)).all()


def test_frequencies_equal_the_upstream_reference():
    """``get_1d_rotary_pos_embed`` with yarn and DyPE on one axis: the same frequencies and scale."""
    upstream_code = reference()
    rotary = upstream_code["get_1d_rotary_pos_embed"]
    correction_range = upstream_code["find_correction_range"]
    pos = torch.tensor([1.0], dtype=torch.float64)  # angle = frequency (every one below pi)
    upright = [s for s in SIGMAS if correction_range(1.25 * s * s, 0.75 * s * s, 32, THETA, BASE)[0] <= 16]
    assert len(upright) >= 10
    for tokens in (160, 256, 384):
        for sigma in upright:
            cos, sin = rotary(
                32, pos, theta=THETA, use_real=True, freqs_dtype=torch.float64, yarn=True,
                max_pe_len=torch.tensor(float(tokens), dtype=torch.float64), ori_max_pe_len=BASE, dype=True,
                current_timestep=sigma,
            )  # fmt: skip
            freqs, scale = axis_frequencies(32, THETA, tokens, BASE, sigma)
            upstream = torch.atan2(sin[0, ::2].double(), cos[0, ::2].double())
            # its cos and sin are float32 and its ramp is formed in float32
            torch.testing.assert_close(freqs, upstream, rtol=1e-6, atol=1e-9)
            assert math.hypot(cos[0, 0], sin[0, 0]) == pytest.approx(scale, rel=1e-6)


def test_table_equals_the_upstream_position_embedding():
    """Upstream ``FluxPosEmbed`` (method yarn, DyPE on) on the target's ids at our base: the same cos and
    sin for every image token."""
    pos_embed = reference()["FluxPosEmbed"](THETA, list(KLEIN_AXES), method="yarn", dype=True)
    pos_embed.base_patches = BASE
    grid = (200, 144)
    ids = image_ids(*grid)
    for sigma in (1.0, 0.8, 0.4, 0.1):
        pos_embed.set_timestep(sigma)
        cos, sin = pos_embed(ids.float())
        table = extrapolated_table(ids, 0, KLEIN_AXES, THETA, Positions(BASE, grid, sigma))
        torch.testing.assert_close(table[..., 0], cos[:, ::2], rtol=0, atol=1e-5)
        torch.testing.assert_close(table[..., 1], sin[:, ::2], rtol=0, atol=1e-5)


def test_the_setting_is_checked():
    assert position_extrapolation("off") is None
    assert position_extrapolation("dype", 1024) == PositionExtrapolation(1024)
    with pytest.raises(Flux2Error, match="position extrapolation 'yarn' is unknown"):
        position_extrapolation("yarn")
    for base in (100, 2008 + 1, 128, 16384):
        with pytest.raises(Flux2Error, match=f"extrapolation base {base} px is not allowed"):
            PositionExtrapolation(base)
    assert PositionExtrapolation(2048).at(0.5, (128, 128)) is None
    assert PositionExtrapolation(2048).at(0.5, (129, 64)) == Positions(128, (129, 64), 0.5)


def test_the_kv_models_cached_references_are_refused():
    model = Flux2Model(_tiny_net(), VARIANTS["kv"], "tiny klein KV")
    settings = SampleSettings(320, 256, 2, 1.0, seed=0)
    text = torch.zeros(1, 4, 24)
    refs = _references([(8, 8)])
    with pytest.raises(Flux2Error, match="9B-KV model keeps one set of reference K/V"):
        SampleRequest(model, text, settings, references=refs, extrapolation=PositionExtrapolation(256))
    # within the base it is today's run, so it is allowed
    SampleRequest(model, text, settings, references=refs, extrapolation=PositionExtrapolation(512))


def test_empirical_mu_at_2_and_4_megapixels():
    """BFL's fit on the target's own token count: above 4300 tokens the linear branch, whatever the steps (a
    2 MP image gets less shift than 1 MP at 4 steps). Values: docs/high-res facts (2 places) and the spec's
    worked 2048^2 value (6.1, 5 places)."""
    assert compute_empirical_mu(4300, 4) == pytest.approx(2.31, abs=5e-3)
    assert compute_empirical_mu(4301, 4) == pytest.approx(1.18, abs=5e-3)
    assert compute_empirical_mu(90 * 90, 4) == pytest.approx(1.83, abs=5e-3)  # 1440^2, 2.1 MP
    assert compute_empirical_mu(90 * 90, 50) == compute_empirical_mu(90 * 90, 4)
    assert compute_empirical_mu(128 * 128, 4) == pytest.approx(3.22999, abs=1e-5)  # 2048^2, 4.2 MP
    mu = compute_empirical_mu(128 * 128, 4)
    t = torch.linspace(1, 0, 5, dtype=torch.float64)[1:-1]
    expected = (math.exp(mu) / (math.exp(mu) + (1 / t - 1))).float()
    torch.testing.assert_close(get_sigmas(4, 128 * 128)[1:-1], expected, atol=1e-6, rtol=0)
