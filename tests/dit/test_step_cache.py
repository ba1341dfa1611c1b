"""First-Block Cache (``flux2_core.dit.step_cache``) in the FLUX.2 core, on a tiny random klein DiT.

The rule (diffusers' ``FirstBlockCacheConfig``, diffusers/hooks/first_block_cache.py): after the first
block, r = its output minus its input on the image stream; with r_prev the same at the last step that ran
every block, the remaining blocks are skipped when mean|r - r_prev| / mean|r_prev| <= threshold, and the
image stream is then the first block's output plus what the remaining blocks added at that last full step.
The decisions are recomputed here by hand from the first block's own inputs and outputs, seen through
forward hooks. FLUX.1 Fill's cache is checked against diffusers' own in test_flux1_parity.py.
"""

from __future__ import annotations

import pytest
import torch
from tiny_dit import make_diffusers_dit, write_bfl_file

from flux2_core.configs import VARIANTS
from flux2_core.dit.files import load_transformer
from flux2_core.dit.step_cache import FirstBlockCache, StepCache
from flux2_core.dit.transformer import Flux2Model
from flux2_core.errors import Flux2Error
from flux2_core.sampling import SampleRequest, SampleSettings, sample

STEPS = 12
# On these random weights the first block's residual changes by 0.7-2.3 of its size from step to step (real
# models: about 0.05-0.3, hence their thresholds of 0.05-0.2), so a threshold of 1 skips some steps, not all.
THRESHOLD = 1.0


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    path = write_bfl_file(make_diffusers_dit(seed=3), tmp_path_factory.mktemp("fbc") / "klein.safetensors")
    return load_transformer(path).transformer


def _model(net, variant="distilled"):
    return Flux2Model(net, VARIANTS[variant], "tiny klein")


class Seen:
    """The first block's image stream in and out, and whether the last block ran, at every forward."""

    def __init__(self, net):
        self.first, self.last_ran, self.final_in = [], [], []
        self.handles = [
            net.double_blocks[0].register_forward_hook(self._first),
            net.single_blocks[-1].register_forward_hook(lambda m, a, o: self.last_ran.append(o)),
            net.final_layer.register_forward_pre_hook(lambda m, a: self.final_in.append(a[0].clone())),
            net.double_blocks[0].register_forward_pre_hook(lambda m, a: self.last_ran.append(None)),
        ]

    def _first(self, module, args, out):
        self.first.append((args[0].clone(), out[0].clone()))

    def remove(self):
        for h in self.handles:
            h.remove()


def _run(net, threshold, **kw):
    settings = SampleSettings(64, 80, STEPS, kw.pop("guidance", 1.0), seed=5)
    cache = StepCache(threshold)
    seen = Seen(net)
    try:
        model = _model(net, kw.pop("variant", "distilled"))
        out = sample(SampleRequest(model, torch.randn(1, 7, 24), settings, step_cache=cache, **kw))
    finally:
        seen.remove()
    return out, cache, seen


def _hand_decisions(seen, threshold):
    """Which forwards ran every block, by the rule, from the first block's in/out alone."""
    full, reference = [], None
    for before, after in seen.first:
        residual = after - before
        if reference is None:
            run = True
        else:
            ratio = (residual - reference).abs().mean() / reference.abs().mean()
            run = bool(ratio > threshold)
        if run:
            reference = residual
        full.append(run)
    return full


def test_threshold_zero_is_no_cache_bit_for_bit(net):
    torch.manual_seed(0)
    text = torch.randn(1, 7, 24)
    settings = SampleSettings(64, 80, 4, 1.0, seed=5)
    plain = sample(SampleRequest(_model(net), text, settings))
    cache = StepCache(0.0)
    assert torch.equal(sample(SampleRequest(_model(net), text, settings, step_cache=cache)), plain)
    assert cache.passes == [] and cache.describe() == ""


def test_the_decisions_follow_the_rule_and_a_skipped_step_adds_the_stored_residual(net):
    torch.manual_seed(0)
    out, cache, seen = _run(net, THRESHOLD)
    ran = [o is not None for o in _split_runs(seen.last_ran)]
    expected = _hand_decisions(seen, THRESHOLD)
    assert ran == expected
    assert 1 < sum(ran) < STEPS, ran  # the threshold skips some steps on these weights, not all
    assert cache.passes[0].full_steps == sum(ran) and cache.passes[0].steps == STEPS
    assert cache.describe() == f"step cache {THRESHOLD:g}: {sum(ran)} of {STEPS} steps ran every block"
    # a skipped step's final-layer input: the first block's output + (last full step's end - its first block)
    last_full = None
    for step, full in enumerate(ran):
        head = seen.first[step][1]
        if full:
            last_full = step
        else:
            stored = seen.final_in[last_full] - seen.first[last_full][1]
            torch.testing.assert_close(seen.final_in[step], head + stored, atol=1e-6, rtol=0)
    assert torch.isfinite(out).all()


def _split_runs(events):
    """The last-block outputs per forward (None: the forward stopped after the first block)."""
    runs = []
    for e in events:
        if e is None:
            runs.append(None)
        else:
            runs[-1] = e
    return runs


def test_a_larger_threshold_skips_more(net):
    torch.manual_seed(0)
    text = torch.randn(1, 7, 24)
    settings = SampleSettings(64, 80, STEPS, 1.0, seed=5)
    plain = sample(SampleRequest(_model(net), text, settings))
    full = []
    for threshold in (0.5, 1.0, 1.5, 10.0):
        cache = StepCache(threshold)
        out = sample(SampleRequest(_model(net), text, settings, step_cache=cache))
        full.append(cache.passes[0].full_steps)
        assert torch.isfinite(out).all()
        # 0.5: under every change, nothing is skipped and the run is the plain one, bit for bit
        assert torch.equal(out, plain) == (threshold == 0.5), threshold
    assert full == sorted(full, reverse=True) and full[0] == STEPS > full[1], full
    assert full[-1] == 1  # above every change: only the first step runs every block


