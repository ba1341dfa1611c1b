"""img2img, inpaint and outpaint in the core: parity with diffusers' Flux2KleinInpaintPipeline on the same
tiny random weights, the truncated schedule and its noising, and the composite's exactness."""

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinInpaintPipeline
from PIL import Image
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_vae import make_diffusers_vae, random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.dit.files import load_transformer
from flux2_core.editing import (
    composite,
    feather_inward,
    latent_mask,
    outpaint_canvas,
    prepare_inpaint,
)
from flux2_core.errors import Flux2Error
from flux2_core.flow import start_from, truncate
from flux2_core.references import ReferenceLatents, encode_references, prepare_reference
from flux2_core.sampling import SampleRequest, SampleSettings, get_sigmas, sample
from flux2_core.vae.autoencoder import denormalize, load_vae, unpatchify

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    root = tmp_path_factory.mktemp("editing")
    dit = make_diffusers_dit(seed=3)
    vae_sd = random_vae_state_dict(seed=4)
    return {
        "vae": make_diffusers_vae(vae_sd),
        "dit_file": write_bfl_file(dit, root / "flux-2-klein-4b.safetensors"),
        "vae_file": write_vae_file(vae_sd, root / "flux2-vae.safetensors"),
    }


@pytest.fixture(scope="module")
def vae(weights):
    return load_vae(weights["vae_file"])


def _image(width, height, seed):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def _mask(width, height, box):
    mask = np.zeros((height, width), dtype=np.uint8)
    x0, y0, x1, y1 = box
    mask[y0:y1, x0:x1] = 255
    return Image.fromarray(mask, mode="L")


def _embeds(seed):
    return torch.randn(1, 512, 24, generator=torch.Generator().manual_seed(seed))


def _diffusers_inpaint(weights, variant, settings, image, mask, strength, positive, negative=None, ref=None):
    pipe = Flux2KleinInpaintPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential"),
        vae=weights["vae"],
        text_encoder=None,
        tokenizer=None,
        transformer=make_diffusers_dit(seed=3),
        is_distilled=variant == "distilled",
    )
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        return pipe(
            image=image,
            mask_image=mask,
            image_reference=ref,
            strength=strength,
            prompt_embeds=positive,
            negative_prompt_embeds=negative,
            guidance_scale=settings.guidance,
            num_inference_steps=settings.steps,
            generator=torch.Generator("cpu").manual_seed(settings.seed),
            output_type="latent",
            return_dict=False,
        )[0]


