"""The attention kernels (``flux2_core.dit.attention``) and the measured choice among them
(``KernelChoice``: once per shape class, on a fake clock here, so no test depends on how fast a kernel runs on
the machine), and the seam that decides who measures (``block_ops``: the fused ops of a CPU below float32;
PyTorch's SDPA everywhere else)."""

from __future__ import annotations

import pytest
import torch

from flux2_core.dit import attention, block_ops


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.delenv(attention.CHOICE_ENV, raising=False)
    monkeypatch.delenv(block_ops.OPS_ENV, raising=False)


class FakeClock:
    """A clock that only moves when a kernel runs: ``cost[name]`` seconds a call."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _counting(monkeypatch, fast: str):
    """Every kernel with a call count and the shapes it was called on; on the returned clock ``fast`` takes
    1 ms a call and every other kernel 21 ms."""
    calls = dict.fromkeys(attention.KERNELS, 0)
    shapes = []
    real = dict(attention.KERNELS)
    clock = FakeClock()

    def wrap(name):
        def kernel(q, k, v, bias=None):
            calls[name] += 1
            shapes.append(tuple(q.shape))
            clock.now += 0.001 if name == fast else 0.021
            return real[name](q, k, v, bias)

        return kernel

    monkeypatch.setattr(attention, "KERNELS", {name: wrap(name) for name in real})
    return calls, shapes, attention.KernelChoice(clock=clock)


def _qkv(length=100, dtype=torch.bfloat16, heads=2):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, heads, length, 32, generator=g).to(dtype) for _ in range(3)]


@pytest.mark.parametrize("fast", attention.MEASURED)
def test_the_faster_kernel_is_measured_once_per_shape_class_and_kept(monkeypatch, caplog, fast):
    calls, _, choice = _counting(monkeypatch, fast)
    q, k, v = _qkv()
    with caplog.at_level("DEBUG", logger=attention.__name__):
        first = choice(q, k, v)
        assert all(calls[name] == 2 for name in attention.MEASURED)  # each twice, alternating
        assert calls["matmul"] == 0  # not a candidate
        assert torch.equal(first, attention.KERNELS[fast](q, k, v))  # the result is the chosen kernel's
        calls.update(dict.fromkeys(calls, 0))
        choice(*_qkv(length=120))  # the same class (lengths up to 128): no new measurement
        assert calls[fast] == 1 and sum(calls.values()) == 1
        assert choice.chosen == {("cpu", torch.bfloat16, 2, 32, 128, 128): fast}
        choice(*_qkv(length=300))  # another class: measured again
        assert all(calls[name] >= 2 for name in attention.MEASURED)
    choices = [r.getMessage() for r in caplog.records if r.getMessage().startswith("attention")]
    assert len(choices) == 2 and all(f": {fast} (best of 2" in m for m in choices)  # logged once a class


def test_the_choice_is_timed_on_a_few_heads_and_run_on_all(monkeypatch):
    calls, shapes, choice = _counting(monkeypatch, "tiled")
    heads = attention.MEASURED_HEADS + 4
    q, k, v = _qkv(heads=heads)
    out = choice(q, k, v)
    timed = shapes[: 2 * len(attention.MEASURED)]
    assert all(s[1] == attention.MEASURED_HEADS for s in timed)  # measured on the first heads
    assert shapes[-1][1] == heads and out.shape == q.shape  # then run once on every head
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert (out.float() - want).abs().max().item() < 2e-2


def test_the_plain_ops_run_pytorchs_kernel_unmeasured(monkeypatch):
    calls, _, choice = _counting(monkeypatch, "sdpa")
    monkeypatch.setattr(block_ops, "KERNELS", choice)
    with torch.inference_mode():
        for device, dtype in [("cuda", torch.bfloat16), ("cuda", torch.float16), ("cuda", torch.float32)]:
            assert type(block_ops.ops_for(device, dtype)) is block_ops.PlainOps
        assert type(block_ops.ops_for("cpu", torch.float32)) is block_ops.CpuOps  # the same kernel
    q, k, v = _qkv(dtype=torch.float32)
    out = block_ops.ops_for("cpu", torch.float32).attention(q, k, v)
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, k, v))
    assert sum(calls.values()) == 0 and choice.chosen == {}  # PyTorch's kernel itself, no measurement


def test_a_cpu_below_float32_measures_without_gradients(monkeypatch):
    calls, _, choice = _counting(monkeypatch, "tiled-small")
    monkeypatch.setattr(block_ops, "KERNELS", choice)
    with torch.inference_mode():
        ops = block_ops.ops_for("cpu", torch.bfloat16)
        assert type(ops) is block_ops.FusedOps
        ops.attention(*_qkv())
    assert list(choice.chosen.values()) == ["tiled-small"]
    assert type(block_ops.ops_for("cpu", torch.bfloat16)) is block_ops.PlainOps  # gradients on: plain


@pytest.mark.parametrize("forced", ["plain", "fused"])
def test_the_environment_fixes_the_ops(monkeypatch, forced):
    monkeypatch.setenv(block_ops.OPS_ENV, forced)
    with torch.inference_mode():
        assert block_ops.ops_for("cuda", torch.bfloat16).name == forced
        assert block_ops.ops_for("cpu", torch.float32).name == forced


@pytest.mark.parametrize("name", list(attention.KERNELS))
def test_the_environment_fixes_the_choice(monkeypatch, name):
    calls, _, choice = _counting(monkeypatch, "sdpa")
    monkeypatch.setenv(attention.CHOICE_ENV, name)
    choice(*_qkv())
    assert calls[name] == 1 and sum(calls.values()) == 1 and choice.chosen == {}


@pytest.mark.parametrize("score_bytes", [1 << 30, 2 * 120 * 2 * 2, 2 * 120 * 2 * 17])
@pytest.mark.parametrize("batch", [1, 2])
def test_tiles_of_heads_or_rows_give_the_one_shot_attention(score_bytes, batch):
    # every tile shape: all heads at once, one head and the fewest rows, one head and 17 rows (a partial
    # last tile); batch 2 writes through strided views of the output
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(batch, 3, 120, 16, generator=g) for _ in range(3))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    heads, rows = attention.tile(q.bfloat16(), k, score_bytes)
    assert heads * rows * batch * 120 * 2 <= max(score_bytes, attention.MIN_CHUNK * batch * 120 * 2)
    got = attention.tiled_kernel(q, k, v, score_bytes=score_bytes)
    assert (got - want).abs().max().item() < 1e-5  # float32: the same values up to summation order
    low = attention.tiled_kernel(q.bfloat16(), k.bfloat16(), v.bfloat16(), score_bytes=score_bytes)
    assert low.dtype == torch.bfloat16 and (low.float() - want).abs().max().item() < 2e-2


def test_tiles_group_heads_while_their_scores_fit():
    q = torch.empty(1, 24, 1536, 128, dtype=torch.bfloat16, device="meta")
    assert attention.tile(q, q, 8 * 2**20) == (1, 1536)  # 4.7 MB a head: one head of every row
    assert attention.tile(q, q, 16 * 2**20) == (3, 1536)
    big = torch.empty(1, 24, 16896, 128, dtype=torch.bfloat16, device="meta")
    heads, rows = attention.tile(big, big, 8 * 2**20)
    assert heads == 1 and rows * 16896 * 2 <= 8 * 2**20 and rows > 200


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
    tiny = attention.tiled_kernel(q, k, v, bias, score_bytes=1)  # one head, MIN_CHUNK rows a tile
    torch.testing.assert_close(tiny.float(), expected, atol=3e-2, rtol=3e-2)


def test_both_kernels_take_a_boolean_mask():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 2, 40, 16, generator=g).bfloat16() for _ in range(3))
    allowed = torch.rand(40, 40, generator=g) > 0.3
    allowed[:, 0] = True  # every query keeps a key
    additive = torch.zeros(40, 40).masked_fill(~allowed, -torch.inf)
    expected = ((q.float() @ k.float().transpose(-1, -2)) / 4.0 + additive).softmax(-1) @ v.float()
    for kernel in (attention.matmul_kernel, attention.sdpa_kernel, attention.tiled_kernel):
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
