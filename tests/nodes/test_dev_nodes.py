"""FLUX.2 [dev] through the same nodes: the dev DiT and the Mistral encoder."""

from __future__ import annotations

import sys

import pytest
import torch
from klein_nodes import DEV_TEXT_WIDTH, TEXT_WIDTH, core_module, run_sampler


def test_dev_model_and_mistral_encoder_load_through_the_nodes(dev):
    model, encoder, positive = dev["model"], dev["encoder"], dev["positive"]
    assert model.core.variant.name == "dev" and model.core.config.guidance_embed
    assert model.more_patchers == () and model.split == ""  # one device: one patcher, as for klein
    assert "Mistral" in encoder.encoder.name and encoder.patcher.model.module is encoder.encoder.model
    assert positive.embeds.shape == (1, 512, DEV_TEXT_WIDTH) and positive.width == DEV_TEXT_WIDTH
    assert "Mistral" in positive.encoder_name
    # the Tekken tokenizer ComfyUI's file carries is the one used (ComfyUI ships no Mistral vocabulary)
    assert encoder.encoder.tokenizer.source == "mistral_tiny.safetensors (tekken_model)"


def test_dev_sampling_embeds_the_guidance_and_equals_the_core_run(nodes, dev, loaded, pack, host):
    """The node passes prompt, seed, size and guidance to the core's sampler unchanged (the core's dev path
    is checked against diffusers' Flux2Pipeline in test_dev_parity.py), one pass per step."""
    core = sys.modules[f"{pack.__name__}.flux2_core"]
    args = dict(model=dev["model"], positive=dev["positive"], seed=5, steps=2, guidance=4.0, width=64,
                height=80, batch_size=1)  # fmt: skip
    (out,) = nodes["Flux2KleinSampler"].execute(**args)
    settings = core.SampleSettings(64, 80, 2, 4.0, 5, 1)
    expected = core.sample(core.SampleRequest(dev["model"].core, dev["positive"].embeds, settings))
    assert torch.equal(out["samples"], expected) and out["samples"].shape == (1, 128, 5, 4)
    assert [(v, t) for v, t, _ in host.progress] == [(1, 2), (2, 2)]
    (lower,) = nodes["Flux2KleinSampler"].execute(**{**args, "guidance": 2.0})
    assert not torch.equal(lower["samples"], out["samples"])  # the value reaches the guidance embedder
    # no CFG for dev: a negative prompt changes nothing
    (with_negative,) = nodes["Flux2KleinSampler"].execute(**args, negative=dev["positive"])
    assert torch.equal(with_negative["samples"], out["samples"])


def test_dev_with_qwen3_and_klein_with_mistral_are_refused_before_the_model_loads(
    nodes, dev, loaded, host, Flux2Error
):
    with pytest.raises(Flux2Error, match="needs the Mistral Small 3.x text encoder") as caught:
        run_sampler(nodes, loaded, model=dev["model"], positive=loaded["positive"])
    assert f"{DEV_TEXT_WIDTH}-wide" in str(caught.value) and f"gives {TEXT_WIDTH}" in str(caught.value)
    with pytest.raises(Flux2Error, match="needs a Qwen3 text encoder") as caught:
        run_sampler(nodes, loaded, positive=dev["positive"])
    assert f"{TEXT_WIDTH}-wide" in str(caught.value) and f"gives {DEV_TEXT_WIDTH}" in str(caught.value)
    assert host.loads == [] and host.progress == []  # neither model was moved, no step ran


@pytest.mark.parametrize(("name", "kind"), [("t5xxl_tiny.safetensors", "T5-XXL"),
                                            ("clip_l_tiny.safetensors", "CLIP-L")])  # fmt: skip
