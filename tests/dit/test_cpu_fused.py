"""A CPU computing below float32 runs the blocks' fused ops (``block_ops.FusedOps``): each elementwise step
one op computing the formula in float32 and rounding once, where the reference form (``PlainOps``) rounds
after every op, and the largest temporaries in one buffer per call. They must give the reference form's
values within the dtype's rounding (measured against float32 arithmetic, no worse than the reference form),
the buffer must change no value and hold no more memory, and float32 must run the reference form exactly."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F
import torch.utils._pytree as pytree
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_flux1 import write_fill_dit
from torch.utils._python_dispatch import TorchDispatchMode

from flux2_core import ops
from flux2_core.configs import Flux2Config
from flux2_core.dit import attention, block_ops, fused, pointwise, rope
from flux2_core.dit.call import CallExtras
from flux2_core.dit.files import load_transformer
from flux2_core.dit.rope import image_ids, reference_ids, text_ids
from flux2_core.dit.transformer import Flux2Transformer
from flux2_core.flux1.dit_files import load_fill_transformer
from flux2_core.flux1.transformer import image_ids as fill_image_ids

LOW = [torch.bfloat16, torch.float16]


def _plain(monkeypatch):
    monkeypatch.setenv(block_ops.OPS_ENV, "plain")


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
    exact = (1 + low[2]).float() * F.layer_norm(low[0].float(), (64,), eps=pointwise.NORM_EPS) + low[
        1
    ].float()
    one_pass = fused.modulate(*low)
    plain = pointwise.modulate(*low)
    err_fused, err_plain = _errors(one_pass, plain, exact)
    assert one_pass.dtype == dtype and err_fused <= err_plain
    torch.testing.assert_close(one_pass.float(), plain.float(), rtol=2**-6, atol=2**-6)


@pytest.mark.parametrize("dtype", LOW)
def test_gated_residual_and_swiglu_are_the_plain_formulas_within_rounding(monkeypatch, dtype):
    g = torch.Generator().manual_seed(1)
    x, out = (torch.randn(2, 40, 32, generator=g).to(dtype) for _ in range(2))
    gate = torch.randn(2, 1, 32, generator=g).to(dtype)
    exact = x.float() + gate.float() * out.float()
    err_fused, err_plain = _errors(fused.gated(x, gate, out), pointwise.gated(x, gate, out), exact)
    assert err_fused <= err_plain
    h = torch.randn(3, 40, 64, generator=g).to(dtype)
    gate, up = h[..., :32].float(), h[..., 32:].float()
    assert torch.equal(pointwise.swiglu(h), F.silu(h[..., :32]) * h[..., 32:])  # the same ops, one buffer
    torch.testing.assert_close(pointwise.swiglu(h).float(), F.silu(gate) * up, rtol=2**-6, atol=1e-2)
    into = h.clone()  # the fused ops' form: written over the gate half of its own input
    assert torch.equal(pointwise.swiglu(into, out=into[..., :32]), pointwise.swiglu(h))


@pytest.mark.parametrize("dtype", LOW)
def test_rope_below_float32_is_the_float32_rotation_rounded_once(dtype):
    g = torch.Generator().manual_seed(2)
    table = rope.rotation_table(rope.rope_table(torch.cat([text_ids(5), image_ids(4, 6)]), (8,) * 4, 2000))
    x = torch.randn(2, 3, 29, 32, generator=g).to(dtype)
    exact = rope.apply_rope(x.float(), table)
    got = rope.apply_rope(x, table)
    # within one rounding of the exact float32 rotation (a product and sum fused may round once less)
    ulp = exact.abs().clamp_min(1e-3) * (2**-8 if dtype == torch.bfloat16 else 2**-11)
    assert ((got.float() - exact).abs() <= ulp).all()


@pytest.mark.parametrize("dtype", LOW)
def test_norm_and_rope_in_one_pass_are_the_two_steps_within_rounding(dtype):
    g = torch.Generator().manual_seed(8)
    norm = pointwise.RMSNorm(32)
    with torch.no_grad():
        norm.scale.copy_(torch.rand(32, generator=g) + 0.5)
    norm = norm.to(dtype)
    ids = torch.cat([text_ids(600), image_ids(30, 30)])  # 1500 tokens: two chunks, the last one partial
    cos_sin = rope.rope_table(ids, (8,) * 4, 2000)
    x = (torch.randn(1, 2, 1500, 32, generator=g) * 4).to(dtype)
    exact = rope.apply_rope(
        F.rms_norm(x.float(), (32,), norm.scale.float(), pointwise.NORM_EPS), rope.rotation_table(cos_sin)
    )
    two_steps = rope.apply_rope(norm(x), rope.rotation_table(cos_sin))
    assert x.shape[-2] > fused.NORM_ROPE_CHUNK
    for table in (cos_sin, rope.rotation_table(cos_sin)):  # either form of the table
        one_pass = fused.norm_rope(x, norm, table)
        err_fused, err_plain = _errors(one_pass, two_steps, exact)
        assert one_pass.dtype == dtype and err_fused <= err_plain
    inplace = x.clone()
    assert fused.norm_rope(inplace, norm, cos_sin, out=inplace) is inplace
    assert torch.equal(inplace, fused.norm_rope(x, norm, cos_sin))
    # in chunks of tokens: the same values as one chunk of every token
    whole = fused.norm_rope(x, norm, cos_sin)
    old = fused.NORM_ROPE_CHUNK
    try:
        fused.NORM_ROPE_CHUNK = x.shape[-2]
        assert torch.equal(whole, fused.norm_rope(x, norm, cos_sin))
    finally:
        fused.NORM_ROPE_CHUNK = old


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_bfl_file(make_diffusers_dit(seed=3), tmp_path_factory.mktemp("fused") / "klein.safetensors")
    g = torch.Generator().manual_seed(4)
    inputs = dict(
        x=torch.randn(1, 12, 128, generator=g),
        x_ids=image_ids(3, 4),
        t=torch.tensor([0.6]),
        ctx=torch.randn(1, 7, 24, generator=g),
        ref=torch.randn(1, 6, 128, generator=g),
        ref_ids=reference_ids([(2, 3)]),
    )
    return path, inputs


def _low(inputs, dtype):
    return {k: v.to(dtype) if v.is_floating_point() and k != "t" else v for k, v in inputs.items()}


def _forward(path, inputs, dtype):
    net = load_transformer(path, dtype=dtype).transformer
    low = _low(inputs, dtype)
    with torch.inference_mode():
        extras = CallExtras(references=(low["ref"], low["ref_ids"]))
        return net(low["x"], low["x_ids"], low["t"], low["ctx"], extras)


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


# ---- the scratch buffer (``fused.Scratch``): the same values, no more memory -------------------------------


class _LivePeak(TorchDispatchMode):
    """The most bytes the tensors made inside held at once (each storage once; views of ``existing``
    tensors, the weights, are not new)."""

    def __init__(self, existing=()):
        super().__init__()
        self.live, self.current, self.peak = {}, 0, 0
        self.existing = {t.untyped_storage().data_ptr() for t in existing}

    def _freed(self, key):
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = storage.data_ptr()
                if key and key not in self.live and key not in self.existing:
                    self.live[key] = storage.nbytes()
                    self.current += storage.nbytes()
                    weakref.finalize(storage, self._freed, key)
        self.peak = max(self.peak, self.current)
        return out


def _no_scratch(monkeypatch):
    """The fused ops without their buffer: the projections, activation and join of the reference form."""
    for name in ("project", "mlp", "activate", "join"):
        monkeypatch.setattr(block_ops.FusedOps, name, getattr(block_ops.PlainOps, name))


def _kv_steps(path, inputs):
    net = load_transformer(path, variant="kv", dtype=torch.bfloat16).transformer
    low = _low(inputs, torch.bfloat16)
    with torch.inference_mode():
        cache = net.encode_reference_kv(low["ref"], low["ref_ids"])
        step = net(low["x"], low["x_ids"], low["t"], low["ctx"], CallExtras(kv_cache=cache))
    return [t.clone() for t in (*cache.double[0].get(1), *cache.single[0].get(1))], step


def _lora_step(path, inputs):
    net = load_transformer(path, dtype=torch.bfloat16).transformer
    g = torch.Generator().manual_seed(9)
    layer = net.single_blocks[0].linear1
    down = torch.randn(4, layer.in_features, generator=g)
    up = torch.randn(layer.out_features, 4, generator=g)
    net.single_blocks[0].linear1.add_patch("lora", ops.LowRankPatch(up, down))
    low = _low(inputs, torch.bfloat16)
    with torch.inference_mode():
        return net(
            low["x"], low["x_ids"], low["t"], low["ctx"], CallExtras(references=(low["ref"], low["ref_ids"]))
        )


def test_scratch_buffers_give_the_same_step_bit_for_bit(monkeypatch, tiny):
    # plain step with references, the KV model's stored K/V and cached step, a LoRA-patched linear1 (whose
    # output is its own tensor, not the buffer)
    path, inputs = tiny
    reused = (_forward(path, inputs, torch.bfloat16), _kv_steps(path, inputs), _lora_step(path, inputs))
    _no_scratch(monkeypatch)
    fresh = (_forward(path, inputs, torch.bfloat16), _kv_steps(path, inputs), _lora_step(path, inputs))
    assert torch.equal(reused[0], fresh[0])
    assert all(torch.equal(a, b) for a, b in zip(reused[1][0], fresh[1][0]))  # the stored K/V
    assert torch.equal(reused[1][1], fresh[1][1])
    assert torch.equal(reused[2], fresh[2])


def test_scratch_buffers_in_flux1_fill_give_the_same_step_bit_for_bit(monkeypatch, tmp_path):
    # FLUX.1's single block: GELU on one MLP input, biases on every linear layer
    path = write_fill_dit(tmp_path / "fill.safetensors")
    net = load_fill_transformer(path, dtype=torch.bfloat16).transformer
    g = torch.Generator().manual_seed(6)
    x = torch.randn(1, 12, net.config.in_channels, generator=g).bfloat16()
    ctx = torch.randn(1, 5, net.config.context_in_dim, generator=g).bfloat16()
    pooled = torch.randn(1, net.config.vec_in_dim, generator=g).bfloat16()
    extras = CallExtras(pooled=pooled, guidance=torch.tensor([30.0]))
    args = (x, fill_image_ids(3, 4), torch.tensor([0.5]), ctx, extras)
    with torch.inference_mode():
        reused = net(*args)
        _no_scratch(monkeypatch)
        assert torch.equal(reused, net(*args))


def test_scratch_buffers_hold_no_more_than_the_blocks_temporaries(monkeypatch):
    # klein's make-up at a tiny width: single blocks (where a step peaks) outnumber the double ones, and
    # attention's score tiles are small beside the activations (8 MiB against 9.4 MB per 3072-wide tensor
    # of 1.5k tokens at klein 4B's widths: here 64 KiB against 0.5 MB)
    monkeypatch.setenv(attention.CHOICE_ENV, "tiled")
    monkeypatch.setattr(attention, "TILE_SCORE_BYTES", 64 * 2**10)
    monkeypatch.setitem(
        attention.KERNELS,
        "tiled",
        lambda q, k, v, bias=None: attention.tiled_kernel(q, k, v, bias, attention.TILE_SCORE_BYTES),
    )
    config = Flux2Config(hidden_size=256, num_heads=2, depth=1, depth_single_blocks=3, context_in_dim=48)
    net = Flux2Transformer(config).bfloat16().eval()
    for i, p in enumerate(net.parameters()):
        p.data.normal_(0, 0.05, generator=torch.Generator().manual_seed(i))
    g = torch.Generator().manual_seed(7)
    x, ctx = torch.randn(1, 1024, 128, generator=g).bfloat16(), torch.randn(1, 64, 48, generator=g).bfloat16()
    args = (x, image_ids(32, 32), torch.tensor([0.5]), ctx)
    peaks = []
    for scratch in (True, False):
        if not scratch:
            _no_scratch(monkeypatch)
        with torch.inference_mode(), _LivePeak(net.parameters()) as live:
            net(*args)
        peaks.append(live.peak)
    assert peaks[0] <= peaks[1], peaks