CASES = {
    "distilled_strength_0.75": dict(variant="distilled", guidance=1.0, strength=0.75, ref=None),
    "distilled_full_strength_with_reference": dict(
        variant="distilled", guidance=1.0, strength=1.0, ref=(64, 80)
    ),
    "base_cfg_with_reference": dict(variant="base", guidance=4.0, strength=0.6, ref=(80, 64)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_inpaint_matches_diffusers_inpaint_pipeline(weights, vae, case):
    spec = CASES[case]
    settings = SampleSettings(80, 64, 5, spec["guidance"], seed=21)
    image, mask = _image(80, 64, seed=1), _mask(80, 64, (16, 8, 56, 40))
    ref = _image(*spec["ref"], seed=2) if spec["ref"] else None
    positive = _embeds(100)
    negative = _embeds(101) if spec["variant"] == "base" else None
    expected = _diffusers_inpaint(
        weights, spec["variant"], settings, image, mask, spec["strength"], positive, negative, ref
    )

    model = load_transformer(weights["dit_file"], variant=spec["variant"])
    source = vae.encode(prepare_reference(image))  # the source is the start latent and the first reference
    extra = encode_references(vae, [ref]).latents() if ref is not None else []
    references = ReferenceLatents.from_latents([source, *extra])
    pixels_mask = torch.from_numpy(np.asarray(mask, dtype=np.float32) / 255.0)
    latents = sample(
        SampleRequest(
            model,
            positive,
            settings,
            negative=negative,
            references=references,
            start=source,
            strength=spec["strength"],
            mask=latent_mask(pixels_mask, (4, 5)),
        )
    )
    got = unpatchify(denormalize(latents, vae.bn.running_mean, vae.bn.running_var))
    diff = (got - expected).abs().max().item()
    print(f"inpaint {case}: max abs difference vs diffusers {diff:.1e}")
    assert diff <= TOLERANCE


def test_img2img_at_full_strength_is_text_to_image(weights, vae):
    model = load_transformer(weights["dit_file"])
    settings = SampleSettings(64, 64, 4, 1.0, seed=5)
    start = vae.encode(prepare_reference(_image(64, 64, seed=3)))
    assert torch.equal(
        sample(SampleRequest(model, _embeds(1), settings, start=start, strength=1.0)),
        sample(SampleRequest(model, _embeds(1), settings)),
    )


def test_truncated_schedule_and_noising_follow_the_inpaint_pipeline():
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential")
    pipe = Flux2KleinInpaintPipeline(
        scheduler=scheduler, vae=None, text_encoder=None, tokenizer=None, transformer=None
    )
    from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu

    for steps, strength in [(4, 0.75), (4, 0.6), (10, 0.33), (28, 0.9), (5, 1.0)]:
        scheduler.set_timesteps(
            sigmas=np.linspace(1.0, 1 / steps, steps), mu=compute_empirical_mu(1024, steps)
        )
        timesteps, kept = pipe.get_timesteps(steps, strength, "cpu")
        ours = truncate(get_sigmas(steps, 1024).tolist(), strength)
        assert len(ours) - 1 == kept
        np.testing.assert_allclose(ours[:-1], (timesteps / 1000).numpy(), atol=1e-6)
        source, noise = torch.randn(1, 16, 128), torch.randn(1, 16, 128)
        expected = scheduler.scale_noise(source, timesteps[:1], noise)
        torch.testing.assert_close(start_from(noise, source, ours[0]), expected, atol=1e-6, rtol=0)


def test_the_composite_keeps_every_pixel_outside_the_mask_exactly():
    g = torch.Generator().manual_seed(0)
    original = torch.rand(150, 200, 3, generator=g)
    mask = torch.zeros(150, 200)
    mask[40:90, 60:140] = 1.0
    for crop, feather in [(False, 0), (True, 0), (True, 6)]:
        pixels, crop_mask, stitch = prepare_inpaint(original, mask, crop_to_mask=crop, context=16)
        assert pixels.shape[0] % 16 == 0 and pixels.shape[1] % 16 == 0
        decoded = torch.rand(*pixels.shape, generator=g)  # whatever the model painted
        out = composite(decoded, stitch, feather)
        assert out.shape == original.shape
        outside = mask < 0.5
        assert torch.equal(out[outside], original[outside])
        assert not torch.equal(out[~outside], original[~outside])


def test_a_white_mask_read_from_an_8_bit_png_composites_as_white():
    # ComfyUI reads a white 8-bit mask as 254/255 = 0.996: the composite must paint it wholly (no 0.4 % of the
    # original showing through) and feather its edge as it does a 1.0 mask's
    g = torch.Generator().manual_seed(1)
    original = torch.rand(96, 128, 3, generator=g)
    hard = torch.zeros(96, 128)
    hard[20:70, 30:100] = 1.0
    pixels, _, stitch = prepare_inpaint(original, hard)
    decoded = torch.rand(*pixels.shape, generator=g)
    for feather in (0, 6):
        expected = composite(decoded, stitch, feather)
        stitch.mask = hard * (254 / 255)
        assert torch.equal(composite(decoded, stitch, feather), expected)
        stitch.mask = hard
    assert torch.equal(composite(decoded, stitch, 0)[hard > 0], decoded[hard > 0])


def test_crop_to_mask_samples_only_the_neighbourhood_of_a_small_mask():
    original = torch.rand(2000, 3000, 3)
    mask = torch.zeros(2000, 3000)
    mask[1000:1040, 2000:2060] = 1.0
    pixels, _, stitch = prepare_inpaint(original, mask, crop_to_mask=True, context=32)
    assert stitch.box == (1968, 968, 124, 104)  # the mask's box plus 32 px of context
    assert pixels.shape[:2] == (416, 496)  # enlarged 4x (the cap), in multiples of 16
    whole, _, _ = prepare_inpaint(original, mask)
    assert whole.shape[0] * whole.shape[1] <= 1024 * 1024  # without crop: the whole canvas under the cap


def test_feathering_ramps_inward_only():
    mask = torch.zeros(40, 40)
    mask[10:30, 10:30] = 1
    weight = feather_inward(mask, 4)
    assert torch.equal(weight[mask < 0.5], torch.zeros_like(weight[mask < 0.5]))
    assert weight[10, 20] == pytest.approx(0.25) and weight[13, 20] == 1.0 and weight[20, 20] == 1.0


def test_outpaint_canvas_and_its_mask():
    image = torch.rand(64, 80, 3)
    canvas, mask = outpaint_canvas(image, 16, 0, 32, 16, feather=8)
    assert canvas.shape == (80, 128, 3) and mask.shape == (80, 128)
    assert torch.equal(canvas[:64, 16:96], image)
    assert (canvas[:, :16] == 0.5).all() and (mask[:, :16] == 1).all() and (mask[64:] == 1).all()
    assert mask[30, 15].item() == 1.0 and mask[30, 16].item() == pytest.approx(8 / 9)  # the fade starts
    assert mask[30, 24].item() == 0.0 and mask[30, 50].item() == 0.0
    assert mask[0, 60].item() == 0.0  # no padding on top: no ramp from there
    with pytest.raises(Flux2Error, match="multiple of 16"):
        outpaint_canvas(image, 10, 0, 0, 0)


def test_editing_inputs_are_checked(weights, vae):
    model = load_transformer(weights["dit_file"])
    settings = SampleSettings(64, 64, 2, 1.0, seed=0)
    with pytest.raises(Flux2Error, match="needs an image \\(latent\\) to start from"):
        sample(SampleRequest(model, _embeds(0), settings, strength=0.5))
    with pytest.raises(Flux2Error, match="strength \\(denoise\\) is 1.5"):
        sample(SampleRequest(model, _embeds(0), settings, start=torch.zeros(1, 128, 4, 4), strength=1.5))
    with pytest.raises(Flux2Error, match="start latent has shape \\[1, 128, 5, 4\\]"):
        sample(SampleRequest(model, _embeds(0), settings, start=torch.zeros(1, 128, 5, 4), strength=0.5))
    with pytest.raises(Flux2Error, match="the mask is empty"):
        prepare_inpaint(torch.rand(64, 64, 3), torch.zeros(64, 64))
    with pytest.raises(Flux2Error, match="the mask is 64x80 but the image is 64x64"):
        prepare_inpaint(torch.rand(64, 64, 3), torch.ones(80, 64))


def test_an_empty_latent_mask_gives_back_the_source_and_a_full_one_is_img2img(weights, vae):
    model = load_transformer(weights["dit_file"])
    settings = SampleSettings(64, 64, 4, 1.0, seed=9)
    source = vae.encode(prepare_reference(_image(64, 64, seed=4)))
    kept = sample(
        SampleRequest(model, _embeds(2), settings, start=source, strength=0.8, mask=torch.zeros(1, 16, 1))
    )
    torch.testing.assert_close(kept, source, atol=1e-6, rtol=0)  # the last blend is at sigma 0
    full = sample(
        SampleRequest(model, _embeds(2), settings, start=source, strength=0.8, mask=torch.ones(1, 16, 1))
    )
    assert torch.equal(full, sample(SampleRequest(model, _embeds(2), settings, start=source, strength=0.8)))


def test_growing_is_a_square_dilation_and_the_feather_a_depth_ramp():
    from flux2_core.editing import grow_mask

    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(60, 70, generator=g) > 0.97).float()
    square = torch.nn.functional.max_pool2d(mask[None, None], 9, stride=1, padding=4)[0, 0]
    assert torch.equal(grow_mask(mask, 4), square)
    block = torch.zeros(30, 30)
    block[5:25, 5:25] = 1
    ramp = feather_inward(block, 5)
    assert [ramp[15, x].item() for x in range(4, 11)] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0, 1.0])


