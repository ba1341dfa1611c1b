"""The node pack inside a real ComfyUI server: schemas, the bundled workflows, interrupt, error reporting.

The expected node contract is the committed fixtures/node_contract.json, never read from the pack's
classes at test time, so a renamed, retyped or reordered input fails here.
"""

from __future__ import annotations

import functools
import json
import re
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from node_contract import CONTRACT as NODE_CONTRACT
from node_contract import choices, kind_of

REPO = Path(__file__).resolve().parents[2]
EDITOR_WORKFLOWS = sorted((REPO / "workflows").glob("*.json"))
API_WORKFLOWS = sorted((REPO / "workflows" / "api").glob("*.json"))


# node id: (display name, required inputs in order, optional inputs in order, output types) -- README "Nodes"
CONTRACT = {
    node_id: (node.display, node.required_names, node.optional_names, list(node.outputs))
    for node_id, node in NODE_CONTRACT.items()
}

# Per bundled workflow: the reference images to upload (sizes), the sampler inputs patched, and the output
# size expected. The distilled text-to-image workflow runs at its own 1024x1024 (about 10 s on two CPU
# cores, mostly the decode). The base one is patched to 192x128 and 6 steps instead of 50 CFG steps at
# 1024x1024 (about a minute on the CPU); its CFG path still runs.
NATIVE_SIZE = [f"{node}.{side}={value}" for node in ("EmptyFlux2LatentImage", "Flux2Scheduler")
               for side, value in (("width", 128), ("height", 96))]  # fmt: skip
WORKFLOW_RUNS = {
    "flux2_klein_4b_text_to_image": dict(refs=[], sets=[], size=(1024, 1024)),
    "flux2_klein_4b_base_text_to_image": dict(
        refs=[], sets=["width=192", "height=128", "steps=6"], size=(192, 128)
    ),
    "flux2_klein_4b_edit": dict(refs=[(96, 64)], sets=[], size=(96, 64)),
    "flux2_klein_4b_multi_reference_edit": dict(
        refs=[(96, 64), (64, 80), (80, 80), (112, 80)], sets=[], size=(96, 64)
    ),
    "flux2_klein_9b_kv_edit": dict(refs=[(64, 80), (96, 64)], sets=[], size=(64, 80)),
    "flux2_klein_4b_edit_reference_strength": dict(refs=[(96, 64), (64, 80)], sets=[], size=(96, 64)),
    "flux2_klein_4b_regional_prompt": dict(refs=[], sets=["width=128", "height=96"], size=(128, 96)),
    "flux2_klein_4b_regional_edit": dict(refs=[(96, 64)], sets=[], size=(96, 64)),
    "flux2_klein_4b_refcontrol_depth": dict(refs=[(96, 64), (64, 80)], sets=["steps=6"], size=(96, 64)),
    "flux2_klein_4b_img2img": dict(refs=[(96, 64)], sets=[], size=(96, 64)),
    "flux2_klein_4b_inpaint": dict(refs=[("masked", 96, 64)], sets=[], size=(96, 64)),
    "flux2_klein_4b_outpaint": dict(refs=[(96, 64)], sets=[], size=(96 + 256, 64)),
    "flux2_klein_4b_lora": dict(refs=[], sets=["width=128", "height=96"], size=(128, 96)),
    # FLUX.2 [dev]: patched to a small size and few steps (its 50 steps at 1024x1024 take minutes on the CPU)
    "flux2_dev_text_to_image": dict(refs=[], sets=["width=192", "height=128", "steps=6"], size=(192, 128)),
    "flux2_dev_multi_reference_edit": dict(
        refs=[(96, 64), (64, 80), (80, 80)], sets=["steps=4"], size=(96, 64)
    ),
    # dev with a LoRA (kohya layout); the Turbo LoRA on its 8-step list (the sigmas set the steps)
    "flux2_dev_lora": dict(refs=[], sets=["width=192", "height=128", "steps=6"], size=(192, 128)),
    "flux2_dev_turbo": dict(refs=[], sets=["width=192", "height=128"], size=(192, 128)),
    # the Fun ControlNet on dev: the control map first (another size than the output: resized), then the
    # image to inpaint
    "flux2_dev_controlnet_pose": dict(
        refs=[(112, 80)], sets=["width=128", "height=96", "steps=3"], size=(128, 96)
    ),
    "flux2_dev_controlnet_inpaint": dict(
        refs=[(112, 80), ("masked", 96, 64)], sets=["steps=3"], size=(96, 64)
    ),
    # FLUX.1 Fill [dev]: 8 of its 50 steps; the output is the original's size (outpaint: the padded canvas)
    "flux1_fill_inpaint": dict(refs=[("masked", 96, 64)], sets=["steps=8"], size=(96, 64)),
    "flux1_fill_outpaint": dict(refs=[(96, 64)], sets=["steps=8"], size=(96 + 256, 64)),
    # high resolution, patched small: 4 MP's workflow past a lowered extrapolation base (the option runs),
    # the upscale's tiled refine of a Lanczos canvas (3x here) in 256 px tiles (two tiles, blended)
    "flux2_klein_4b_text_to_image_4mp": dict(
        refs=[], sets=["width=320", "height=256", "extrapolation_base=256"], size=(320, 256)
    ),
    "flux2_klein_4b_upscale_2x": dict(
        refs=[(112, 80)],
        sets=[
            "ImageScaleBy.scale_by=3.0",
            "Flux2KleinTiledRefine.tile_size=256",
            "Flux2KleinTiledRefine.tile_overlap=64",
        ],
        size=(336, 240),
    ),
    # native sampling of our model: size set on the empty latent and the scheduler (NODE.INPUT sets)
    "flux2_klein_4b_native_sampler": dict(refs=[], sets=NATIVE_SIZE, size=(128, 96)),
    "flux2_klein_4b_native_easycache": dict(
        refs=[], sets=[*NATIVE_SIZE, "Flux2Scheduler.steps=12"], size=(128, 96)
    ),
}

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize"}
# Nodes the graph editor itself provides (no backend class; the frontend registers them).
FRONTEND_ONLY = {"MarkdownNote", "Note"}


