"""Below float32 the DiT's elementwise steps run fused (``layers.FUSED_DTYPES``): one op computing the formula
in float32 and rounding once, where the plain form rounds after every op. They must give the plain form's
values within the dtype's rounding (measured against float32 arithmetic, no worse than the plain form), and
float32 must run the plain form exactly."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_dit import make_diffusers_dit, write_bfl_file

from flux2_core.dit import layers, rope
from flux2_core.dit.files import load_transformer
from flux2_core.dit.rope import image_ids, reference_ids, text_ids

LOW = [torch.bfloat16, torch.float16]


def _plain(monkeypatch):
    monkeypatch.setattr(layers, "FUSED_DTYPES", ())


def _errors(fused: torch.Tensor, plain: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
    return (fused.float() - exact).abs().max().item(), (plain.float() - exact).abs().max().item()


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("batch", [1, 2])  # one item: the layer norm's affine step; two: one addcmul
def test_modulation_is_the_plain_formula_within_rounding(monkeypatch, dtype, batch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 50, 64, generator=g) * 3 + 1
    shift, scale = (torch.randn(batch, 1, 64, generator=g) * 0.5 for _ in range(2))
    low = [t.to(dtype) for t in (x, shift, scale)]
    # the exact value of the formula on the rounded inputs (1 + scale rounds in the dtype in both forms)
    exact = (1 + low[2]).float() * F.layer_norm(low[0].float(), (64,), eps=layers.NORM_EPS) + low[1].float()
    fused = layers.modulate(*low)
    _plain(monkeypatch)
    plain = layers.modulate(*low)
    err_fused, err_plain = _errors(fused, plain, exact)
    assert fused.dtype == dtype and err_fused <= err_plain
    torch.testing.assert_close(fused.float(), plain.float(), rtol=2**-6, atol=2**-6)


@pytest.mark.parametrize("dtype", LOW)
def test_gated_residual_and_swiglu_are_the_plain_formulas_within_rounding(monkeypatch, dtype):
    g = torch.Generator().manual_seed(1)
    x, out = (torch.randn(2, 40, 32, generator=g).to(dtype) for _ in range(2))
    gate = torch.randn(2, 1, 32, generator=g).to(dtype)
    exact = x.float() + gate.float() * out.float()
    fused = layers.gated(x, gate, out)
    _plain(monkeypatch)
    err_fused, err_plain = _errors(fused, layers.gated(x, gate, out), exact)
    assert err_fused <= err_plain
    h = torch.randn(3, 40, 64, generator=g).to(dtype)
    gate, up = h[..., :32].float(), h[..., 32:].float()
    assert torch.equal(layers.swiglu(h), F.silu(h[..., :32]) * h[..., 32:])  # the same ops, one buffer
    torch.testing.assert_close(layers.swiglu(h).float(), F.silu(gate) * up, rtol=2**-6, atol=1e-2)


@pytest.mark.parametrize("dtype", LOW)
def test_rope_below_float32_is_the_float32_rotation_rounded_once(dtype):
    g = torch.Generator().manual_seed(2)
    table = rope.rotation_table(rope.rope_table(torch.cat([text_ids(5), image_ids(4, 6)]), (8,) * 4, 2000))
    x = torch.randn(2, 3, 29, 32, generator=g).to(dtype)
    exact = rope.apply_rope_(x.float(), table)
    got = rope.apply_rope_(x.clone(), table)
    # within one rounding of the exact float32 rotation (a product and sum fused may round once less)
    ulp = exact.abs().clamp_min(1e-3) * (2**-8 if dtype == torch.bfloat16 else 2**-11)
    assert ((got.float() - exact).abs() <= ulp).all()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_bfl_file(make_diffusers_dit(seed=3), tmp_path_factory.mktemp("fused") / "klein.safetensors")
    g = torch.Generator().manual_seed(4)
    inputs = dict(
        x=torch.randn(1, 12, 128, generator=g),
        x_ids=image_ids(3, 4),
        t=torch.tensor([0.6]),
        ctx=torch.randn(1, 7, 24, generator=g),
        ctx_ids=text_ids(7),
        ref=torch.randn(1, 6, 128, generator=g),
        ref_ids=reference_ids([(2, 3)]),
    )
    return path, inputs


def _forward(path, inputs, dtype):
    net = load_transformer(path, dtype=dtype).transformer
    cast = {k: v.to(dtype) if v.is_floating_point() and k != "t" else v for k, v in inputs.items()}
    with torch.inference_mode():
        return net(**cast)


def test_a_bf16_step_fused_stays_within_rounding_of_the_plain_one(monkeypatch, tiny):
    path, inputs = tiny
    exact = _forward(path, inputs, torch.float32)
    fused = _forward(path, inputs, torch.bfloat16)
    _plain(monkeypatch)
    plain = _forward(path, inputs, torch.bfloat16)
    err_fused, err_plain = _errors(fused, plain, exact)
    assert not torch.equal(fused, plain)  # the fused path ran
    assert err_fused <= 1.25 * err_plain  # no further from the float32 step than the plain form
    torch.testing.assert_close(fused.float(), plain.float(), rtol=3e-2, atol=3e-2)


def test_float32_runs_the_plain_form_exactly(monkeypatch, tiny):
    path, inputs = tiny
    default = _forward(path, inputs, torch.float32)
    _plain(monkeypatch)
    assert torch.equal(default, _forward(path, inputs, torch.float32))
