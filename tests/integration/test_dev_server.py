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
from comfy_server import DEV_DIT, DEV_TEXT_ENCODER, E4, FILL_FILES
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
    assert data["node_type"] == failing and data["exception_type"].endswith("Flux2Error"), data
    for part in expected:
        assert part in data["exception_message"], data["exception_message"]
    assert "progress" not in events, "a sampling step ran before the pairing was refused"