def small_text_to_image(comfy, **inputs) -> dict:
    """The distilled text-to-image API workflow at 64x64, with sampler inputs overridden."""
    kc = comfy.kc
    wf = kc.prepare_workflow(
        comfy.api_workflow("flux2_klein_4b_text_to_image"), prompt="a small test", seed=3
    )
    sampler = kc.nodes_of_type(wf, kc.SAMPLER)[0]
    wf[sampler]["inputs"].update({"width": 64, "height": 64, **inputs})
    return wf


# ---------------------------------------------------------------------------------------------------------
# 1. /object_info


def test_object_info_has_every_node_with_the_contract_inputs(comfy):
    info = comfy.object_info()
    missing = sorted(set(CONTRACT) - set(info))
    assert not missing, f"not registered: {missing}\n{comfy.log()[-4000:]}"
    for node_id, (display, required, optional, outputs) in CONTRACT.items():
        node = info[node_id]
        fill = node_id.startswith("Flux1Fill")
        kinds = dict(NODE_CONTRACT[node_id].required + NODE_CONTRACT[node_id].optional)
        assert node["display_name"] == display, node_id
        assert node["python_module"] == "custom_nodes.comfyui-flux2-klein", node_id
        assert node["category"].startswith("flux1_fill" if fill else "flux2_klein"), node_id
        assert node["input_order"].get("required", []) == required, node_id
        assert node["input_order"].get("optional", []) == optional, node_id
        assert list(node["input"].get("required", {})) == required, node_id
        assert list(node["input"].get("optional", {})) == optional, node_id
        assert node["output"] == outputs, node_id
        for name in required + optional:
            assert kind_of(input_spec(node, name)) == kinds[name], (node_id, name, input_spec(node, name)[0])
    # the model lists are ComfyUI's folders, which hold the official file names the workflows use
    assert {
        "flux-2-klein-4b.safetensors",
        "flux-2-klein-base-4b.safetensors",
        "flux-2-klein-9b-kv.safetensors",
        "flux2-dev.safetensors",
    } <= set(choices(info["Flux2KleinModelLoader"]["input"]["required"]["model_name"]))
    assert {
        "qwen_3_4b.safetensors",
        "qwen_3_8b.safetensors",
        "mistral_3_small_flux2_bf16.safetensors",
    } <= set(choices(info["Flux2KleinTextEncoderLoader"]["input"]["required"]["text_encoder_name"]))
    assert "flux2-vae.safetensors" in choices(info["Flux2KleinVAELoader"]["input"]["required"]["vae_name"])
    assert choices(info["Flux2KleinModelLoader"]["input"]["required"]["variant"]) == [
        "auto",
        "distilled",
        "base",
        "kv",
        "dev",
    ]
    # a server started with --cpu: the text encoder's device choices are these two (then any accelerators)
    devices = choices(info["Flux2KleinTextEncoderLoader"]["input"]["optional"]["device"])
    assert devices[:2] == ["default", "cpu"]
    # the pack registers exactly these nodes, found as "FLUX.2 ..." / "FLUX.1 Fill [dev] ..." in the search
    ours = [i for i, n in info.items() if n["python_module"] == "custom_nodes.comfyui-flux2-klein"]
    assert sorted(ours) == sorted(CONTRACT)
    assert all(info[i]["display_name"].startswith(("FLUX.2 ", "FLUX.1 Fill [dev] ")) for i in ours)


