"""The FLUX.2 [dev] Fun ControlNet against VideoX-Fun's ``Flux2ControlTransformer2DModel`` (the reference).

One random tiny model of the reference, its base part loaded by our DiT loader (diffusers names) and its
control part, saved as the release files are (``control_img_in.*``, ``control_transformer_blocks.*``), by
our control net loader: the outputs agree within float32 noise with and without references in the sequence,
strength 0 gives the plain dev output bit for bit, and the wrong files are refused by name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tiny_control import control_state_dict
from tiny_dit import make_diffusers_dit
from videox_reference import reference_module, reference_pipeline

from flux2_core import Flux2Error, load_transformer
from flux2_core.dit.call import CallExtras
from flux2_core.dit.control import CONTROL_CHANNELS, CONTROL_SPEC, Control, check_pairing, load_controlnet
from flux2_core.dit.files import DIT_SPEC
from flux2_core.steering.control_image import control_context
from flux2_core.weights.checkpoint import Checkpoint
from flux2_core.weights.loading import load_checkpoint

TINY = dict(
    in_channels=128, num_layers=4, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
    joint_attention_dim=24, axes_dims_rope=(4, 4, 4, 4), control_layers=[0, 2],
    control_in_dim=CONTROL_CHANNELS,
)  # fmt: skip
CONTROL_FILE = "FLUX.2-dev-Fun-Controlnet-Union.safetensors"


@pytest.fixture(scope="module")
def reference():
    module = reference_module()
    torch.manual_seed(0)
    model = module.Flux2ControlTransformer2DModel(**TINY).eval()
    with torch.no_grad():
        for p in model.parameters():  # the zero-initialised projections too: every path must carry signal
            std = 0.3 if p.ndim == 1 else 1.0 / p.shape[1] ** 0.5
            p.copy_(torch.randn_like(p) * std + (1.0 if p.ndim == 1 and p.shape[0] <= 16 else 0.0))
    return model


def _write(folder: Path, sd: dict) -> Path:
    sd = {k: v.contiguous() for k, v in sd.items()}
    control = {k: v for k, v in sd.items() if k.startswith("control")}
    save_file(control, str(folder / CONTROL_FILE))
    save_file({k: v for k, v in sd.items() if k not in control}, str(folder / "flux2-dev.safetensors"))
    return folder


@pytest.fixture(scope="module")
def files(reference, tmp_path_factory):
    """The reference model's base and control parts, as two files."""
    return _write(tmp_path_factory.mktemp("control"), reference.state_dict())


@pytest.fixture(scope="module")
def own_files(tmp_path_factory):
    """A tiny dev DiT (diffusers' FLUX.2 classes) and a control file in the release layout, without the
    reference checkout: what runs everywhere."""
    dit = make_diffusers_dit(
        num_layers=4, num_single_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=24, axes_dims_rope=(4, 4, 4, 4), guidance_embeds=True,
    )  # fmt: skip
    return _write(tmp_path_factory.mktemp("own"), {**dit.state_dict(), **control_state_dict(32, 16, 96, 2)})