def test_an_outpaint_composite_never_mixes_the_grey_canvas_into_the_new_area():
    image = torch.rand(64, 80, 3)
    canvas, mask = outpaint_canvas(image, 0, 0, 32, 0, feather=4)
    pixels, _, stitch = prepare_inpaint(canvas, mask)
    painted = torch.ones_like(pixels)  # the model paints white
    for feather in (0, 8, 16):
        out = composite(painted, stitch, feather)
        assert torch.equal(out[:, 80:], torch.ones(64, 32, 3))  # the new area: exactly the painting
        assert torch.equal(out[:, :76], image[:, :76])  # beyond the 4 px fade: exactly the original
        assert (out[:, 76:80] > image[:, 76:80]).any()  # in the fade: a blend


def test_mask_batches_follow_the_latent_batch_as_comfyui_does():
    one = torch.ones(1, 1, 32, 32)
    assert latent_mask(one, (2, 2), batch=3).shape == (3, 4, 1)
    two = torch.stack([torch.zeros(32, 32), torch.ones(32, 32)])
    assert latent_mask(two, (2, 2), batch=1).eq(0).all()  # cut to the first
    assert latent_mask(two, (2, 2), batch=3)[2].eq(0).all()  # repeated: 0, 1, 0
    with pytest.raises(Flux2Error, match="the mask has shape \\[1, 1, 0, 0\\]"):
        latent_mask(torch.zeros(1, 1, 0, 0), (2, 2))


