"""Editing in a real ComfyUI: the inpaint workflow keeps the unmasked pixels, the 9B-KV references' K/V are
reused across queue runs with identical output, five references run, and an impossible request is refused
before sampling while the server keeps serving."""

from __future__ import annotations

import time

import numpy as np
from comfy_server import MASKED
from PIL import Image
from test_server import _flux2_error_message, small_text_to_image

REUSED, COMPUTED = "reference K/V reused from the cache", "reference K/V computed"


def _image(comfy, workflow) -> np.ndarray:
    (image,) = comfy.images(comfy.run(workflow, timeout=300)).values()
    return np.asarray(image.convert("RGB"))


def test_inpaint_workflow_keeps_every_pixel_outside_the_mask(comfy):
    kc = comfy.kc
    wf = kc.prepare_workflow(
        comfy.api_workflow("flux2_klein_4b_inpaint"),
        images=[comfy.upload(MASKED)],
        prompt="a red box",
        seed=7,
    )
    out = _image(comfy, wf)
    # The picture as Load Image -> Save Image writes it (Save Image truncates 255 * x to 8 bit, so compare
    # with that rather than with the file's bytes).
    (load,) = kc.nodes_of_type(wf, "LoadImage")
    passthrough = {"1": dict(wf[load]), "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0],
                   "filename_prefix": "flux2_klein/passthrough"}}}  # fmt: skip
    original = _image(comfy, passthrough)
    alpha = np.asarray(Image.open(comfy.references[MASKED]))[..., 3]
    prepare = wf[kc.nodes_of_type(wf, "Flux2KleinInpaintPrepare")[0]]["inputs"]
    grow = prepare["grow_mask"]  # the workflow grows the mask (Load Image's: 1 where transparent)
    padded = np.pad(alpha < 255, grow)
    window = np.lib.stride_tricks.sliding_window_view(padded, (2 * grow + 1, 2 * grow + 1))
    keep = ~window.any(axis=(-1, -2))
    assert out.shape == original.shape
    assert np.array_equal(out[keep], original[keep])
    assert np.abs(out[~keep].astype(int) - original[~keep]).mean() > 5  # the box was repainted


def _kv_run(comfy, refs, prompt, seed, **sampler_inputs) -> np.ndarray:
    kc = comfy.kc
    wf = kc.prepare_workflow(
        comfy.api_workflow("flux2_klein_9b_kv_edit"), images=refs, prompt=prompt, seed=seed
    )
    sampler = kc.nodes_of_type(wf, kc.SAMPLER)[0]
    wf[sampler]["inputs"].update(sampler_inputs)
    return _image(comfy, wf)


def test_kv_cache_is_reused_across_runs_and_gives_the_cold_output(comfy):
    refs = [comfy.upload((64, 80)), comfy.upload((96, 64))]
    log_before = comfy.log()
    _kv_run(comfy, refs, "first prompt", 1)  # fills the cache (or finds it from an earlier test)
    reused_before = comfy.log().count(REUSED)
    warm = _kv_run(comfy, refs, "a new prompt", 2)
    assert comfy.log().count(REUSED) == reused_before + 1, "the second run did not reuse the references' K/V"
    cold = _kv_run(comfy, refs, "a new prompt", 2, kv_cache="off")
    assert np.array_equal(warm, cold)
    batch = comfy.log().count(REUSED)
    kc = comfy.kc
    wf = kc.prepare_workflow(comfy.api_workflow("flux2_klein_9b_kv_edit"), images=refs, prompt="b", seed=3)
    wf[kc.nodes_of_type(wf, kc.SAMPLER)[0]]["inputs"]["batch_size"] = 2
    comfy.run(wf, timeout=300)  # a batch of 2 reuses the same entry
    assert comfy.log().count(REUSED) == batch + 1
    computed = comfy.log().count(COMPUTED)
    _kv_run(comfy, [refs[0], comfy.upload((80, 80))], "a new prompt", 2)  # another reference 2: a miss
    assert comfy.log().count(COMPUTED) == computed + 1
    assert COMPUTED in comfy.log()[len(log_before) :]
    # unloading the models (the manager's "free" button) drops the model's entries with it
    status, _ = comfy.post_json("/free", {"unload_models": True, "free_memory": True})
    assert status == 200
    deadline = time.monotonic() + 30
    while "left its device dropped" not in comfy.log() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "reference K/V of a model that left its device dropped" in comfy.log()