def _inputs(refs: int = 0, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    side, text = 6, 5
    x = torch.randn(1, side * side, 128, generator=g)
    ctx = torch.randn(1, text, 24, generator=g)
    ids = torch.zeros(side * side, 4)
    ids[:, 1], ids[:, 2] = torch.arange(side * side) // side, torch.arange(side * side) % side
    txt_ids = torch.zeros(text, 4)
    txt_ids[:, 3] = torch.arange(text)
    context = torch.randn(1, side * side, CONTROL_CHANNELS, generator=g)
    ref = torch.randn(1, refs * 16, 128, generator=g) if refs else None
    ref_ids = None
    if refs:
        ref_ids = torch.zeros(refs * 16, 4)
        ref_ids[:, 0] = 10
        ref_ids[:, 1], ref_ids[:, 2] = torch.arange(16).repeat(refs) // 4, torch.arange(16).repeat(refs) % 4
    return x, ids, ctx, txt_ids, context, ref, ref_ids


def _extras(ref, ref_ids, **kw) -> CallExtras:
    """The DiT call's extras with the references (none when ``ref`` is None)."""
    return CallExtras(references=None if ref is None else (ref, ref_ids), **kw)


@pytest.mark.parametrize("refs", [0, 1])
@pytest.mark.parametrize("strength", [0.75, 1.0])
def test_ours_equals_the_reference_model(reference, files, refs, strength):
    """Text-to-image and multi-reference edit under control: the reference pipeline's call (references after
    the noisy tokens, the control context zero-padded over them, hints on the whole image stream)."""
    x, ids, ctx, txt_ids, context, ref, ref_ids = _inputs(refs)
    t, guidance = torch.tensor([0.6]), torch.tensor([4.0])
    with torch.no_grad():
        hidden, img_ids, cc = x, ids, context
        if refs:
            hidden, img_ids = torch.cat([x, ref], 1), torch.cat([ids, ref_ids])
            cc = torch.cat([context, torch.zeros(1, ref.shape[1], CONTROL_CHANNELS)], 1)
        theirs = reference(
            hidden_states=hidden, encoder_hidden_states=ctx, timestep=t, img_ids=img_ids, txt_ids=txt_ids,
            guidance=guidance, control_context=cc, control_context_scale=strength, return_dict=False,
        )[0][:, : x.shape[1]]  # fmt: skip
    model = load_transformer(files / "flux2-dev.safetensors", variant="dev")
    control = load_controlnet(files / CONTROL_FILE)
    assert control.layers == (0, 2)
    check_pairing(control, model.transformer)
    net = model.transformer
    ours = net(
        x, ids, t, ctx, _extras(ref, ref_ids, guidance=guidance, control=Control(control, context, strength))
    )
    plain = net(x, ids, t, ctx, _extras(ref, ref_ids, guidance=guidance))
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    assert (ours - plain).abs().max() > 1e-2, "the hints barely change the output: the check could not fail"
    off = net(
        x, ids, t, ctx, _extras(ref, ref_ids, guidance=guidance, control=Control(control, context, 0.0))
    )
    assert torch.equal(off, plain)


def test_hints_equal_the_reference_control_branch(reference, files):
    """Each hint (after_proj of control block k) against the reference's own control branch."""
    x, ids, ctx, txt_ids, context, _, _ = _inputs()
    t, guidance = torch.tensor([0.3]), torch.tensor([2.5])
    captured = []
    hook = reference.forward_control
    reference.forward_control = lambda *a, **k: captured.append(hook(*a, **k)) or captured[-1]
    try:
        with torch.no_grad():
            reference(hidden_states=x, encoder_hidden_states=ctx, timestep=t, img_ids=ids, txt_ids=txt_ids,
                      guidance=guidance, control_context=context, return_dict=False)  # fmt: skip
    finally:
        reference.forward_control = hook
    net = load_transformer(files / "flux2-dev.safetensors", variant="dev").transformer
    control = load_controlnet(files / CONTROL_FILE)
    vec = net._vec(t, guidance, x.dtype)
    img_mod, txt_mod = net.double_stream_modulation_img(vec), net.double_stream_modulation_txt(vec)
    call = net.block_call(x, torch.cat([txt_ids, ids]), ctx.shape[1])
    ours = control.hints(context, net.img_in(x), net.txt_in(ctx), img_mod, txt_mod, call)
    assert len(ours) == len(captured[0]) == 2
    for mine, theirs in zip(ours, captured[0]):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-5)


def test_strength_zero_is_the_plain_output_and_hints_change_it(own_files):
    """Without the reference: the release layout loads, strength 0 (and no control) is the plain dev output
    bit for bit, and a strength changes it in proportion near 0 (hints are added, scaled)."""
    x, ids, ctx, txt_ids, context, ref, ref_ids = _inputs(refs=1)
    net = load_transformer(own_files / "flux2-dev.safetensors", variant="dev").transformer
    control = load_controlnet(own_files / CONTROL_FILE)
    assert control.layers == (0, 2) and control.config.num_heads == 2
    t, g = torch.tensor([0.5]), torch.tensor([4.0])
    plain = net(x, ids, t, ctx, _extras(ref, ref_ids, guidance=g))
    off = net(x, ids, t, ctx, _extras(ref, ref_ids, guidance=g, control=Control(control, context, 0.0)))
    assert torch.equal(off, plain)
    changes = []
    for strength in (1e-3, 2e-3):
        steered = net(
            x, ids, t, ctx, _extras(ref, ref_ids, guidance=g, control=Control(control, context, strength))
        )
        changes.append((steered - plain).norm().item())
    assert changes[0] > 0 and 1.8 < changes[1] / changes[0] < 2.2, changes