# ---------------------------------------------------------------------------------------------------------
# 2. Every bundled API workflow runs


def test_every_api_workflow_is_covered():
    assert sorted(p.stem for p in API_WORKFLOWS) == sorted(WORKFLOW_RUNS)


@pytest.mark.parametrize("name", sorted(WORKFLOW_RUNS))
def test_bundled_api_workflow_runs(comfy, name):
    kc, run = comfy.kc, WORKFLOW_RUNS[name]
    workflow = comfy.api_workflow(name)
    samplers = kc.nodes_of_type(workflow, kc.SAMPLER)  # none in the native-sampling workflows
    names = [comfy.upload(size) for size in run["refs"]]
    patched = kc.prepare_workflow(
        workflow,
        images=names if names else None,
        prompt=f"integration test of {name}",
        seed=1234,
        sets=[s if "." in s.partition("=")[0] else f"{samplers[0]}.{s}" for s in run["sets"]],
    )
    events = []
    entry = comfy.run(patched, timeout=300, on_event=lambda kind, data: events.append(kind))
    assert entry["status"]["status_str"] == "success"
    images = comfy.kc.fetch_outputs(entry)
    folder = "_".join(name.split("_")[:2])  # flux2_klein, flux2_dev, flux1_fill: the workflow's prefix
    assert len(images) == 1 and images[0]["subfolder"] == folder, images
    image = comfy.images(entry)[images[0]["node_id"]]
    assert image.size == run["size"], (name, image.size)
    assert np.asarray(image.convert("RGB")).std() > 5, "the output image is flat"
    assert "progress" in events, "the sampler sent no progress over the websocket"


# ---------------------------------------------------------------------------------------------------------
# 3. Interrupt


