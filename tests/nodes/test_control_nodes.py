"""The FLUX.2 [dev] Fun ControlNet nodes under the fake host: the loader (resident or streamed), Apply
ControlNet on the prompt, and the sampler that reads it, against the core's run of the same control."""

from __future__ import annotations

import pytest
import torch
from klein_nodes import core_module, image
from safetensors.torch import save_file
from tiny_control import control_state_dict

CONTROL = "FLUX.2-dev-Fun-Controlnet-Union-2602.safetensors"


@pytest.fixture(scope="module")
def control_file(fake_host):
    """A one-block control net in the release layout, for the tiny dev DiT (32 wide, heads of 16)."""
    folder = fake_host.folder("controlnet")
    folder.mkdir(exist_ok=True)
    save_file(control_state_dict(32, 16, 96, blocks=1, seed=21), str(folder / CONTROL))
    return CONTROL


@pytest.fixture(scope="module")
def vae(nodes, fake_host):
    (vae,) = nodes["Flux2KleinVAELoader"].execute("flux2_tiny_vae.safetensors")
    return vae


def _apply(nodes, dev, vae, control_net, strength=0.75, **extra):
    (conditioning,) = nodes["Flux2DevApplyControlNet"].execute(
        dev["positive"], control_net, vae, image(80, 112, seed=3), strength, 0.0, 1.0, **extra
    )
    return conditioning


def _sample(nodes, dev, positive, **overrides):
    args = dict(model=dev["model"], positive=positive, seed=5, steps=2, guidance=4.0, width=64, height=80,
                batch_size=1)  # fmt: skip
    return nodes["Flux2KleinSampler"].execute(**{**args, **overrides})[0]["samples"]


def test_the_sampler_runs_the_control_the_core_runs(nodes, pack, dev, vae, control_file, host):
    """The node's image is the core's ``sample`` under the same control (its context built by the core from
    the map at the output size) bit for bit; strength 0 is the plain image; the control net is loaded beside
    the model."""
    core = core_module(pack)
    (net,) = nodes["Flux2DevControlNetLoader"].execute(control_file)
    steered = _sample(nodes, dev, _apply(nodes, dev, vae, net))
    assert net.patcher in [p for p, _ in host.loads]
    pixels = image(80, 112, seed=3)[:1].permute(0, 3, 1, 2)
    with torch.inference_mode():
        context = core.control_context(vae.vae, 80, 64, pixels, None, None)
    applied = core.AppliedControl(net.net, context, 0.75, 0.0, 1.0)
    settings = core.SampleSettings(64, 80, 2, 4.0, 5, 1)
    expected = core.sample(
        core.SampleRequest(dev["model"].core, dev["positive"].embeds, settings, control=applied)
    )
    assert torch.equal(steered, expected)
    plain = _sample(nodes, dev, dev["positive"])
    assert torch.equal(_sample(nodes, dev, _apply(nodes, dev, vae, net, strength=0.0)), plain)
    assert (steered - plain).abs().mean() > 1e-3


def test_a_streamed_control_net_draws_the_resident_image(nodes, pack, dev, vae, control_file, host):
    streaming = core_module(pack, "devices.streaming")
    (resident,) = nodes["Flux2DevControlNetLoader"].execute(control_file)
    (streamed,) = nodes["Flux2DevControlNetLoader"].execute(control_file, offload="stream")
    streamer = streaming.streamer_of(streamed.net)
    assert streamer is not None and len(streamer.streamed_blocks) == 1
    assert streaming.streamer_of(resident.net) is None
    # the patcher manages the resident part only: the streamed block's weights are out of the module
    assert streamed.patcher.size < resident.patcher.size
    a = _sample(nodes, dev, _apply(nodes, dev, vae, resident))
    b = _sample(nodes, dev, _apply(nodes, dev, vae, streamed))
    assert torch.equal(a, b)


def test_width_and_height_zero_take_the_maps_aspect(nodes, dev, vae, control_file):
    """No reference and no latent: the 112 x 80 map at about 1 MP, enlarged at most 4x: 448 x 320."""
    (net,) = nodes["Flux2DevControlNetLoader"].execute(control_file)
    samples = _sample(nodes, dev, _apply(nodes, dev, vae, net), width=0, height=0, steps=1)
    assert samples.shape == (1, 128, 320 // 16, 448 // 16)


def test_bad_control_inputs_are_refused_with_the_fix(nodes, dev, loaded, vae, control_file, Flux2Error):
    (net,) = nodes["Flux2DevControlNetLoader"].execute(control_file)
    apply = nodes["Flux2DevApplyControlNet"]
    for start, end in ((0.8, 0.2), (0.5, 0.5)):
        with pytest.raises(Flux2Error, match=f"control start {start} is not before its end {end}: .*< end"):
            apply.execute(dev["positive"], net, vae, image(64, 64), 0.75, start, end)
    with pytest.raises(Flux2Error, match="needs a mask with its image: connect the mask too"):
        apply.execute(dev["positive"], net, vae, image(64, 64), 0.75, 0.0, 1.0, image=image(64, 64))
    steered = _apply(nodes, dev, vae, net)
    with pytest.raises(Flux2Error, match="connect FLUX.2 \\[dev\\] Apply ControlNet to the positive prompt"):
        _sample(nodes, dev, dev["positive"], negative=steered)
    # klein with the control net: refused with what it is for
    klein = dict(model=loaded["model"], positive=_apply(nodes, {"positive": loaded["positive"]}, vae, net))
    with pytest.raises(Flux2Error, match="only steers FLUX.2 \\[dev\\].*RefControl"):
        _sample(nodes, dev, klein["positive"], model=klein["model"], guidance=1.0)
    # into a native graph: refused by name, never silently dropped
    with pytest.raises(Flux2Error, match="run by the FLUX.2 Sampler only, not by native sampling nodes"):
        nodes["Flux2KleinToNativeConditioning"].execute(steered)


def test_regional_prompts_keep_the_control_in_either_order(nodes, dev, vae, control_file, Flux2Error):
    """Apply ControlNet before or after the Regional Prompt: the same control steers the same image."""
    (net,) = nodes["Flux2DevControlNetLoader"].execute(control_file)
    regional = nodes["Flux2KleinRegionalPrompt"]
    left = torch.zeros(1, 80, 64)
    left[:, :, :32] = 1
    steered = _apply(nodes, dev, vae, net)
    (before,) = regional.execute(dev["positive"], left, conditioning=steered)
    (as_region,) = regional.execute(steered, left, conditioning=dev["positive"])
    assert before.control is steered.control and as_region.control is steered.control
    (plain_regional,) = regional.execute(dev["positive"], left, conditioning=dev["positive"])
    after = _apply(nodes, {"positive": plain_regional}, vae, net)
    a, b = _sample(nodes, dev, before), _sample(nodes, dev, after)
    assert torch.equal(a, b)
    assert (a - _sample(nodes, dev, plain_regional)).abs().mean() > 1e-3  # the control reaches the image
    with pytest.raises(Flux2Error, match="each carry a FLUX.2 .dev. ControlNet: apply the ControlNet once"):
        regional.execute(_apply(nodes, dev, vae, net), left, conditioning=steered)