def test_with_cfg_each_pass_keeps_its_own_state(net):
    torch.manual_seed(1)
    out, cache, seen = _run(net, THRESHOLD, variant="base", guidance=4.0, negative=torch.randn(1, 7, 24))
    assert len(cache.passes) == 2
    cond, uncond = seen.first[0::2], seen.first[1::2]  # the passes alternate: conditional first
    for pass_cache, firsts in zip(cache.passes, (cond, uncond)):
        expected = _hand_decisions(type("S", (), {"first": firsts})(), THRESHOLD)
        assert pass_cache.full_steps == sum(expected) and pass_cache.steps == STEPS
    assert "and" in cache.describe()


def test_a_new_run_starts_empty(net):
    torch.manual_seed(2)
    text = torch.randn(1, 7, 24)
    settings = SampleSettings(64, 80, STEPS, 1.0, seed=5)
    cache = StepCache(THRESHOLD)
    first = sample(SampleRequest(_model(net), text, settings, step_cache=cache))
    full = cache.passes[0].full_steps
    again = sample(SampleRequest(_model(net), text, settings, step_cache=cache))
    assert torch.equal(first, again) and cache.passes[0].full_steps == full


def test_the_kv_path_skips_with_the_reference_cache(net):
    from flux2_core.references import ReferenceLatents

    torch.manual_seed(3)
    refs = ReferenceLatents.from_latents([torch.randn(1, 128, 3, 4)])
    text = torch.randn(1, 7, 24)
    settings = SampleSettings(64, 80, STEPS, 1.0, seed=5)
    plain = sample(SampleRequest(_model(net, "kv"), text, settings, references=refs))
    cache = StepCache(THRESHOLD)
    cached = sample(SampleRequest(_model(net, "kv"), text, settings, references=refs, step_cache=cache))
    assert cache.passes[0].full_steps < STEPS
    assert (cached - plain).abs().mean() < 0.5 * plain.abs().mean()


@pytest.mark.parametrize("threshold", [-0.1, float("nan"), 11.0])
def test_a_threshold_out_of_range_is_refused_by_name(threshold):
    with pytest.raises(Flux2Error, match="give 0 \\(off\\) or a threshold up to 10, e.g. 0.1"):
        FirstBlockCache(threshold)


def test_the_command_line_takes_a_threshold_and_refuses_a_bad_one(tmp_path, caplog):
    import logging

    from tiny_text import make_tiny_qwen3, write_comfy_file
    from tiny_vae import random_vae_state_dict
    from tiny_vae import write_bfl_file as write_vae

    from flux2_core.cli.main import main

    model = write_bfl_file(make_diffusers_dit(seed=3, joint_attention_dim=96), tmp_path / "klein.safetensors")
    text_encoder = write_comfy_file(make_tiny_qwen3(), tmp_path / "qwen.safetensors")
    files = ["--model", str(model), "--text-encoder", str(text_encoder),
             "--vae", str(write_vae(random_vae_state_dict(seed=6), tmp_path / "vae.safetensors")),
             "--prompt", "a fox", "--width", "64", "--height", "64", "--steps", "8"]  # fmt: skip
    with caplog.at_level(logging.INFO):
        assert main(["generate", *files, "--output", str(tmp_path / "a.png"), "--step-cache", "1"]) == 0
    assert " of 8 steps ran every block" in caplog.text and "step cache 1: " in caplog.text
    caplog.clear()
    assert main(["generate", *files, "--output", str(tmp_path / "b.png"), "--step-cache", "-1"]) == 2
    assert "step cache -1.0: give 0 (off) or a threshold up to 10, e.g. 0.1" in caplog.text
    assert not (tmp_path / "b.png").exists()


def test_streamed_and_split_models_skip_the_same_steps_with_the_same_result(tmp_path):
    from flux2_core.devices.placement import place_blocks, remove_placement
    from flux2_core.devices.streaming import disable_streaming, enable_streaming

    path = write_bfl_file(make_diffusers_dit(seed=3), tmp_path / "klein.safetensors")
    torch.manual_seed(0)
    text = torch.randn(1, 7, 24)
    settings = SampleSettings(64, 80, STEPS, 1.0, seed=5)
    resident, streamed, split = (load_transformer(path).transformer for _ in range(3))
    caches = [StepCache(THRESHOLD) for _ in range(3)]
    expected = sample(SampleRequest(_model(resident), text, settings, step_cache=caches[0]))
    streamer = enable_streaming(streamed, "cpu")  # every block copied in just before it runs
    held = []  # the block copies on the device when the final layer has run, at every step
    hook = streamed.final_layer.register_forward_hook(lambda m, a, o: held.append(streamer.device_bytes))
    got_streamed = sample(SampleRequest(_model(streamed), text, settings, step_cache=caches[1]))
    hook.remove()
    assert held == [0] * STEPS  # a step that stopped after the first block left no prefetched copy behind
    disable_streaming(streamed)
    place_blocks(split, ["cpu", "cpu"])  # the blocks over two devices (the CPU standing in for both)
    got_split = sample(SampleRequest(_model(split), text, settings, step_cache=caches[2]))
    remove_placement(split)
    assert torch.equal(got_streamed, expected) and torch.equal(got_split, expected)
    assert len({c.passes[0].full_steps for c in caches}) == 1 and caches[0].passes[0].full_steps < STEPS
