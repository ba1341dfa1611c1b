"""The editing nodes (Encode, Inpaint Prepare, Composite, Outpaint Pad) and the sampler's img2img,
inpaint and KV reuse."""

from __future__ import annotations

import sys

import pytest
import torch
from klein_nodes import capture_start, core_module, image, run_sampler, with_noise_item


def test_img2img_from_an_encoded_image(nodes, loaded, pack):
    (latent,) = nodes["Flux2KleinEncode"].execute(loaded["vae"], image(70, 100))  # cropped to 96 x 64
    assert latent["samples"].shape == (1, 128, 4, 6)
    noise_only = run_sampler(nodes, loaded, latent=latent)
    assert torch.equal(noise_only, run_sampler(nodes, loaded, width=96, height=64))  # denoise 1: pure noise
    kept, start, sigmas = capture_start(pack, lambda: run_sampler(nodes, loaded, latent=latent, denoise=0.5))
    # the last half of the schedule (flow.truncate: int(2 - 2 * 0.5) = 1 of the 2 steps skipped), from the
    # image's latent noised to its first sigma s: x = (1 - s) * latent + s * noise (flow.start_from)
    full = core_module(pack).get_sigmas(2, 4 * 6).tolist()
    assert sigmas == full[1:] and 0 < sigmas[0] < 1
    flow = core_module(pack, "flow")
    noise = flow.pack(flow.make_noise(1, 64, 96, seed=7))  # run_sampler's seed
    s = sigmas[0]
    assert torch.equal(start, (1 - s) * flow.pack(latent["samples"]) + s * noise)
    assert kept.shape == noise_only.shape
    assert torch.equal(run_sampler(nodes, loaded, latent=latent, denoise=0.0), latent["samples"])  # no step
    with pytest.raises(Exception, match="strength \\(denoise\\) is 1.5"):
        run_sampler(nodes, loaded, latent=latent, denoise=1.5)
    with pytest.raises(Exception, match="needs an image \\(latent\\) to start from: connect one"):
        run_sampler(nodes, loaded, denoise=0.5)


def test_inpaint_chain_keeps_every_pixel_outside_the_mask(nodes, loaded):
    source = image(80, 96, seed=3)
    mask = torch.zeros(1, 80, 96)
    mask[:, 20:50, 30:70] = 1.0
    latent, refs, stitch = nodes["Flux2KleinInpaintPrepare"].execute(loaded["vae"], source, mask)
    assert latent["noise_mask"].shape == (1, 1, 80, 96) and len(refs) == 1  # the source is reference 1
    samples = run_sampler(nodes, loaded, latent=latent, references=refs, width=0, height=0)
    (decoded,) = nodes["Flux2KleinDecode"].execute(loaded["vae"], {"samples": samples})
    for feather in (0, 6):
        (out,) = nodes["Flux2KleinComposite"].execute(decoded, stitch, feather)
        assert out.shape == source.shape
        outside = mask[0] < 0.5
        assert torch.equal(out[0][outside], source[0][outside])
        assert not torch.equal(out[0][~outside], source[0][~outside])


def test_a_native_noise_mask_on_a_native_layout_latent_inpaints(nodes, loaded):
    (latent,) = nodes["Flux2KleinEncode"].execute(loaded["vae"], image(64, 64))
    native = {"samples": latent["samples"], "noise_mask": torch.zeros(1, 1, 64, 64)}  # SetLatentNoiseMask
    kept = run_sampler(nodes, loaded, latent=native)
    torch.testing.assert_close(kept, latent["samples"], atol=1e-5, rtol=0)  # nothing masked: kept as is


def test_outpaint_pad_gives_the_canvas_and_the_mask(nodes):
    canvas, mask = nodes["Flux2KleinOutpaintPad"].execute(image(64, 64), 0, 16, 32, 0, 8)
    assert canvas.shape == (1, 80, 96, 3) and mask.shape == (1, 80, 96)
    assert mask[0, :16].eq(1).all() and mask[0, 40, 64:].eq(1).all()  # the new areas
    assert mask[0, 40, :56].eq(0).all() and 0 < mask[0, 40, 60] < 1  # the ramp into the original edge


def test_reference_resize_keeps_the_whole_picture(nodes, loaded):
    (cropped,) = nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], image(70, 100))
    (resized,) = nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], image(70, 100), resize="resize")
    assert cropped.pixel_size(0) == (96, 64) and resized.pixel_size(0) == (96, 64)
    assert not torch.equal(cropped.tokens, resized.tokens)


