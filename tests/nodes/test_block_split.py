"""The block split across devices (two CPU devices standing in), and the sampler's step cache input."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from comfy_stubs import pack_nodes
from klein_nodes import core_module, run_sampler


def test_block_split_on_two_cpu_devices_is_bit_identical_and_loads_every_part(nodes, dev, host):
    loader = nodes["Flux2KleinModelLoader"]
    out = loader.execute("flux2_dev_tiny.safetensors", "auto", devices="cpu, cpu")
    (split,) = out.args
    net = split.core.transformer
    assert len(split.patchers) == 2 and split.patchers[1] is split.more_patchers[0]
    # each patcher manages the modules placed on its device; together every weight, each exactly once
    held = [{id(p) for p in patcher.model.module.parameters()} for patcher in split.patchers]
    assert (
        held[0]
        and held[1]
        and not held[0] & held[1]
        and held[0] | held[1] == {id(p) for p in net.parameters()}
    )
    assert {id(p) for p in net.img_in.parameters()} <= held[0]  # the parts outside the blocks: first device
    last = net.blocks()[-1]
    assert {id(p) for p in last.parameters()} <= held[1]
    nbytes = [sum(t.nbytes for t in patcher.model.module.state_dict().values()) for patcher in split.patchers]
    assert [patcher.size for patcher in split.patchers] == nbytes
    # the memory per device: on the node and in the model
    assert out.ui["text"] == [split.split]
    on_second = [i for i, block in enumerate(net.blocks()) if {id(p) for p in block.parameters()} <= held[1]]
    assert on_second == list(range(on_second[0], len(net.blocks())))  # one contiguous run, to the end
    first = "block 0" if on_second[0] == 1 else f"blocks 0-{on_second[0] - 1}"
    second = f"blocks {on_second[0]}-{on_second[-1]}" if len(on_second) > 1 else f"block {on_second[0]}"
    assert split.split == (
        f"cpu: {first} and the rest, {nbytes[0] / 1e9:.2f} GB; cpu: {second}, {nbytes[1] / 1e9:.2f} GB"
    )
    assert all(block._forward_pre_hooks for block in net.blocks())  # inputs follow each block's weights

    args = dict(positive=dev["positive"], seed=9, steps=2, guidance=4.0, width=64, height=64, batch_size=1)
    host.loads.clear()
    (whole,) = nodes["Flux2KleinSampler"].execute(model=dev["model"], **args)
    (parts,) = nodes["Flux2KleinSampler"].execute(model=split, **args)
    assert torch.equal(parts["samples"], whole["samples"])
    assert host.loads[-2:] == [(split.patchers[0], True), (split.patchers[1], True)]  # both, fully, first


def test_devices_are_validated_with_clear_messages(nodes, pack, Flux2Error):
    loader = pack_nodes(pack).classes["Flux2KleinModelLoader"]
    assert loader.validate_inputs(devices="") is True and loader.validate_inputs(devices=None) is True
    assert loader.validate_inputs(devices="cpu,cpu") is True
    assert "not a device name" in loader.validate_inputs(devices="gpu0,gpu1")
    missing = f"cuda:{torch.cuda.device_count()}"
    assert "does not exist" in loader.validate_inputs(devices=f"cpu,{missing}")
    with pytest.raises(Flux2Error, match="does not exist"):
        nodes["Flux2KleinModelLoader"].execute("klein_tiny.safetensors", "auto", devices=missing)
    with pytest.raises(Flux2Error, match="devices and offload 'stream' cannot be combined"):
        nodes["Flux2KleinModelLoader"].execute(
            "klein_tiny.safetensors", "auto", "default", "stream", 0, "cpu,cpu"
        )


def test_a_klein_model_splits_too_and_one_device_is_no_split(nodes, loaded):
    (split,) = (
        nodes["Flux2KleinModelLoader"].execute("klein_tiny.safetensors", "auto", devices="cpu,cpu").args
    )
    assert torch.equal(run_sampler(nodes, {**loaded, "model": split}), run_sampler(nodes, loaded))
    (one,) = nodes["Flux2KleinModelLoader"].execute("klein_tiny.safetensors", "auto", devices="cpu")
    assert one.more_patchers == () and one.patcher.load_device == torch.device("cpu") and one.split == ""
    assert not any(block._forward_pre_hooks for block in one.core.transformer.blocks())


def test_text_encoder_on_a_device_of_its_own_stays_loaded(nodes, pack, dev, host, monkeypatch):
    # Two CUDA devices are pretended (nothing runs on them): the choice reaches ComfyUI's patcher.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    choices = (
        pack_nodes(pack)
        .classes["Flux2KleinTextEncoderLoader"]
        .INPUT_TYPES()["optional"]["device"][1]["options"]
    )
    assert choices[:4] == ["default", "cpu", "cuda:0", "cuda:1"]
    (encoder,) = nodes["Flux2KleinTextEncoderLoader"].execute("mistral_tiny.safetensors", device="cuda:1")
    assert encoder.patcher.load_device == torch.device("cuda:1") and encoder.keep_loaded
    assert encoder.encoder.device == torch.device("cpu")  # built on the offload device, moved when used
    monkeypatch.undo()
    # kept loaded between prompts (shown on the CPU: the same encoder, marked to stay)
    resident = dataclasses.replace(dev["encoder"], keep_loaded=True)
    (cond,) = nodes["Flux2KleinTextEncode"].execute(resident, "a red apple on a table")
    assert host.loads == [(resident.patcher, True)] and host.unloads == []
    assert torch.equal(cond.embeds, dev["positive"].embeds)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="moving activations between a GPU and the CPU needs a GPU"
)
def test_block_split_across_a_gpu_and_the_cpu_matches_the_gpu_alone(nodes, dev, monkeypatch, pack):
    """With a GPU: the first half of the blocks on cuda:0, the rest on the CPU (real moves both ways)."""
    (whole,) = nodes["Flux2KleinModelLoader"].execute("flux2_dev_tiny.safetensors", "auto", devices="cuda:0")
    (split,) = nodes["Flux2KleinModelLoader"].execute("flux2_dev_tiny.safetensors", "auto",
                                                   devices="cuda:0,cpu").args  # fmt: skip
    args = dict(positive=dev["positive"], seed=9, steps=2, guidance=4.0, width=64, height=64, batch_size=1)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        (a,) = nodes["Flux2KleinSampler"].execute(model=whole, **args)
        (b,) = nodes["Flux2KleinSampler"].execute(model=split, **args)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    blocks = split.core.transformer.blocks()
    assert next(blocks[0].parameters()).is_cuda and not next(blocks[-1].parameters()).is_cuda
    torch.testing.assert_close(b["samples"], a["samples"], rtol=0, atol=1e-4)


def test_the_step_cache_input_runs_the_cores_cache_and_says_what_it_did(nodes, loaded, pack):
    args = dict(model=loaded["model"], positive=loaded["positive"], seed=7, steps=8, guidance=1.0,
                width=64, height=64, batch_size=1)  # fmt: skip
    sampler = nodes["Flux2KleinSampler"]
    plain = sampler.execute(**args)
    assert plain.ui is None  # 0, the default: no cache, nothing shown
    assert torch.equal(sampler.execute(**args, step_cache=0.0)[0]["samples"], plain[0]["samples"])
    shown = sampler.execute(**args, step_cache=1.0)  # random weights change by about 1 per step
    core = core_module(pack)
    cache = core.StepCache(1.0)
    expected = core.sample(core.SampleRequest(loaded["model"].core, loaded["positive"].embeds,
                           core.SampleSettings(64, 64, 8, 1.0, 7, 1), step_cache=cache))  # fmt: skip
    assert torch.equal(shown.args[0]["samples"], expected)
    assert shown.ui["text"] == [cache.describe()] and 1 < cache.passes[0].full_steps < 8
    assert cache.describe().startswith("step cache 1: ") and cache.describe().endswith(
        " of 8 steps ran every block"
    )