def test_a_flux1_text_encoder_in_the_flux2_loader_names_the_right_files(nodes, name, kind, Flux2Error):
    with pytest.raises(Flux2Error, match=f"{name} is {kind}, a FLUX.1 text encoder") as caught:
        nodes["Flux2KleinTextEncoderLoader"].execute(name)
    message = str(caught.value)
    assert "mistral_3_small_flux2_bf16.safetensors" in message and "qwen_3_4b.safetensors" in message
    assert "FLUX.1 Fill [dev]'s text encoder loader" in message


def test_the_lora_loader_applies_a_dev_lora_as_the_core_does(nodes, dev, loaded, pack, fake_host, Flux2Error):
    """A fal-trainer LoRA on dev's guidance embedder, a double block and the final layer: the sampler's image
    is the core's with the same LoRA prepared by the core; a dev LoRA on klein is refused by name."""
    core = core_module(pack)
    lora_core = core_module(pack, "lora")
    out = nodes["Flux2KleinLoraLoader"].execute(dev["model"], "tiny_dev_lora.safetensors", 0.8)
    model, report, _ = out.args
    assert "fal / PEFT on BFL names (base_model.model.)" in report and "3 of the file's 3 modules" in report
    args = dict(positive=dev["positive"], seed=5, steps=2, guidance=4.0, width=64, height=64, batch_size=1)
    (with_lora,) = nodes["Flux2KleinSampler"].execute(model=model, **args)
    (plain,) = nodes["Flux2KleinSampler"].execute(model=dev["model"], **args)
    lora = lora_core.prepare_lora(
        lora_core.read_lora(fake_host.folder("loras") / "tiny_dev_lora.safetensors"),
        dev["model"].core.transformer, strength=0.8,
    )  # fmt: skip
    settings = core.SampleSettings(64, 64, 2, 4.0, 5, 1)
    expected = core.sample(
        core.SampleRequest(dev["model"].core.with_lora(lora), dev["positive"].embeds, settings)
    )
    assert torch.equal(with_lora["samples"], expected)
    assert (with_lora["samples"] - plain["samples"]).abs().max() > 1e-3
    with pytest.raises(Flux2Error, match="is a FLUX.2 \\[dev\\] LoRA \\(it has the guidance embedder"):
        nodes["Flux2KleinLoraLoader"].execute(loaded["model"], "tiny_dev_lora.safetensors", 1.0)


@pytest.mark.parametrize("family", ["dev", "klein"])
def test_the_sampler_sigmas_input_runs_the_list_as_the_command_line_does(
    nodes, dev, loaded, pack, host, family
):
    """A native SIGMAS tensor (ManualSigmas gives float32) replaces the schedule and the steps; the settings
    equal the command line's ``--sigmas`` for the same text, and the latents the core's run with them."""
    from flux2_core.cli.inputs import sigma_list  # the command line's parsing (plain floats out)

    core = core_module(pack)
    text = "1.0, 0.6509, 0.4374, 0.2932, 0.1893, 0.1108, 0.0495, 0.00031"
    sigmas = torch.tensor([float(v) for v in text.split(",")], dtype=torch.float32)
    models = dev if family == "dev" else loaded
    args = dict(model=models["model"], positive=models["positive"], seed=5, steps=28, guidance=2.5, width=64,
                height=64, batch_size=1)  # fmt: skip
    (out,) = nodes["Flux2KleinSampler"].execute(**args, sigmas=sigmas)
    settings = core.SampleSettings(64, 64, 28, 2.5, 5, 1).with_sigmas(sigmas)
    assert settings == core.SampleSettings(64, 64, 1, 2.5, 5, 1).with_sigmas(sigma_list(text))
    expected = core.sample(core.SampleRequest(models["model"].core, models["positive"].embeds, settings))
    assert torch.equal(out["samples"], expected)
    assert [t for _, t, _ in host.progress] == [8] * 8  # the list's 8 steps, not the widget's 28
    (own,) = nodes["Flux2KleinSampler"].execute(**{**args, "steps": 8})
    assert not torch.equal(own["samples"], out["samples"])
