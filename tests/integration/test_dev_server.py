"""FLUX.2 [dev] in a real ComfyUI: the block split under ComfyUI's memory manager, and the pairings.

The server (conftest) holds a tiny dev DiT (``flux2-dev.safetensors``, guidance embedder, 48-wide text) and a
tiny Mistral in ComfyUI's single-file layout (``mistral_3_small_flux2_bf16.safetensors``, its Tekken tokenizer
inside). The split runs with two CPU "devices" standing in for two GPUs (the server runs with --cpu): one
ComfyUI ModelPatcher per device, both loaded by ComfyUI's own ``load_models_gpu`` before sampling; the image
must be the unsplit one, pixel for pixel.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from comfy_server import DEV_CONTROL, DEV_CONTROL_FP8, DEV_DIT, DEV_FP8, DEV_TEXT_ENCODER, E4, FILL_FILES
from test_server import _flux2_error_message

DEV_WIDTH = 3 * 16  # the tiny Mistral is 16 wide: hidden states 10, 20, 30 per token
MODEL_LOADER, TE_LOADER = "Flux2KleinModelLoader", "Flux2KleinTextEncoderLoader"


def small_dev(comfy, seed: int = 3, **loader) -> dict:
    """The dev text-to-image API workflow at 128x96 and 3 steps, with model-loader inputs overridden."""
    kc = comfy.kc
    wf = kc.prepare_workflow(
        comfy.api_workflow("flux2_dev_text_to_image"), prompt="a small dev test", seed=seed
    )
    (sampler,) = kc.nodes_of_type(wf, kc.SAMPLER)
    wf[sampler]["inputs"].update(width=128, height=96, steps=3)
    (model,) = kc.nodes_of_type(wf, "Flux2KleinModelLoader")
    wf[model]["inputs"].update(loader)
    return wf


def test_the_block_split_gives_the_unsplit_image_and_reports_each_device(comfy):
    (model,) = comfy.kc.nodes_of_type(small_dev(comfy), "Flux2KleinModelLoader")
    whole = comfy.run(small_dev(comfy), timeout=300)
    split = comfy.run(small_dev(comfy, devices="cpu,cpu"), timeout=300)
    (a,), (b,) = comfy.images(whole).values(), comfy.images(split).values()
    assert a.size == b.size == (128, 96)
    assert np.array_equal(np.asarray(a), np.asarray(b)), "the split model drew another image"
    assert np.asarray(a.convert("RGB")).std() > 5, "the output image is flat"
    # what each device holds: on the node (its ui text, in /history) and in the server log
    (text,) = split["outputs"][model]["text"]
    # this tiny DiT's parts outside its 2 + 2 blocks weigh about one double block: the first device gets
    # them and double block 0, the second the other three blocks (the plan's bytes are checked in test_nodes)
    first, second = text.split("; ")
    assert re.fullmatch(r"cpu: block 0 and the rest, \d+\.\d\d GB", first), text
    assert re.fullmatch(r"cpu: blocks 1-3, \d+\.\d\d GB", second), text
    assert f"{DEV_DIT} split across 2 devices: {text}" in comfy.log()
    assert "text" not in whole["outputs"].get(model, {})  # one device: nothing to report


def test_devices_are_checked_when_the_prompt_is_queued(comfy):
    wf = small_dev(comfy, devices="gpu0,gpu1")
    (model,) = comfy.kc.nodes_of_type(wf, "Flux2KleinModelLoader")
    status, body = comfy.submit(wf)
    assert status == 400 and list(body["node_errors"]) == [model], body
    text = str(body["node_errors"][model]["errors"])
    assert "'gpu0' is not a device name" in text and "cuda:0,cuda:1" in text, text


def test_devices_with_streaming_is_refused_by_the_loader(comfy):
    wf = small_dev(comfy, devices="cpu,cpu", offload="stream")
    message = _flux2_error_message(comfy, wf, "Flux2KleinModelLoader")
    assert "devices and offload 'stream' cannot be combined" in message, message


@pytest.mark.parametrize(
    ("node", "inputs", "failing", "expected"),
    [
        # dev with klein's Qwen3-4B: the dev DiT reads 48-wide text, the tiny "Qwen3-4B" gives 96
        (TE_LOADER, {"text_encoder_name": "qwen_3_4b.safetensors"}, "Flux2KleinSampler",
         ("needs the Mistral Small 3.x text encoder", f"{DEV_WIDTH}-wide", f"gives {3 * E4}")),
        # klein 4B with dev's Mistral
        (MODEL_LOADER, {"model_name": "flux-2-klein-4b.safetensors", "variant": "auto"}, "Flux2KleinSampler",
         ("needs a Qwen3 text encoder", f"{3 * E4}-wide", f"gives {DEV_WIDTH}")),
        # a FLUX.1 text encoder in the FLUX.2 loader
        (TE_LOADER, {"text_encoder_name": FILL_FILES["t5"]}, TE_LOADER,
         ("is T5-XXL, a FLUX.1 text encoder", DEV_TEXT_ENCODER, "qwen_3_4b.safetensors")),
        (TE_LOADER, {"text_encoder_name": FILL_FILES["clip"]}, TE_LOADER,
         ("is CLIP-L, a FLUX.1 text encoder", DEV_TEXT_ENCODER)),
    ],
)  # fmt: skip
def test_wrong_pairings_name_the_right_text_encoder_before_any_step(comfy, node, inputs, failing, expected):
    wf = small_dev(comfy)
    (node_id,) = comfy.kc.nodes_of_type(wf, node)
    wf[node_id]["inputs"].update(inputs)
    events = []
    with pytest.raises(comfy.kc.ExecutionFailed) as failure:
        comfy.run(wf, timeout=120, on_event=lambda kind, data: events.append(kind))
    data = failure.value.data
    assert data["node_type"] == failing and data["exception_type"] == "Flux2Error", data
    for part in expected:
        assert part in data["exception_message"], data["exception_message"]
    assert "progress" not in events, "a sampling step ran before the pairing was refused"


def _controlled(
    comfy, strength: float, loader: dict | None = None, control: dict | None = None, **extra
) -> dict:
    """The small dev workflow with the Fun ControlNet between the prompt and the sampler, the control map
    from a LoadImage; ``loader`` / ``control``: inputs of the model / control net loader."""
    wf = small_dev(comfy, **(loader or {}))
    (sampler,) = comfy.kc.nodes_of_type(wf, comfy.kc.SAMPLER)
    (vae,) = comfy.kc.nodes_of_type(wf, "Flux2KleinVAELoader")
    wf["90"] = {"class_type": "Flux2DevControlNetLoader",
                "inputs": {"control_net_name": DEV_CONTROL, **(control or {})}}  # fmt: skip
    wf["91"] = {"class_type": "LoadImage", "inputs": {"image": comfy.upload((112, 80))}}
    wf["92"] = {
        "class_type": "Flux2DevApplyControlNet",
        "inputs": {"conditioning": wf[sampler]["inputs"]["positive"], "control_net": ["90", 0],
                   "vae": [vae, 0], "control_image": ["91", 0], "strength": strength, "start": 0.0,
                   "end": 1.0, **extra},
    }  # fmt: skip
    wf[sampler]["inputs"]["positive"] = ["92", 0]
    return wf


def test_the_fun_controlnet_steers_dev_and_strength_zero_is_the_plain_image(comfy):
    """The control map (another size than the output: resized) changes the image; strength 0 draws the
    plain dev image pixel for pixel; with LoadImage's mask and the image it runs the inpaint mode; with
    width and height 0 and no reference the map sets the size."""
    (plain,) = comfy.images(comfy.run(small_dev(comfy), timeout=300)).values()
    (off,) = comfy.images(comfy.run(_controlled(comfy, 0.0), timeout=300)).values()
    (steered,) = comfy.images(comfy.run(_controlled(comfy, 0.75), timeout=300)).values()
    a, b, c = (np.asarray(i.convert("RGB")).astype(int) for i in (plain, off, steered))
    assert np.array_equal(a, b), "strength 0 changed the image"
    assert np.abs(a - c).mean() > 1, "the control barely changes the image"
    wf = _controlled(comfy, 0.75, mask=["91", 1], image=["91", 0])
    (inpainted,) = comfy.images(comfy.run(wf, timeout=300)).values()
    assert np.asarray(inpainted).shape == c.shape
    wf = _controlled(comfy, 0.75)  # width and height 0, no reference: the 112 x 80 map's aspect, 4x
    (sampler,) = comfy.kc.nodes_of_type(wf, comfy.kc.SAMPLER)
    wf[sampler]["inputs"].update(width=0, height=0, steps=1)
    (sized,) = comfy.images(comfy.run(wf, timeout=300)).values()
    assert sized.size == (448, 320)


def test_the_control_net_on_an_fp8_base_from_an_fp8_file_and_streamed(comfy):
    """On the fp8 dev base the control steers; streaming both the base and the control net (offload stream
    on both loaders, nothing resident) draws the resident image pixel for pixel; an fp8 control file (its
    q / k / v dequantised into the fused qkv, the rest fp8) steers as the bf16 one does, up to fp8's
    rounding."""
    fp8 = {"model_name": DEV_FP8}
    images = {}
    for name, loader, control, strength in [
        ("plain", fp8, None, 0.0),
        ("resident", fp8, None, 0.75),
        ("streamed", {**fp8, "offload": "stream", "resident_mb": 0}, {"offload": "stream"}, 0.75),
        ("fp8 control", fp8, {"control_net_name": DEV_CONTROL_FP8}, 0.75),
    ]:
        wf = _controlled(comfy, strength, loader, control)
        (image,) = comfy.images(comfy.run(wf, timeout=300)).values()
        images[name] = np.asarray(image.convert("RGB")).astype(int)
    assert np.abs(images["resident"] - images["plain"]).mean() > 1, "no control on the fp8 base"
    assert np.array_equal(images["streamed"], images["resident"]), "streaming changed the image"
    steer = np.abs(images["resident"] - images["plain"]).mean()
    assert np.abs(images["fp8 control"] - images["resident"]).mean() < 0.5 * steer


def test_a_control_net_with_klein_is_refused_with_what_it_is_for(comfy):
    wf = _controlled(comfy, 0.75)
    (model,) = comfy.kc.nodes_of_type(wf, "Flux2KleinModelLoader")
    wf[model]["inputs"].update(model_name="flux-2-klein-4b.safetensors", variant="distilled")
    (te,) = comfy.kc.nodes_of_type(wf, "Flux2KleinTextEncoderLoader")
    wf[te]["inputs"]["text_encoder_name"] = "qwen_3_4b.safetensors"
    message = _flux2_error_message(comfy, wf, "Flux2KleinSampler")
    assert "only steers FLUX.2 [dev]" in message and "RefControl" in message, message