def test_an_unpainted_load_image_mask_says_it_is_empty():
    with pytest.raises(Flux2Error, match="the mask is empty"):
        prepare_inpaint(torch.rand(96, 128, 3), torch.zeros(64, 64))  # Load Image's mask of an opaque file


def test_a_bad_mask_shape_is_a_clear_error_in_the_core(weights):
    model = load_transformer(weights["dit_file"])
    with pytest.raises(Flux2Error, match="the inpaint mask has shape \\[1, 16, 3\\]"):
        sample(SampleRequest(model, _embeds(0), SampleSettings(64, 64, 2, 1.0, 0),
                             start=torch.zeros(1, 128, 4, 4), mask=torch.ones(1, 16, 3)))  # fmt: skip


def test_an_outpaint_with_a_hard_edge_keeps_the_original_exactly():
    # feather 0 (native ImagePadForOutpaint allows it too): the mask is 1 on the new area and 0 on the image
    image = torch.rand(64, 80, 3)
    canvas, mask = outpaint_canvas(image, 16, 0, 32, 0, feather=0)
    assert torch.equal(mask[:, 16:96], torch.zeros(64, 80))
    assert mask[:, :16].eq(1).all() and mask[:, 96:].eq(1).all()
    pixels, _, stitch = prepare_inpaint(canvas, mask)
    painted = torch.ones_like(pixels)  # the model paints white
    out = composite(painted, stitch, 0)
    assert torch.equal(out[:, 16:96], image)  # the original, exactly
    assert torch.equal(out[:, :16], torch.ones(64, 16, 3)) and torch.equal(out[:, 96:], torch.ones(64, 32, 3))
    # a feathered composite ramps inside the mask only: the original stays exact
    assert torch.equal(composite(painted, stitch, 8)[:, 16:96], image)