def test_kv_cache_is_reused_across_runs_with_the_same_output(nodes, pack, loaded):
    store = sys.modules[f"{pack.__name__}.nodes.kv_store"].KV_STORE
    store.clear()
    (kv_model,) = nodes["Flux2KleinModelLoader"].execute("klein_tiny.safetensors", "kv")
    (refs,) = nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], image(64, 64, seed=1))
    args = dict(model=kv_model, references=refs, width=64, height=64)
    cold = run_sampler(nodes, loaded, **args, seed=3, kv_cache="off")
    run_sampler(nodes, loaded, **args, seed=5)  # fills the store
    assert (store.hits, store.misses, len(store)) == (0, 1, 1)
    warm = run_sampler(nodes, loaded, **args, seed=3, positive=loaded["negative"])
    warm = run_sampler(nodes, loaded, **args, seed=3)  # another prompt, then this one: both from the store
    assert store.hits == 2 and torch.equal(warm, cold)
    batch = run_sampler(nodes, loaded, **args, seed=3, batch_size=2)  # a batch of 2 reuses the same entry
    assert (store.hits, len(store)) == (3, 1)
    # each item is the single-image run (from the store too) on its slice of the batch's noise
    for k in range(2):
        single = with_noise_item(pack, 2, k, lambda: run_sampler(nodes, loaded, **args, seed=3))
        torch.testing.assert_close(batch[k : k + 1], single, atol=1e-5, rtol=0)  # batched: ~1e-6
    assert (store.hits, len(store)) == (5, 1)
    (other,) = nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], image(64, 64, seed=2))
    run_sampler(nodes, loaded, model=kv_model, references=other, width=64, height=64)
    assert (store.misses, len(store)) == (2, 2)  # another reference misses
    host = sys.modules[f"{pack.__name__}.nodes.host"]
    host.unload(kv_model.patcher)  # ComfyUI detaches the model: its entries go with it
    assert len(store) == 0


def test_the_sampler_keeps_the_noise_mask_for_a_second_pass(nodes, loaded, pack):
    core = core_module(pack)
    source = image(64, 64, seed=3)
    mask = torch.zeros(1, 64, 64)
    mask[:, 16:48, 16:48] = 1.0
    latent, refs, _ = nodes["Flux2KleinInpaintPrepare"].execute(loaded["vae"], source, mask)
    args = dict(model=loaded["model"], positive=loaded["positive"], seed=1, steps=2, guidance=1.0, width=0,
                height=0, batch_size=1, references=refs)  # fmt: skip
    (first,) = nodes["Flux2KleinSampler"].execute(**args, latent=latent)
    assert torch.equal(first["noise_mask"], latent["noise_mask"])
    (second,) = nodes["Flux2KleinSampler"].execute(**args, latent=first, denoise=0.5)
    assert torch.equal(second["noise_mask"], latent["noise_mask"])
    # the second pass is the core's inpaint of the first pass's latent, under the same mask, half the schedule
    packed_mask = core.latent_mask(latent["noise_mask"], (4, 4), 1)
    settings = core.SampleSettings(64, 64, 2, 1.0, 1)  # args' size (the latent's), steps, guidance, seed
    request = core.SampleRequest(loaded["model"].core, loaded["positive"].embeds, settings, references=refs,
                                 start=first["samples"], strength=0.5, mask=packed_mask)  # fmt: skip
    expected = core.sample(request)
    assert torch.equal(second["samples"], expected)
    # outside the mask each pass ends on its start latent (the blend at sigma 0), inside it repaints
    keep = packed_mask[0, :, 0].reshape(4, 4) == 0
    assert keep.sum() == 12  # the 32 px box covers the middle 2 x 2 of the 4 x 4 latent grid
    assert torch.equal(first["samples"][0][:, keep], latent["samples"][0][:, keep])
    assert torch.equal(second["samples"][0][:, keep], first["samples"][0][:, keep])
    assert not torch.equal(second["samples"][0][:, ~keep], first["samples"][0][:, ~keep])


def test_a_noise_mask_of_batch_one_serves_a_latent_batch_of_two(nodes, loaded, pack):
    (latent,) = nodes["Flux2KleinEncode"].execute(loaded["vae"], image(64, 64, batch=2))
    noise_mask = torch.zeros(1, 1, 64, 64)
    noise_mask[..., :32] = 1.0  # repaint the left half: latent columns 0-1 of 4
    samples = run_sampler(nodes, loaded, latent={"samples": latent["samples"], "noise_mask": noise_mask})
    assert samples.shape == (2, 128, 4, 4)
    for k in range(2):
        # item k keeps its own image outside the mask, and is the batch-of-one run on that image with the
        # same mask and its slice of the batch's noise
        assert torch.equal(samples[k, :, :, 2:], latent["samples"][k, :, :, 2:])
        one = {"samples": latent["samples"][k : k + 1], "noise_mask": noise_mask}
        single = with_noise_item(pack, 2, k, lambda one=one: run_sampler(nodes, loaded, latent=one))
        torch.testing.assert_close(samples[k : k + 1], single, atol=1e-5, rtol=0)  # batched: ~1e-6
    assert not torch.equal(samples[0, :, :, :2], samples[1, :, :, :2])