def test_wrong_files_are_refused_by_name(own_files, tmp_path):
    with pytest.raises(Flux2Error, match="Fun ControlNet Union, a control net.*models/controlnet"):
        load_transformer(own_files / CONTROL_FILE)
    with pytest.raises(Flux2Error, match="FLUX.2 diffusion model.*FLUX.2 Model Loader"):
        load_controlnet(own_files / "flux2-dev.safetensors")
    control = load_controlnet(own_files / CONTROL_FILE)
    from tiny_dit import bfl_state_dict, make_diffusers_dit

    klein = load_checkpoint(
        DIT_SPEC, Checkpoint(Path("klein.safetensors"), bfl_state_dict(make_diffusers_dit())), None
    )
    with pytest.raises(Flux2Error, match="only steers FLUX.2 \\[dev\\].*RefControl"):
        check_pairing(control, klein.module)
    save_file({"control_img_in.weight": torch.zeros(8, 132)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(Flux2Error, match="132-channel|not a complete"):
        load_checkpoint(
            CONTROL_SPEC,
            Checkpoint(Path("other.safetensors"), {"control_img_in.weight": torch.zeros(8, 132)}),
            None,
        )


class _NoTextEncoder(torch.nn.Module):
    """The pipeline reads its text encoder's dtype and device only, when prompt embeddings are given."""

    dtype, device = torch.float32, torch.device("cpu")


@pytest.mark.parametrize("mode", ["control", "inpaint", "inpaint_with_control"])
def test_control_context_equals_the_reference_pipelines(reference, mode):
    """The 260 channels the reference pipeline hands its transformer (captured at its call), for plain
    control as its example calls it (all-white mask, all-zero image), inpaint (mask + image) and both."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from tiny_vae import make_diffusers_vae, random_vae_state_dict

    from flux2_core.vae.autoencoder import vae_from_state_dict

    sd = random_vae_state_dict()
    seen = {}
    forward = reference.forward

    def recording(*args, **kwargs):
        seen["context"] = kwargs["control_context"]
        return forward(*args, **kwargs)

    pipe = reference_pipeline().Flux2ControlPipeline(
        FlowMatchEulerDiscreteScheduler(), make_diffusers_vae(sd), _NoTextEncoder(), None, reference
    )
    g = torch.Generator().manual_seed(3)
    height, width = 64, 96
    control = torch.rand(1, 3, height, width, generator=g)
    image = torch.rand(1, 3, height, width, generator=g)
    mask = (torch.rand(1, 1, height, width, generator=g) > 0.5).float()
    theirs_inputs = {
        "control": dict(control_image=control, inpaint_image=torch.zeros(1, 3, height, width),
                        mask_image=torch.ones(1, 1, height, width) * 255),
        "inpaint": dict(inpaint_image=image, mask_image=mask),
        "inpaint_with_control": dict(control_image=control, inpaint_image=image, mask_image=mask),
    }[mode]  # fmt: skip
    reference.forward = recording
    try:
        pipe(prompt_embeds=torch.randn(1, 5, 24), height=height, width=width, num_inference_steps=1,
             output_type="latent", **theirs_inputs)  # fmt: skip
    finally:
        reference.forward = forward
    ours_inputs = {
        "control": (control, None, None),
        "inpaint": (None, mask[0, 0], image),
        "inpaint_with_control": (control, mask[0, 0], image),
    }[mode]
    with torch.no_grad():
        ours = control_context(vae_from_state_dict(sd), height, width, *ours_inputs)
    assert ours.shape == seen["context"].shape == (1, height * width // 256, CONTROL_CHANNELS)
    torch.testing.assert_close(ours, seen["context"].float(), rtol=1e-5, atol=1e-5)
    assert ours[..., 132:].abs().max() > 0  # the mid-grey or masked picture's latent, never zeros


def test_sampling_under_control_and_its_step_range(own_files):
    """``sample`` with the control: strength 0 is the plain run bit for bit, a strength changes it, a range
    covering only the later steps changes it less; bad requests (an empty step range too) are refused before
    anything runs."""
    from flux2_core import SampleRequest, SampleSettings, sample
    from flux2_core.steering.control_image import AppliedControl

    model = load_transformer(own_files / "flux2-dev.safetensors", variant="dev")
    control = load_controlnet(own_files / CONTROL_FILE)
    settings = SampleSettings(96, 64, 4, 4.0, 7, 1)
    context = torch.randn(1, 24, CONTROL_CHANNELS, generator=torch.Generator().manual_seed(0))
    positive = torch.randn(1, 6, 24, generator=torch.Generator().manual_seed(1))

    def run(**kw):
        applied = AppliedControl(control, context, **kw) if kw else None
        return sample(SampleRequest(model, positive, settings, control=applied))

    plain = run()
    assert torch.equal(run(strength=0.0), plain)
    with pytest.raises(Flux2Error, match="the control counts at none of the 4 steps"):
        run(strength=0.8, start=0.5, end=0.5)  # an empty range would steer nothing: refused, with the fix
    full, late = run(strength=0.8), run(strength=0.8, start=0.5)
    assert (full - plain).abs().mean() > (late - plain).abs().mean() > 0
    with pytest.raises(Flux2Error, match="control strength 3"):
        run(strength=3.0)
    with pytest.raises(Flux2Error, match="not \\[1, 16, 260\\]"):
        sample(
            SampleRequest(
                model,
                positive,
                SampleSettings(64, 64, 4, 4.0, 7, 1),
                control=AppliedControl(control, context),
            )
        )


@pytest.mark.parametrize("mode", ["control", "inpaint_with_control"])
def test_sampled_latents_equal_the_reference_pipelines(reference, files, mode):
    """Three steps of the reference Flux2ControlPipeline (FLUX.2's scheduler, the pipeline's schedule and
    control context) from our noise, against ``sample`` under the same control: the final latents agree
    within float32 noise."""
    from diffusers import FlowMatchEulerDiscreteScheduler
    from tiny_vae import make_diffusers_vae, random_vae_state_dict

    from flux2_core import SampleRequest, SampleSettings, sample
    from flux2_core.flow import make_noise, pack
    from flux2_core.steering.control_image import AppliedControl
    from flux2_core.vae.autoencoder import vae_from_state_dict

    sd = random_vae_state_dict()
    height, width, steps, strength = 64, 96, 3, 0.75
    g = torch.Generator().manual_seed(5)
    control = torch.rand(1, 3, height, width, generator=g)
    image = torch.rand(1, 3, height, width, generator=g)
    mask = (torch.rand(1, 1, height, width, generator=g) > 0.5).float()
    prompt = torch.randn(1, 5, 24, generator=g)
    noise = make_noise(1, height, width, seed=11)
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential")
    pipe = reference_pipeline().Flux2ControlPipeline(
        scheduler, make_diffusers_vae(sd), _NoTextEncoder(), None, reference
    )
    if mode == "control":
        theirs_inputs = dict(control_image=control, inpaint_image=torch.zeros(1, 3, height, width),
                             mask_image=torch.ones(1, 1, height, width) * 255)  # fmt: skip
        ours_inputs = (control, None, None)
    else:
        theirs_inputs = dict(control_image=control, inpaint_image=image, mask_image=mask)
        ours_inputs = (control, mask[0, 0], image)
    with torch.no_grad():
        theirs = pipe(prompt_embeds=prompt, height=height, width=width, num_inference_steps=steps,
                      guidance_scale=4.0, latents=noise.clone(), control_context_scale=strength,
                      output_type="latent", **theirs_inputs)  # fmt: skip
        theirs = (theirs.images if hasattr(theirs, "images") else theirs[0]).float()
        context = control_context(vae_from_state_dict(sd), height, width, *ours_inputs)
    model = load_transformer(files / "flux2-dev.safetensors", variant="dev")
    net = load_controlnet(files / CONTROL_FILE)
    settings = SampleSettings(width, height, steps, 4.0, 11, 1)
    ours = sample(SampleRequest(model, prompt, settings, control=AppliedControl(net, context, strength)))
    plain = sample(SampleRequest(model, prompt, settings))
    assert theirs.shape == pack(ours).shape == (1, height * width // 256, 128)
    torch.testing.assert_close(pack(ours), theirs, rtol=1e-4, atol=1e-4)
    assert (ours - plain).abs().max() > 1e-2  # the control shows in the latents: the check could fail


@pytest.mark.parametrize(
    ("size", "expected"),
    [((768, 512), (832, 1248)), ((1024, 1024), (1024, 1024)), ((80, 112), (448, 320)),
     ((3000, 2000), (832, 1248))],
)  # fmt: skip
def test_a_control_map_sets_the_output_size_when_nothing_else_does(size, expected):
    """(height, width) of a map -> (width, height) out: its aspect at about 1 MP in multiples of 16, a small
    map enlarged at most 4x (80 x 112 -> 320 x 448), a large one scaled down."""
    from flux2_core.steering.control_image import control_output_size

    assert control_output_size(torch.zeros(1, 3, *size)) == expected