def test_interrupt_stops_a_run_and_the_server_keeps_serving(comfy):
    kc = comfy.kc
    assert kc.websocket is not None, "websocket-client is needed for this test"
    wf = kc.prepare_workflow(
        comfy.api_workflow("flux2_klein_4b_base_text_to_image"), prompt="never finished", seed=11
    )
    sampler = kc.nodes_of_type(wf, kc.SAMPLER)[0]
    wf[sampler]["inputs"].update(
        steps=200, guidance=4.0, width=512, height=512
    )  # 400 passes: far longer than the test
    client_id = uuid.uuid4().hex
    ws = kc.connect_ws(comfy.url, client_id)
    assert ws is not None, "cannot open the websocket"
    try:
        prompt_id = kc.queue(comfy.url, wf, client_id)
        progress = None
        deadline = time.monotonic() + 120
        while progress is None and time.monotonic() < deadline:
            try:
                message = ws.recv()
            except kc.websocket.WebSocketTimeoutException:
                continue
            if not isinstance(message, str):
                continue
            event = json.loads(message)
            data = event.get("data") or {}
            if data.get("prompt_id") != prompt_id:
                continue
            assert event["type"] not in ("execution_error", "execution_success"), event
            if event["type"] == "progress" and data.get("node") == sampler:
                progress = data
        assert progress is not None, "no progress message from the sampler within 120 s"
        interrupted_at = time.monotonic()
        status, _ = comfy.post_json("/interrupt", {"prompt_id": prompt_id})
        assert status == 200
        with pytest.raises(kc.Interrupted):
            kc.wait(comfy.url, prompt_id, ws, timeout=120)
        stopped_after = time.monotonic() - interrupted_at
    finally:
        ws.close()

    assert progress["max"] == 200 and progress["value"] < 200
    assert stopped_after < 60, f"the run took {stopped_after:.0f} s to stop"
    entry = comfy.finished_history(prompt_id)
    status = entry["status"]
    kinds = [kind for kind, _ in status["messages"]]
    assert status["status_str"] == "error" and "execution_interrupted" in kinds, status
    assert "execution_error" not in kinds, status
    data = dict(status["messages"])["execution_interrupted"]
    assert data["node_id"] == sampler and data["node_type"] == "Flux2KleinSampler", data
    assert not entry.get("outputs"), "an interrupted run saved images"

    # the server keeps serving: the next (small) run succeeds
    entry = comfy.run(small_text_to_image(comfy), timeout=120)
    (image,) = comfy.images(entry).values()
    assert image.size == (64, 64)


# ---------------------------------------------------------------------------------------------------------
# 4. Bad requests come back as node errors with our messages


def test_unknown_model_file_is_rejected_at_prompt(comfy):
    wf = small_text_to_image(comfy)
    wf["1"]["inputs"]["model_name"] = "flux-2-klein-does-not-exist.safetensors"
    status, body = comfy.submit(wf)
    assert status == 400, body
    errors = body["node_errors"]["1"]["errors"]
    assert [e["type"] for e in errors] == ["value_not_in_list"], errors
    assert errors[0]["extra_info"]["input_name"] == "model_name"
    assert "flux-2-klein-does-not-exist.safetensors" in errors[0]["details"]


def _flux2_error_message(comfy, wf, node_type: str) -> str:
    """Run ``wf`` expecting ``node_type`` to fail with our Flux2Error; return the message the user sees."""
    with pytest.raises(comfy.kc.ExecutionFailed) as failure:
        comfy.run(wf, timeout=120)
    data = failure.value.data
    assert data["node_type"] == node_type, data
    assert data["exception_type"] == "Flux2Error", data
    return data["exception_message"]


def test_wrong_text_encoder_pairing_fails_with_our_message(comfy):
    wf = small_text_to_image(comfy)
    wf["2"]["inputs"]["text_encoder_name"] = "qwen_3_8b.safetensors"  # the 4B DiT with the 8B encoder
    message = _flux2_error_message(comfy, wf, "Flux2KleinSampler")
    assert "needs" in message, message
    # the tiny 4B DiT reads 96-wide text (3 x 32); the tiny "8B" encoder gives 144 (3 x 48)
    assert "96" in message and "144" in message, message


def test_a_file_that_is_not_a_dit_fails_with_our_message(comfy):
    wf = small_text_to_image(comfy)
    wf["1"]["inputs"]["model_name"] = "not-a-dit.safetensors"  # the VAE, copied into diffusion_models
    message = _flux2_error_message(comfy, wf, "Flux2KleinModelLoader")
    assert "not-a-dit.safetensors" in message and "is a VAE" in message, message
    assert "not a FLUX.2 [klein] diffusion model" in message, message


def test_width_not_a_multiple_of_16_is_rejected_at_prompt(comfy):
    wf = small_text_to_image(comfy, width=1000)
    sampler = comfy.kc.nodes_of_type(wf, comfy.kc.SAMPLER)[0]
    status, body = comfy.submit(wf)
    assert status == 400, body
    assert list(body["node_errors"]) == [sampler], body
    text = json.dumps(body["node_errors"][sampler]["errors"])
    assert "width 1000 is not allowed" in text and "multiple of 16" in text, text