def test_five_references_of_five_sizes_run(comfy):
    kc = comfy.kc
    sizes = [(96, 64), (64, 80), (80, 80), (112, 80), (64, 64)]
    wf = comfy.api_workflow("flux2_klein_4b_multi_reference_edit")
    # chain a fifth Load Image + Reference Encode after the fourth, as a user would copy a pair
    encoders = kc.nodes_of_type(wf, "Flux2KleinReferenceEncode")
    last = max(encoders, key=int)
    image_id, encode_id = str(max(map(int, wf)) + 1), str(max(map(int, wf)) + 2)
    wf[image_id] = {"class_type": "LoadImage", "inputs": {"image": "example.png"}, "_meta": {"title": "5"}}
    wf[encode_id] = {
        "class_type": "Flux2KleinReferenceEncode",
        "inputs": {"vae": wf[last]["inputs"]["vae"], "image": [image_id, 0], "references": [last, 0],
                   "max_megapixels": 1.0, "resize": "resize"},
        "_meta": {"title": "Reference 5"},
    }  # fmt: skip
    sampler = kc.nodes_of_type(wf, kc.SAMPLER)[0]
    wf[sampler]["inputs"]["references"] = [encode_id, 0]
    wf = kc.prepare_workflow(wf, images=[comfy.upload(s) for s in sizes], prompt="all five", seed=5)
    out = _image(comfy, wf)
    assert out.shape == (64, 96, 3)  # the first reference's size


def test_a_request_that_cannot_fit_is_refused_before_sampling_and_the_server_keeps_serving(comfy):
    wf = small_text_to_image(comfy, width=8192, height=8192, batch_size=64)
    message = _flux2_error_message(comfy, wf, "Flux2KleinSampler")
    assert "sampling 8192x8192 needs about" in message and "GB free" in message, message
    assert "lower width/height, the batch size" in message
    (image,) = comfy.images(comfy.run(small_text_to_image(comfy), timeout=120)).values()
    assert image.size == (64, 64)


def test_native_encode_mask_and_decode_work_with_our_sampler(comfy):
    """Native VAEEncode + LoadImageMask + SetLatentNoiseMask feeding our sampler, decoded by native VAEDecode,
    against our own inpaint chain on the same picture and mask."""
    name = comfy.upload(MASKED)

    def node(class_type, **inputs):
        return {"class_type": class_type, "inputs": inputs}

    common = dict(seed=11, steps=3, guidance=1.0, width=0, height=0, batch_size=1)
    g = {
        "1": node("Flux2KleinModelLoader", model_name="flux-2-klein-4b.safetensors", variant="distilled"),
        "2": node("Flux2KleinTextEncoderLoader", text_encoder_name="qwen_3_4b.safetensors"),
        "3": node("Flux2KleinVAELoader", vae_name="flux2-vae.safetensors"),
        "4": node("Flux2KleinTextEncode", text_encoder=["2", 0], text="a red box"),
        "5": node("LoadImage", image=name),
        # ours
        "10": node("Flux2KleinInpaintPrepare", vae=["3", 0], image=["5", 0], mask=["5", 1], grow_mask=0),
        "11": node("Flux2KleinSampler", model=["1", 0], positive=["4", 0], latent=["10", 0],
                   references=["10", 1], **common),
        "12": node("Flux2KleinDecode", vae=["3", 0], latent=["11", 0]),
        "13": node("SaveImage", images=["12", 0], filename_prefix="interop/ours"),
        # native encode, mask and decode around our sampler
        "20": node("VAELoader", vae_name="flux2-vae.safetensors"),
        "21": node("VAEEncode", pixels=["5", 0], vae=["20", 0]),
        "22": node("LoadImageMask", image=name, channel="alpha"),
        "23": node("SetLatentNoiseMask", samples=["21", 0], mask=["22", 0]),
        "24": node("Flux2KleinReferenceEncode", vae=["3", 0], image=["5", 0]),
        "25": node("Flux2KleinSampler", model=["1", 0], positive=["4", 0], latent=["23", 0],
                   references=["24", 0], **common),
        "26": node("VAEDecode", samples=["25", 0], vae=["20", 0]),
        "27": node("SaveImage", images=["26", 0], filename_prefix="interop/native"),
    }  # fmt: skip
    images = comfy.images(comfy.run(g, timeout=300))
    ours, native = (np.asarray(images[k].convert("RGB")).astype(int) for k in ("13", "27"))
    assert ours.shape == native.shape == (64, 96, 3)
    assert np.abs(ours - native).max() <= 2, np.abs(ours - native).max()
