"""Checkpoint formats and LoRAs in a real ComfyUI server: the lists, a GGUF from the legacy unet folder,
the bundled LoRA workflow with its report."""

from __future__ import annotations

import numpy as np
from comfy_server import GGUF_DIT, LORA_FILE, QUANTISED_DITS
from node_contract import choices


def _workflow(comfy, name: str, **sampler) -> dict:
    kc = comfy.kc
    wf = kc.prepare_workflow(comfy.api_workflow(name), prompt="a lighthouse at dusk", seed=5)
    wf[kc.nodes_of_type(wf, kc.SAMPLER)[0]]["inputs"].update({"width": 128, "height": 96, **sampler})
    return wf


def _pixels(comfy, entry) -> np.ndarray:
    (image,) = comfy.images(entry).values()
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def test_loader_lists_hold_quantised_and_gguf_files(comfy):
    info = comfy.object_info()
    models = choices(info["Flux2KleinModelLoader"]["input"]["required"]["model_name"])
    assert {GGUF_DIT, *QUANTISED_DITS} <= set(models), models
    assert LORA_FILE in choices(info["Flux2KleinLoraLoader"]["input"]["required"]["lora_name"])
    # native loaders keep their own lists: our GGUF listing does not leak into them
    assert GGUF_DIT not in choices(info["UNETLoader"]["input"]["required"]["unet_name"])


def test_gguf_model_from_the_unet_folder_runs(comfy):
    wf = _workflow(comfy, "flux2_klein_4b_text_to_image")
    plain = _pixels(comfy, comfy.run(wf, 300))
    wf["1"]["inputs"]["model_name"] = GGUF_DIT
    assert wf["1"]["class_type"] == "Flux2KleinModelLoader"
    gguf = _pixels(comfy, comfy.run(wf, 300))
    difference = np.abs(gguf - plain).mean()
    print(f"\n[gguf] mean |Q8_0 - bf16 file| = {difference:.2f}/255")  # noqa: T201
    assert 0 < difference < 10, difference  # Q8_0 of the same weights: close, not identical


def test_lora_workflow_reports_and_changes_the_image(comfy):
    wf = _workflow(comfy, "flux2_klein_4b_lora")
    entry = comfy.run(wf, 300)
    with_lora = _pixels(comfy, entry)
    (report_node,) = [i for i, n in wf.items() if n["class_type"] == "PreviewAny"]
    report = "".join(entry["outputs"][report_node]["text"])
    assert LORA_FILE in report and "kohya" in report.lower(), report
    (lora_node,) = [i for i, n in wf.items() if n["class_type"] == "Flux2KleinLoraLoader"]
    wf[lora_node]["inputs"]["strength"] = 0.0
    without = _pixels(comfy, comfy.run(wf, 300))
    effect = np.abs(with_lora - without).mean()
    print(f"\n[lora] mean |strength 1 - strength 0| = {effect:.1f}/255\n{report}")  # noqa: T201
    assert effect > 3, effect


def test_streamed_model_and_tiled_decode_run_in_the_server(comfy):
    wf = _workflow(comfy, "flux2_klein_4b_text_to_image")
    plain = _pixels(comfy, comfy.run(wf, 300))
    wf["1"]["inputs"].update(offload="stream", resident_mb=0)
    (decode,) = [n for n in wf.values() if n["class_type"] == "Flux2KleinDecode"]
    decode["inputs"].update(tile_size=128, tile_overlap=32)  # covers the 128x96 image: one tile, exact
    assert np.array_equal(_pixels(comfy, comfy.run(wf, 300)), plain)