def test_bad_requests_between_good_ones_leave_the_server_serving_the_same_image(comfy):
    """Rejected prompts and failing nodes change nothing: the same good request gives the same pixels."""
    kc = comfy.kc

    def pixels(seed: int) -> np.ndarray:
        (image,) = comfy.images(comfy.run(small_text_to_image(comfy, seed=seed), timeout=120)).values()
        return np.asarray(image.convert("RGB"))

    before = pixels(3)
    sampler = kc.nodes_of_type(small_text_to_image(comfy), kc.SAMPLER)[0]
    for rejected in (small_text_to_image(comfy, width=1000), small_text_to_image(comfy, seed=-1)):
        status, body = comfy.submit(rejected)
        assert status == 400 and sampler in body["node_errors"], body
    failing = [
        (
            "1",
            "model_name",
            "corrupt-million-blocks.safetensors",
            "Flux2KleinModelLoader",
            "up to number 1000000",
        ),
        ("1", "model_name", "not-a-dit.safetensors", "Flux2KleinModelLoader", "is a VAE"),
        ("2", "text_encoder_name", "qwen_3_8b.safetensors", "Flux2KleinSampler", "needs"),
    ]
    for node, name, value, node_type, expected in failing:
        wf = small_text_to_image(comfy)
        wf[node]["inputs"][name] = value
        started = time.monotonic()
        message = _flux2_error_message(comfy, wf, node_type)
        assert expected in message, message
        assert time.monotonic() - started < 60, f"{value} took {time.monotonic() - started:.0f} s to fail"
    other = pixels(4)  # another seed first, so the sampler really runs again for seed 3
    assert not np.array_equal(other, before)
    assert np.array_equal(pixels(3), before)


# ---------------------------------------------------------------------------------------------------------
# 5. Editor-format workflows against the schemas the server reports


def widget_slots(info: dict) -> list[tuple[str, str, list]]:
    """The editor's widgets_values slots of a node type: (kind, input name, spec) in order; kind is
    "widget", "control" (control_after_generate) or "upload" (an image upload button)."""
    slots = []
    for section in ("required", "optional"):
        specs = info["input"].get(section) or {}
        for name in info.get("input_order", {}).get(section, list(specs)):
            spec = specs[name]
            options = spec[1] if len(spec) > 1 else {}
            if not (isinstance(spec[0], list) or spec[0] in WIDGET_TYPES) or options.get("forceInput"):
                continue
            slots.append(("widget", name, spec))
            if options.get("control_after_generate"):
                slots.append(("control", name, spec))
            if options.get("image_upload"):
                slots.append(("upload", "upload", ["IMAGEUPLOAD", {}]))  # the upload button of LoadImage
    return slots


@functools.cache
def _frontend_node_types(web_root: str) -> frozenset[str]:
    pattern = re.compile(r"registerNodeType\(\s*[`'\"]([^`'\"]+)[`'\"]")
    found = set()
    for script in Path(web_root).glob("assets/*.js"):
        found.update(pattern.findall(script.read_text(encoding="utf-8", errors="ignore")))
    return frozenset(found)


def frontend_registers(comfy, node_type: str) -> bool:
    """Whether the graph editor this server serves registers ``node_type`` itself (e.g. MarkdownNote, which
    has no backend class): its web root is in the server log, and the bundle calls registerNodeType."""
    found = re.search(r"web root: (\S+)", comfy.log())
    assert found, "the server log does not say where its frontend is"
    return node_type in _frontend_node_types(found.group(1))


def widget_type(spec: list) -> str:
    return kind_of(spec)


def input_spec(info: dict, name: str):
    for section in ("required", "optional"):
        if name in (info["input"].get(section) or {}):
            return info["input"][section][name]
    return None


