"""The attention kernel is chosen by measurement where more than one exists (``flux2_core.dit.attention``):
on a CPU in bfloat16 / float16, once per shape class and process; PyTorch's SDPA everywhere else."""

from __future__ import annotations

import time

import pytest
import torch

from flux2_core.dit import attention


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(attention, "_CHOSEN", {})
    monkeypatch.delenv(attention.CHOICE_ENV, raising=False)


def _counting(monkeypatch, slow: str):
    """Both kernels with a call count; ``slow`` takes 20 ms longer per call."""
    calls = {"sdpa": 0, "matmul": 0}
    real = dict(attention.KERNELS)

    def wrap(name):
        def kernel(q, k, v, bias=None):
            calls[name] += 1
            if name == slow:
                time.sleep(0.02)
            return real[name](q, k, v, bias)

        return kernel

    monkeypatch.setattr(attention, "KERNELS", {name: wrap(name) for name in real})
    return calls


def _qkv(length=100, dtype=torch.bfloat16, heads=2):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, heads, length, 32, generator=g).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("slow, fast", [("sdpa", "matmul"), ("matmul", "sdpa")])
def test_the_faster_kernel_is_measured_once_per_shape_class_and_kept(monkeypatch, slow, fast):
    calls = _counting(monkeypatch, slow)
    q, k, v = _qkv()
    first = attention.sdpa(q, k, v)
    assert calls == {"sdpa": 2, "matmul": 2}  # measured: each twice, alternating
    assert torch.equal(first, attention.KERNELS[fast](q, k, v))  # the result is the chosen kernel's
    calls.update(sdpa=0, matmul=0)
    attention.sdpa(*_qkv(length=120))  # the same class (lengths up to 128): no new measurement
    assert calls == {fast: 1, slow: 0}
    assert attention.chosen() == {("cpu", torch.bfloat16, 2, 32, 128, 128): fast}
    attention.sdpa(*_qkv(length=300))  # another class: measured again
    assert calls == {fast: 3, slow: 2}


def test_a_gpu_or_float32_runs_pytorchs_kernel_unmeasured(monkeypatch):
    calls = _counting(monkeypatch, "matmul")
    q, k, v = _qkv(dtype=torch.float32)
    assert torch.equal(attention.sdpa(q, k, v), torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert calls == {"sdpa": 0, "matmul": 0} and attention.chosen() == {}  # no measurement, no choice


@pytest.mark.parametrize("name", ["sdpa", "matmul"])
def test_the_environment_fixes_the_choice(monkeypatch, name):
    calls = _counting(monkeypatch, "sdpa")
    monkeypatch.setenv(attention.CHOICE_ENV, name)
    attention.sdpa(*_qkv())
    assert calls[name] == 1 and sum(calls.values()) == 1 and attention.chosen() == {}


def test_the_shape_class_rounds_lengths_up_to_powers_of_two():
    q = torch.empty(1, 24, 4608, 128, dtype=torch.bfloat16)
    k = torch.empty(1, 24, 5120, 128, dtype=torch.bfloat16)
    assert attention.shape_class(q, k) == ("cpu", torch.bfloat16, 24, 128, 8192, 8192)
    assert attention.shape_class(q[:, :, :1024], k[:, :, :1025]) == (
        "cpu",
        torch.bfloat16,
        24,
        128,
        1024,
        2048,
    )


@pytest.mark.parametrize("shape", [(1, 1, 1, 40), (1, 1, 40, 40)])
def test_both_kernels_add_the_same_bias(shape):
    # a per-key bias (reference strength) and a full [Lq, Lk] one, -inf included, over more queries than a
    # chunk holds, in bfloat16 as the measured choice runs them
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g).bfloat16() for _ in range(3))
    bias = torch.randn(shape, generator=g)
    bias[..., 5] = -torch.inf
    bias = bias.bfloat16()
    chunk = attention.CPU_ATTENTION_CHUNK
    try:
        attention.CPU_ATTENTION_CHUNK = 16
        out = attention.matmul_kernel(q, k, v, bias)
    finally:
        attention.CPU_ATTENTION_CHUNK = chunk
    expected = ((q.float() @ k.float().transpose(-1, -2)) / 4.0 + bias.float()).softmax(-1) @ v.float()
    torch.testing.assert_close(out.float(), expected, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(attention.sdpa_kernel(q, k, v, bias).float(), expected, atol=3e-2, rtol=3e-2)


def test_both_kernels_take_a_boolean_mask():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g).bfloat16() for _ in range(3))
    allowed = torch.rand(40, 40, generator=g) > 0.3
    allowed[:, 0] = True  # every query keeps a key
    additive = torch.zeros(40, 40).masked_fill(~allowed, -torch.inf)
    expected = ((q.float() @ k.float().transpose(-1, -2)) / 4.0 + additive).softmax(-1) @ v.float()
    for kernel in (attention.matmul_kernel, attention.sdpa_kernel):
        torch.testing.assert_close(kernel(q, k, v, allowed).float(), expected, atol=3e-2, rtol=3e-2)


def test_the_matmul_kernels_scores_stay_within_their_budget():
    # at 4 MP (16.9k tokens, 24 heads, bf16) 1024 query rows would hold 0.8 GB of scores (and as much again
    # for their softmax): the rows shrink with the keys, and the result is the one-shot attention's
    big = torch.empty(1, 24, 16896, 128, dtype=torch.bfloat16, device="meta")
    assert attention.chunk_rows(big, big) * 24 * 16896 * 2 <= attention.CPU_SCORE_BYTES
    small = torch.empty(1, 24, 1536, 128, dtype=torch.bfloat16, device="meta")
    assert attention.chunk_rows(small, small) == attention.CPU_ATTENTION_CHUNK  # short sequences as before
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 200, 16, generator=g) for _ in range(3))
    budget = attention.CPU_SCORE_BYTES
    try:
        attention.CPU_SCORE_BYTES = 2 * 200 * 4 * 24  # 24 rows a chunk
        assert attention.chunk_rows(q, k) == 24
        out = attention.matmul_kernel(q, k, v)
    finally:
        attention.CPU_SCORE_BYTES = budget
    torch.testing.assert_close(out, ((q @ k.transpose(-1, -2)) / 4.0).softmax(-1) @ v, atol=1e-5, rtol=1e-5)