def check_widget_value(where: str, kind: str, spec: list, value) -> None:
    options = spec[1] if len(spec) > 1 else {}
    if kind == "control":
        assert value in CONTROL_VALUES, (where, value)
    elif kind == "upload":
        assert value == "image", (where, value)
    elif isinstance(spec[0], list) or spec[0] == "COMBO":
        choices = spec[0] if isinstance(spec[0], list) else options.get("options", [])
        if not options.get("image_upload"):  # the input folder's listing: the user's own file
            assert value in choices, (where, value, choices)
    elif spec[0] == "INT":
        assert isinstance(value, int) and not isinstance(value, bool), (where, value)
        assert options.get("min", value) <= value <= options.get("max", value), (where, value)
    elif spec[0] == "FLOAT":
        assert isinstance(value, (int, float)), (where, value)
        assert options.get("min", value) <= value <= options.get("max", value), (where, value)
    elif spec[0] == "STRING":
        assert isinstance(value, str), (where, value)
    elif spec[0] == "BOOLEAN":
        assert isinstance(value, bool), (where, value)


@pytest.mark.parametrize("path", EDITOR_WORKFLOWS, ids=lambda p: p.stem)
def test_editor_workflow_matches_the_server_schemas(comfy, path):
    info = comfy.object_info()
    wf = json.loads(path.read_text(encoding="utf-8"))
    nodes = {n["id"]: n for n in wf["nodes"]}
    for node in wf["nodes"]:
        where = f"{path.name} node {node['id']} ({node['type']})"
        if node["type"] in FRONTEND_ONLY and node["type"] not in info:
            assert frontend_registers(comfy, node["type"]), f"{where}: unknown to the server's frontend"
            assert [type(v) for v in node.get("widgets_values", [])] == [str], where
            continue
        assert node["type"] in info, f"{where}: not a node type of this server"
        schema = info[node["type"]]
        slots = widget_slots(schema)
        values = node.get("widgets_values", [])
        # the editor lists every widget (the upload button too) as an input with a "widget" entry
        widget_inputs = [i for i in node["inputs"] if i.get("widget")]
        expected = [(name, widget_type(spec)) for kind, name, spec in slots if kind != "control"]
        assert [(i["name"], i["type"]) for i in widget_inputs] == expected, where
        assert all(i["widget"]["name"] == i["name"] for i in widget_inputs), where
        assert len(values) == len(slots), f"{where}: {len(values)} widget values for {slots}"
        for (kind, name, spec), value in zip(slots, values):
            check_widget_value(f"{where} {name}", kind, spec, value)
        # socket inputs: names and types as on the server, every required one connected
        widget_names = {name for _, name, _ in slots}
        sockets = {i["name"]: i for i in node["inputs"] if not i.get("widget")}
        for name, entry in sockets.items():
            spec = input_spec(schema, name)
            assert spec is not None and name not in widget_names, f"{where}: unknown input {name}"
            assert entry["type"] == spec[0], (where, name)  # PreviewAny's "*" stays "*" in the editor
        for name in schema["input"].get("required") or {}:
            if name not in widget_names:
                assert sockets.get(name, {}).get("link") is not None, f"{where}: {name} is not connected"
        assert [o["type"] for o in node.get("outputs", [])] == schema["output"], where
    for link_id, origin, origin_slot, target, target_slot, type_ in wf["links"]:
        source, sink = nodes[origin], nodes[target]
        assert info[source["type"]]["output"][origin_slot] == type_, (path.name, link_id)
        name = sink["inputs"][target_slot]["name"]
        assert input_spec(info[sink["type"]], name)[0] in (type_, "*"), (path.name, link_id, name)


# ---------------------------------------------------------------------------------------------------------
# The step cache in the real server


def test_the_step_cache_runs_and_says_on_the_sampler_how_many_steps_ran_every_block(comfy):
    kc = comfy.kc
    workflow = comfy.api_workflow("flux2_klein_4b_base_text_to_image")
    sampler = kc.nodes_of_type(workflow, kc.SAMPLER)[0]
    sets = [f"{sampler}.{s}" for s in ("width=192", "height=128", "steps=8", "step_cache=1.0")]
    patched = kc.prepare_workflow(workflow, prompt="step cache", seed=3, sets=sets)
    entry = comfy.run(patched, timeout=300)
    assert entry["status"]["status_str"] == "success"
    (text,) = entry["outputs"][sampler]["text"]  # the node's UI text, kept in the prompt's history
    assert text.startswith("step cache 1: ") and text.endswith(" of 8 steps ran every block"), text
    (image,) = comfy.images(entry).values()
    assert image.size == (192, 128)
