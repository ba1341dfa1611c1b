"""The bundled workflows (editor and API format) and the headless client's pure parts. No ComfyUI needed.

The workflows are read against the node contract (tests/fixtures/node_contract.json), which the node classes
are held to (tests/nodes/, and a real server's /object_info in the integration tests), while the generator
reads the node classes themselves: a node that changes without its contract fails there, and a
generator that drifts from either fails here.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from node_contract import CONTRACT as NODE_CONTRACT
from repo_scripts import load_script

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = REPO / "workflows"
API = WORKFLOWS / "api"


build_workflows = load_script("build_workflows")
client = load_script("klein_client")

# ---------------------------------------------------------------------------------------------------------
# The contract: link inputs (name -> type, required?), widgets in order, outputs (types in order).

# The pack's nodes as the editor lists them: link inputs {name: (type, required)}, widgets in order, outputs.
CONTRACT = {
    node_id: {
        "inputs": node.sockets,
        "widgets": node.widgets,
        "outputs": list(node.outputs),
        "control_after_generate": list(node.control_after_generate),
    }
    for node_id, node in NODE_CONTRACT.items()
}
# The native nodes the workflows use (checked against a real server's /object_info by test_server.py).
NATIVE = {
    "PreviewAny": {"inputs": {"source": ("*", True)}, "widgets": [], "outputs": ["STRING"]},
    # the upload button is frontend-only: kept in widgets_values ("image"), never sent to the server
    "LoadImage": {
        "inputs": {},
        "widgets": ["image", "upload"],
        "api_widgets": ["image"],
        "outputs": ["IMAGE", "MASK"],
    },
    "SaveImage": {
        "inputs": {"images": ("IMAGE", True)},
        "widgets": ["filename_prefix"],
        "outputs": ["IMAGE"],
    },
}
NATIVE.update({  # native sampling, in the native-sampler workflows
    "BasicGuider": {"inputs": {"model": ("MODEL", True), "conditioning": ("CONDITIONING", True)},
                    "widgets": [], "outputs": ["GUIDER"]},
    "CFGGuider": {"inputs": {"model": ("MODEL", True), "positive": ("CONDITIONING", True),
                             "negative": ("CONDITIONING", True)}, "widgets": ["cfg"], "outputs": ["GUIDER"]},
    "RandomNoise": {"inputs": {}, "widgets": ["noise_seed"], "outputs": ["NOISE"],
                    "control_after_generate": ["noise_seed"]},
    "KSamplerSelect": {"inputs": {}, "widgets": ["sampler_name"], "outputs": ["SAMPLER"]},
    "Flux2Scheduler": {"inputs": {}, "widgets": ["steps", "width", "height"], "outputs": ["SIGMAS"]},
    "EmptyFlux2LatentImage": {"inputs": {}, "widgets": ["width", "height", "batch_size"],
                              "outputs": ["LATENT"]},
    "SamplerCustomAdvanced": {"inputs": {k: (t, True) for k, t in (("noise", "NOISE"), ("guider", "GUIDER"),
                              ("sampler", "SAMPLER"), ("sigmas", "SIGMAS"), ("latent_image", "LATENT"))},
                              "widgets": [], "outputs": ["LATENT", "LATENT"]},
    "EasyCache": {"inputs": {"model": ("MODEL", True)},
                  "widgets": ["reuse_threshold", "start_percent", "end_percent", "verbose"],
                  "outputs": ["MODEL"]},
    # a schedule as a list (the Turbo workflow)
    "ManualSigmas": {"inputs": {}, "widgets": ["sigmas"], "outputs": ["SIGMAS"]},
})  # fmt: skip
NATIVE.update({  # masks, in the regional-prompt workflow
    "SolidMask": {"inputs": {}, "widgets": ["value", "width", "height"], "outputs": ["MASK"]},
    "MaskComposite": {"inputs": {"destination": ("MASK", True), "source": ("MASK", True)},
                      "widgets": ["x", "y", "operation"], "outputs": ["MASK"]},
    "InvertMask": {"inputs": {"mask": ("MASK", True)}, "widgets": [], "outputs": ["MASK"]},
})  # fmt: skip
NATIVE["ImageScaleBy"] = {  # the upscale workflow's Lanczos enlargement
    "inputs": {"image": ("IMAGE", True)},
    "widgets": ["upscale_method", "scale_by"],
    "outputs": ["IMAGE"],
}
FRONTEND_ONLY = {"MarkdownNote": {"widgets": ["text"]}, "Note": {"widgets": ["text"]}}
SCHEMAS = {**CONTRACT, **NATIVE}
CONTROL_VALUES = {"fixed", "increment", "decrement", "randomize"}

KLEIN_NAMES = [
    "flux2_klein_4b_text_to_image",
    "flux2_klein_4b_base_text_to_image",
    "flux2_klein_4b_edit",
    "flux2_klein_4b_multi_reference_edit",
    "flux2_klein_4b_edit_reference_strength",
    "flux2_klein_4b_regional_prompt",
    "flux2_klein_4b_regional_edit",
    "flux2_klein_4b_refcontrol_depth",
    "flux2_klein_9b_kv_edit",
    "flux2_klein_4b_img2img",
    "flux2_klein_4b_inpaint",
    "flux2_klein_4b_outpaint",
    "flux2_klein_4b_lora",
    "flux2_klein_4b_text_to_image_4mp",
]
DEV_NAMES = ["flux2_dev_text_to_image", "flux2_dev_multi_reference_edit", "flux2_dev_lora", "flux2_dev_turbo"]
FILL_NAMES = ["flux1_fill_inpaint", "flux1_fill_outpaint"]
NATIVE_SAMPLING_NAMES = ["flux2_klein_4b_native_sampler", "flux2_klein_4b_native_easycache"]
CONTROL_NAMES = ["flux2_dev_controlnet_pose", "flux2_dev_controlnet_inpaint"]  # the Fun ControlNet on dev
UPSCALE_NAMES = ["flux2_klein_4b_upscale_2x"]  # FLUX.2 Tiled Refine, no sampler
NAMES = KLEIN_NAMES + DEV_NAMES + FILL_NAMES + NATIVE_SAMPLING_NAMES + CONTROL_NAMES + UPSCALE_NAMES
# The first-run workflows' second names: title-like, first A-Z, found by "klein text to image" / "klein edit"
ALIASES = {
    "FLUX.2 klein text to image": "flux2_klein_4b_text_to_image",
    "FLUX.2 klein edit": "flux2_klein_4b_edit",
}
FILES = NAMES + list(ALIASES)  # every editor workflow file (the aliases' API format is the original's)
SAMPLERS = ("Flux2KleinSampler", "Flux1FillSampler")
DETAILS = REPO / "docs" / "workflows.md"


def editor(name: str) -> dict:
    return json.loads((WORKFLOWS / f"{name}.json").read_text(encoding="utf-8"))


def note_of(name: str) -> str:
    """The text of the workflow's note (the one Markdown note)."""
    return next(n for n in editor(name)["nodes"] if n["type"] == "MarkdownNote")["widgets_values"][0]


def details(name: str) -> str:
    """The workflow's section of docs/workflows.md (what its short note leaves out)."""
    text = DETAILS.read_text(encoding="utf-8")
    start = text.index(f"`workflows/{name}.json`")
    end = text.find("\n## ", start)
    return text[start : end if end > 0 else len(text)]


def api(name: str) -> dict:
    return json.loads((API / f"{name}.json").read_text(encoding="utf-8"))


def api_widgets(type_: str) -> list[str]:
    schema = SCHEMAS[type_]
    return schema.get("api_widgets", schema["widgets"])


def editor_widget_values(node: dict) -> dict:
    """{widget name: value} of an editor node, with the control_after_generate entries taken out."""
    schema = SCHEMAS[node["type"]]
    values = list(node["widgets_values"])
    out = {}
    for w in schema["widgets"]:
        out[w] = values.pop(0)
        if w in schema.get("control_after_generate", ()):
            control = values.pop(0)
            assert control in CONTROL_VALUES, (node["id"], control)
    assert not values, f"node {node['id']}: extra widget values {values}"
    return out


def editor_edges(wf: dict) -> set[tuple]:
    """{(target id, input name, source id, output slot)} of an editor workflow."""
    nodes = {n["id"]: n for n in wf["nodes"]}
    return {(str(t), nodes[t]["inputs"][ts]["name"], str(o), os_) for _, o, os_, t, ts, _ in wf["links"]}


def api_edges(wf: dict) -> set[tuple]:
    return {
        (nid, name, v[0], v[1])
        for nid, n in wf.items()
        for name, v in n["inputs"].items()
        if isinstance(v, list) and len(v) == 2 and isinstance(v[0], str)
    }


# ---------------------------------------------------------------------------------------------------------
# Files and drift


def test_every_workflow_is_there_and_parses():
    assert sorted(p.stem for p in WORKFLOWS.glob("*.json")) == sorted(FILES)
    assert sorted(p.stem for p in API.glob("*.json")) == sorted(NAMES)
    for name in FILES:
        assert editor(name)["version"] == 0.4
    for name in NAMES:
        assert isinstance(api(name), dict)


def test_committed_files_match_the_generator():
    expected = build_workflows.expected_files()
    made = [*WORKFLOWS.glob("*.json"), *API.glob("*.json"), DETAILS, REPO / "web" / "template_order.js"]
    on_disk = {p: p.read_text(encoding="utf-8") for p in made}
    assert sorted(map(str, expected)) == sorted(map(str, on_disk))
    stale = [str(p.relative_to(REPO)) for p, text in expected.items() if on_disk[p] != text]
    assert not stale, f"run `python scripts/build_workflows.py` (out of date: {stale})"


def test_generator_check_mode_passes():
    assert build_workflows.main(["--check"]) == 0


# ---------------------------------------------------------------------------------------------------------
# Editor format


@pytest.mark.parametrize("name", NAMES)
def test_editor_links_are_consistent(name):
    wf = editor(name)
    nodes = {n["id"]: n for n in wf["nodes"]}
    assert len(nodes) == len(wf["nodes"]), "duplicate node ids"
    assert wf["last_node_id"] >= max(nodes)
    link_ids = [lk[0] for lk in wf["links"]]
    assert len(set(link_ids)) == len(link_ids), "duplicate link ids"
    assert wf["last_link_id"] >= max(link_ids)
    for link_id, origin, origin_slot, target, target_slot, type_ in wf["links"]:
        out = nodes[origin]["outputs"][origin_slot]
        inp = nodes[target]["inputs"][target_slot]
        assert link_id in out["links"], (name, link_id)
        assert inp["link"] == link_id, (name, link_id)
        assert out["type"] == type_ and inp["type"] in (type_, "*"), (name, link_id)  # "*" takes any type
        # ... and the contract agrees on both ends
        assert SCHEMAS[nodes[origin]["type"]]["outputs"][origin_slot] == type_
        assert SCHEMAS[nodes[target]["type"]]["inputs"][inp["name"]][0] in (type_, "*")
    # no dangling references on the nodes' side
    by_id = {lk[0]: lk for lk in wf["links"]}
    for node in wf["nodes"]:
        for slot, inp in enumerate(node["inputs"]):
            if inp["link"] is not None:
                assert by_id[inp["link"]][3:5] == [node["id"], slot], (name, node["id"], inp["name"])
        for slot, out in enumerate(node["outputs"]):
            assert out.get("slot_index", slot) == slot
            for link_id in out["links"] or []:
                assert by_id[link_id][1:3] == [node["id"], slot], (name, node["id"], link_id)


@pytest.mark.parametrize("name", NAMES)
def test_editor_nodes_follow_the_contract(name):
    wf = editor(name)
    notes = [n for n in wf["nodes"] if n["type"] in FRONTEND_ONLY]
    assert len(notes) == 1, "one Markdown note per workflow"
    for node in wf["nodes"]:
        type_ = node["type"]
        if type_ in FRONTEND_ONLY:
            assert len(node["widgets_values"]) == len(FRONTEND_ONLY[type_]["widgets"])
            continue
        assert type_ in SCHEMAS, f"unknown node type {type_}"
        schema = SCHEMAS[type_]
        assert node["properties"]["Node name for S&R"] == type_
        assert node["mode"] == 0, "no bypassed or muted nodes"
        # sockets first (contract order), then one widget input per widget, in widget order
        names = [i["name"] for i in node["inputs"]]
        assert names == list(schema["inputs"]) + schema["widgets"], (name, type_)
        for inp in node["inputs"]:
            if inp["name"] in schema["widgets"]:
                assert inp["widget"] == {"name": inp["name"]} and inp["link"] is None
            else:
                assert inp["type"] == schema["inputs"][inp["name"]][0]
                if schema["inputs"][inp["name"]][1]:
                    assert inp["link"] is not None, f"{name}: required input {type_}.{inp['name']} unlinked"
        assert [o["type"] for o in node["outputs"]] == schema["outputs"]
        n_controls = len(schema.get("control_after_generate", ()))
        assert len(node["widgets_values"]) == len(schema["widgets"]) + n_controls
        values = editor_widget_values(node)
        if type_ in SAMPLERS:
            assert node["widgets_values"][1] == "randomize"
            assert isinstance(values["seed"], int)


@pytest.mark.parametrize("name", NAMES)
def test_loaders_name_their_model_files(name):
    wf = editor(name)
    folders = {"model_name": "diffusion_models", "text_encoder_name": "text_encoders", "vae_name": "vae",
               "t5_name": "text_encoders", "clip_name": "text_encoders",
               "control_net_name": "controlnet", "lora_name": "loras"}  # fmt: skip
    # The official BFL repos, Comfy-Org's repackaged ones, those of ComfyUI's author (the FLUX.1 text
    # encoders of ComfyUI's own templates), the Fun ControlNet's publisher, the RefControl LoRAs' author
    # and the Turbo LoRA's publisher, nothing else.
    orgs = ("Comfy-Org", "black-forest-labs", "comfyanonymous", "alibaba-pai", "thedeoxen", "fal")
    official = tuple(f"https://huggingface.co/{org}/" for org in orgs)
    note = next(n for n in wf["nodes"] if n["type"] == "MarkdownNote")["widgets_values"][0]
    for node in wf["nodes"]:
        if node["type"] == "Flux2KleinLoraLoader" and "lora" in name.split("_"):  # the user's own LoRA
            assert "models" not in node["properties"] and "`models/loras`" in note
            continue
        if not node["type"].endswith("Loader"):
            continue
        widgets = [w for w in CONTRACT[node["type"]]["widgets"] if w in folders]
        assert widgets, node["type"]
        models = node["properties"]["models"]
        assert len(models) == len(widgets)  # one download entry per file the loader reads
        for widget, model in zip(widgets, models):
            filename = editor_widget_values(node)[widget]
            # the frontend's workflow schema requires name, directory and url in every entry
            assert sorted(model) == ["directory", "name", "url"], model
            assert model["name"] == filename and model["directory"] == folders[widget]
            assert model["url"].startswith(official) and model["url"].endswith("/" + filename)
            assert f"`{filename}`" in note and f"`models/{folders[widget]}`" in note


# ---------------------------------------------------------------------------------------------------------
# API format, and the two formats against each other


@pytest.mark.parametrize("name", NAMES)
def test_api_workflow_is_well_formed(name):
    wf = api(name)
    for node_id, node in wf.items():
        assert node_id.isdigit()
        assert set(node) == {"inputs", "class_type", "_meta"} and node["_meta"]["title"]
        schema = SCHEMAS[node["class_type"]]  # KeyError: unknown (or frontend-only) node type
        widgets = api_widgets(node["class_type"])
        assert set(node["inputs"]) <= set(schema["inputs"]) | set(widgets), node_id
        for w in widgets:
            assert w in node["inputs"] and not isinstance(node["inputs"][w], list), (node_id, w)
        for input_name, (type_, required) in schema["inputs"].items():
            value = node["inputs"].get(input_name)
            if value is None:
                assert not required, f"{name}: node {node_id} misses required input {input_name}"
                continue
            source, slot = value
            assert source in wf, f"{name}: node {node_id}.{input_name} links to missing node {source}"
            assert type_ in (SCHEMAS[wf[source]["class_type"]]["outputs"][slot], "*")
        if node["class_type"] in SAMPLERS:
            assert node["inputs"]["seed"] == 42


@pytest.mark.parametrize("name", NAMES)
def test_both_formats_describe_the_same_graph(name):
    ed, ap = editor(name), api(name)
    nodes = {str(n["id"]): n for n in ed["nodes"] if n["type"] not in FRONTEND_ONLY}
    assert {i: n["type"] for i, n in nodes.items()} == {i: n["class_type"] for i, n in ap.items()}
    assert editor_edges(ed) == api_edges(ap)
    for node_id, node in nodes.items():
        values = editor_widget_values(node)
        for w in api_widgets(node["type"]):
            assert ap[node_id]["inputs"][w] == values[w], (name, node_id, w)
        assert ap[node_id]["_meta"]["title"] == node.get("title", ap[node_id]["_meta"]["title"])


def _sampler(wf: dict) -> dict:
    (node,) = [n for n in wf.values() if n["class_type"] == "Flux2KleinSampler"]
    return node


def _source(wf: dict, node: dict, input_name: str) -> dict | None:
    value = node["inputs"].get(input_name)
    return wf[value[0]] if value else None


def _through_loras(wf: dict, node: dict, input_name: str) -> dict | None:
    """The loader behind ``node``'s input, past any LoRA loaders (model out 0, text encoder out 2)."""
    source = _source(wf, node, input_name)
    while source is not None and source["class_type"] == "Flux2KleinLoraLoader":
        source = _source(wf, source, "model" if node["inputs"][input_name][1] == 0 else "text_encoder")
    return source


def _reference_chain(wf: dict) -> list[dict]:
    """Reference-encode nodes from the first reference to the one feeding the sampler."""
    chain, node = [], _source(wf, _sampler(wf), "references")
    while node is not None:
        chain.insert(0, node)
        node = _source(wf, node, "references")
    return chain


EXPECTED = {
    # name: (dit, text encoder, variant, steps, guidance, size, references, negative)
    "flux2_klein_4b_text_to_image": ("flux-2-klein-4b", "qwen_3_4b", "distilled", 4, 1.0, 1024, 0, False),
    "flux2_klein_4b_base_text_to_image": (
        "flux-2-klein-base-4b",
        "qwen_3_4b",
        "base",
        50,
        4.0,
        1024,
        0,
        True,
    ),
    "flux2_klein_4b_edit": ("flux-2-klein-4b", "qwen_3_4b", "distilled", 4, 1.0, 0, 1, False),
    "flux2_klein_4b_lora": ("flux-2-klein-4b", "qwen_3_4b", "distilled", 4, 1.0, 1024, 0, False),
    "flux2_klein_4b_multi_reference_edit": ("flux-2-klein-4b", "qwen_3_4b", "distilled", 4, 1.0, 0, 4, False),
    "flux2_klein_9b_kv_edit": ("flux-2-klein-9b-kv", "qwen_3_8b", "kv", 4, 1.0, 0, 2, False),
    "flux2_klein_4b_edit_reference_strength": (
        "flux-2-klein-4b",
        "qwen_3_4b",
        "distilled",
        4,
        1.0,
        0,
        2,
        False,
    ),
    "flux2_klein_4b_regional_prompt": ("flux-2-klein-4b", "qwen_3_4b", "distilled", 4, 1.0, 1024, 0, False),
    "flux2_klein_4b_regional_edit": ("flux-2-klein-4b", "qwen_3_4b", "distilled", 4, 1.0, 0, 1, False),
    "flux2_klein_4b_refcontrol_depth": ("flux-2-klein-base-4b", "qwen_3_4b", "base", 50, 4.0, 0, 2, True),
    "flux2_klein_4b_img2img": ("flux-2-klein-4b", "qwen_3_4b", "distilled", 4, 1.0, 0, 0, False),
    "flux2_klein_4b_inpaint": ("flux-2-klein-4b", "qwen_3_4b", "distilled", 4, 1.0, 0, 0, False),
    "flux2_klein_4b_outpaint": ("flux-2-klein-4b", "qwen_3_4b", "distilled", 4, 1.0, 0, 0, False),
    "flux2_klein_4b_text_to_image_4mp": ("flux-2-klein-4b", "qwen_3_4b", "distilled", 4, 1.0, 2048, 0, False),
    # FLUX.2 [dev]: 50 steps, guidance 4 embedded, no negative (BFL's and diffusers' defaults)
    "flux2_dev_text_to_image": ("flux2-dev", "mistral_3_small_flux2_bf16", "dev", 50, 4.0, 1024, 0, False),
    "flux2_dev_multi_reference_edit": (
        "flux2-dev",
        "mistral_3_small_flux2_bf16",
        "dev",
        50,
        4.0,
        0,
        3,
        False,
    ),
    "flux2_dev_lora": ("flux2-dev", "mistral_3_small_flux2_bf16", "dev", 50, 4.0, 1024, 0, False),
    # the Turbo LoRA: 8 steps on its own sigmas (the steps widget says 8; the list sets them), guidance 2.5
    "flux2_dev_turbo": ("flux2-dev", "mistral_3_small_flux2_bf16", "dev", 8, 2.5, 1024, 0, False),
}
EDITING = {"flux2_klein_4b_img2img", "flux2_klein_4b_inpaint", "flux2_klein_4b_outpaint"}


@pytest.mark.parametrize("name", KLEIN_NAMES + DEV_NAMES)
def test_workflow_settings(name):
    dit, te, variant, steps, guidance, size, n_refs, has_negative = EXPECTED[name]
    wf = api(name)
    sampler = _sampler(wf)
    model = _through_loras(wf, sampler, "model")["inputs"]
    assert (model["model_name"], model["variant"]) == (f"{dit}.safetensors", variant)
    positive = _source(wf, sampler, "positive")
    while positive["class_type"] == "Flux2KleinRegionalPrompt":  # regions chained onto the global prompt
        positive = _source(wf, positive, "conditioning")
    assert _through_loras(wf, positive, "text_encoder")["inputs"]["text_encoder_name"] == f"{te}.safetensors"
    assert positive["inputs"]["text"].strip()
    s = sampler["inputs"]
    assert (s["steps"], s["guidance"], s["width"], s["height"], s["batch_size"]) == (
        steps,
        guidance,
        size,
        size,
        1,
    )
    negative = _source(wf, sampler, "negative")
    assert (negative is not None) == has_negative
    if negative is not None:
        assert negative["class_type"] == "Flux2KleinTextEncode" and negative["inputs"]["text"] == ""
        assert negative is not positive
    if name in EDITING:
        return  # wired differently: test_editing_workflow_wiring
    chain = _reference_chain(wf)
    assert len(chain) == n_refs
    images = [_source(wf, enc, "image") for enc in chain]
    assert all(img["class_type"] == "LoadImage" for img in images)
    assert len({id(img) for img in images}) == n_refs == len(client.nodes_of_type(wf, "LoadImage"))
    (save,) = [n for n in wf.values() if n["class_type"] == "SaveImage"]
    assert (
        save["inputs"]["filename_prefix"] == f"{'flux2_dev' if name in DEV_NAMES else 'flux2_klein'}/{name}"
    )
    decode = _source(wf, save, "images")
    assert decode["class_type"] == "Flux2KleinDecode" and _source(wf, decode, "latent") is sampler


@pytest.mark.parametrize("name", DEV_NAMES)
def test_dev_workflows_use_comfyuis_devices_and_name_the_fp8_files(name):
    wf = api(name)
    sampler = _sampler(wf)
    model = _through_loras(wf, sampler, "model")["inputs"]
    assert (model["devices"], model["offload"], model["weight_dtype"]) == ("", "none", "default")
    encoder = _through_loras(wf, _source(wf, sampler, "positive"), "text_encoder")["inputs"]
    assert encoder["device"] == "default"
    note = details(name)  # the fp8 files, the licence and the GPUs: in the workflow's section of the docs
    for alternative in ("flux2_dev_fp8mixed.safetensors", "mistral_3_small_flux2_fp8.safetensors"):
        f = build_workflows.FILES[alternative]
        assert f"`{alternative}`" in note and f.url in note and f.licence in note
    settings = "8 steps, guidance 2.5" if name == "flux2_dev_turbo" else "50 steps, guidance 4.0"
    assert "`cuda:0,cuda:1`" in note and "`devices`" in note and settings in note
    assert "FLUX.2 [dev] non-commercial licence" in note


def _link(wf, node, name):
    """(source node's class, its output slot) feeding ``node``'s input ``name``."""
    source, slot = node["inputs"][name]
    return wf[source]["class_type"], slot


@pytest.mark.parametrize("name", sorted(EDITING))
def test_editing_workflow_wiring(name):
    wf = api(name)
    sampler = _sampler(wf)
    (save,) = [n for n in wf.values() if n["class_type"] == "SaveImage"]
    if name == "flux2_klein_4b_img2img":
        assert sampler["inputs"]["denoise"] == 0.75 and "references" not in sampler["inputs"]
        assert _link(wf, sampler, "latent") == ("Flux2KleinEncode", 0)
        assert _link(wf, _source(wf, sampler, "latent"), "image") == ("LoadImage", 0)
        assert _link(wf, save, "images") == ("Flux2KleinDecode", 0)
        return
    assert sampler["inputs"]["denoise"] == 1.0
    prepare = _source(wf, sampler, "latent")
    assert _link(wf, sampler, "latent") == ("Flux2KleinInpaintPrepare", 0)
    assert _link(wf, sampler, "references") == ("Flux2KleinInpaintPrepare", 1)  # the image is reference 1
    composite = _source(wf, save, "images")
    assert composite["class_type"] == "Flux2KleinComposite" and composite["inputs"]["feather"] > 0
    assert _link(wf, composite, "image") == ("Flux2KleinDecode", 0)
    assert _link(wf, composite, "stitch") == ("Flux2KleinInpaintPrepare", 2)
    source = "LoadImage" if name == "flux2_klein_4b_inpaint" else "Flux2KleinOutpaintPad"
    assert _link(wf, prepare, "image") == (source, 0) and _link(wf, prepare, "mask") == (source, 1)


@pytest.mark.parametrize("name", FILL_NAMES)
def test_fill_workflow_settings_and_wiring(name):
    wf = api(name)
    (sampler,) = [n for n in wf.values() if n["class_type"] == "Flux1FillSampler"]
    s = sampler["inputs"]
    assert (s["steps"], s["guidance"], s["denoise"], s["batch_size"]) == (50, 30.0, 1.0, 1)
    assert (s["grow_mask"], s["crop_to_mask"]) == ((4, False) if name == "flux1_fill_inpaint" else (0, False))
    assert _source(wf, sampler, "model")["inputs"]["model_name"] == "flux1-fill-dev.safetensors"
    positive = _source(wf, sampler, "positive")
    assert positive["class_type"] == "Flux1FillTextEncode" and positive["inputs"]["text"].strip()
    encoders = _source(wf, positive, "text_encoder")["inputs"]
    assert (encoders["t5_name"], encoders["clip_name"]) == ("t5xxl_fp16.safetensors", "clip_l.safetensors")
    assert _source(wf, sampler, "vae")["inputs"]["vae_name"] == "ae.safetensors"
    source = "LoadImage" if name == "flux1_fill_inpaint" else "Flux2KleinOutpaintPad"
    assert _link(wf, sampler, "image") == (source, 0) and _link(wf, sampler, "mask") == (source, 1)
    if name == "flux1_fill_outpaint":
        pad = _source(wf, sampler, "image")
        assert _link(wf, pad, "image") == ("LoadImage", 0) and pad["inputs"]["right"] == 256
    (save,) = [n for n in wf.values() if n["class_type"] == "SaveImage"]
    assert save["inputs"]["filename_prefix"] == f"flux1_fill/{name}"
    composite = _source(wf, save, "images")
    assert composite["class_type"] == "Flux2KleinComposite" and composite["inputs"]["feather"] > 0
    assert _link(wf, composite, "image") == ("Flux1FillDecode", 0)
    assert _link(wf, composite, "stitch") == ("Flux1FillSampler", 1)
    decode = _source(wf, composite, "image")
    assert _link(wf, decode, "latent") == ("Flux1FillSampler", 0)
    assert _link(wf, decode, "vae") == ("Flux1FillVAELoader", 0)
    assert len(client.nodes_of_type(wf, "LoadImage")) == 1


@pytest.mark.parametrize("name", FILL_NAMES)
def test_fill_workflows_run_headless_with_the_clients_prompt_and_seed(name):
    # The note's headless line: the image through --image, the prompt and seed as for klein workflows.
    wf = client.prepare_workflow(api(name), images=["mine.png"], prompt="a red door", seed=7)
    (sampler,) = [n for n in wf.values() if n["class_type"] == "Flux1FillSampler"]
    assert (
        sampler["inputs"]["seed"] == 7 and _source(wf, sampler, "positive")["inputs"]["text"] == "a red door"
    )
    assert [wf[i]["inputs"]["image"] for i in client.nodes_of_type(wf, "LoadImage")] == ["mine.png"]
    assert '--prompt "..." --seed 42' in details(name)


# ---------------------------------------------------------------------------------------------------------
# Client: workflow patching


def test_load_workflow_refuses_the_editor_format(tmp_path):
    with pytest.raises(client.ComfyError, match="editor"):
        client.load_workflow(WORKFLOWS / "flux2_klein_4b_edit.json")
    assert client.load_workflow(API / "flux2_klein_4b_edit.json") == api("flux2_klein_4b_edit")
    bad = tmp_path / "bad.json"
    bad.write_text('{"1": {"inputs": {}}}')
    with pytest.raises(client.ComfyError, match="not an API-format"):
        client.load_workflow(bad)


def test_prepare_sets_images_prompt_seed_and_more():
    wf = api("flux2_klein_4b_multi_reference_edit")
    out = client.prepare_workflow(
        wf,
        images=["a.png", "sub/b.png", "c.png"],
        prompt="combine them",
        seed=7,
        sets=["Flux2KleinSampler.steps=8", "Reference 2.max_megapixels=0.5", "1.weight_dtype=bfloat16"],
    )
    assert wf == api("flux2_klein_4b_multi_reference_edit"), "the input workflow is left alone"
    loaders = client.nodes_of_type(out, "LoadImage")
    assert [out[i]["inputs"]["image"] for i in loaders] == ["a.png", "sub/b.png", "c.png"]
    assert [_source(out, enc, "image")["inputs"]["image"] for enc in _reference_chain(out)] == [
        "a.png",
        "sub/b.png",
        "c.png",
    ]
    sampler = _sampler(out)
    assert _source(out, sampler, "positive")["inputs"]["text"] == "combine them"
    assert sampler["inputs"]["seed"] == 7 and sampler["inputs"]["steps"] == 8
    assert _reference_chain(out)[1]["inputs"]["max_megapixels"] == 0.5
    assert out["1"]["inputs"]["weight_dtype"] == "bfloat16"


def test_prompt_goes_to_the_positive_encoder_and_negative_to_the_negative():
    wf = client.prepare_workflow(api("flux2_klein_4b_base_text_to_image"), prompt="a cat", negative="blurry")
    sampler = _sampler(wf)
    assert _source(wf, sampler, "positive")["inputs"]["text"] == "a cat"
    assert _source(wf, sampler, "negative")["inputs"]["text"] == "blurry"
    with pytest.raises(client.ComfyError, match="negative"):
        client.prepare_workflow(api("flux2_klein_4b_text_to_image"), negative="blurry")


def test_fewer_images_cut_the_reference_chain():
    one = client.prepare_workflow(api("flux2_klein_9b_kv_edit"), images=["me.png"])
    chain = _reference_chain(one)
    assert len(chain) == 1 and _source(one, chain[0], "image")["inputs"]["image"] == "me.png"
    assert len(client.nodes_of_type(one, "LoadImage")) == 1
    assert _sampler(one)["inputs"]["width"] == 0, "still sized by the (remaining) first reference"
    _assert_links_resolve(one)

    two = client.prepare_workflow(api("flux2_klein_4b_multi_reference_edit"), images=["x.png", "y.png"])
    assert [_source(two, e, "image")["inputs"]["image"] for e in _reference_chain(two)] == ["x.png", "y.png"]
    _assert_links_resolve(two)

    none = client.prepare_workflow(api("flux2_klein_4b_edit"), images=[])
    assert "references" not in _sampler(none)["inputs"]
    assert (
        client.nodes_of_type(none, "LoadImage")
        == client.nodes_of_type(none, "Flux2KleinReferenceEncode")
        == []
    )
    assert (_sampler(none)["inputs"]["width"], _sampler(none)["inputs"]["height"]) == (1024, 1024)
    _assert_links_resolve(none)

    with pytest.raises(client.ComfyError, match="only 1 LoadImage"):
        client.prepare_workflow(api("flux2_klein_4b_edit"), images=["a.png", "b.png"])


def _assert_links_resolve(wf: dict) -> None:
    for node in wf.values():
        for value in node["inputs"].values():
            if isinstance(value, list):
                assert value[0] in wf


def test_set_assignments():
    wf = api("flux2_klein_4b_base_text_to_image")
    assert client.parse_value("8") == 8 and client.parse_value("0.5") == 0.5
    assert client.parse_value("true") is True and client.parse_value("a cat") == "a cat"
    sampler_id = client.nodes_of_type(wf, "Flux2KleinSampler")[0]
    assert client.apply_set(wf, f"{sampler_id}.guidance=3.5") == sampler_id
    assert wf[sampler_id]["inputs"]["guidance"] == 3.5
    client.apply_set(wf, "FLUX.2 Sampler.width=768")  # by title (dots in it are fine)
    assert wf[sampler_id]["inputs"]["width"] == 768
    client.apply_set(wf, "Negative prompt.text=ugly, blurry")
    assert _source(wf, _sampler(wf), "negative")["inputs"]["text"] == "ugly, blurry"
    for bad, match in [
        ("Flux2KleinTextEncode.text=x", "matches nodes"),  # two text encoders: ambiguous
        ("Nope.steps=1", "no node"),
        ("steps=1", "NODE.INPUT=VALUE"),
        (f"{sampler_id}.model=1", "is a link"),
    ]:
        with pytest.raises(client.ComfyError, match=match):
            client.apply_set(wf, bad)


def test_prompt_error_is_readable():
    body = {
        "error": {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation"},
        "node_errors": {
            "1": {
                "errors": [
                    {
                        "type": "value_not_in_list",
                        "message": "Value not in list",
                        "details": "model_name: 'x.safetensors' not in []",
                    }
                ],
                "dependent_outputs": ["7"],
                "class_type": "Flux2KleinModelLoader",
            }
        },
    }
    text = str(client.PromptRejected(body))
    assert "Prompt outputs failed validation" in text
    assert "node 1 (Flux2KleinModelLoader): Value not in list (model_name: 'x.safetensors' not in [])" in text
    assert client.PromptRejected(body).exit_code == 3


def test_fetch_outputs_keeps_saved_images_only():
    entry = {
        "outputs": {
            "9": {"images": [{"filename": "b.png", "subfolder": "flux2_klein", "type": "output"}]},
            "10": {"images": [{"filename": "p.png", "subfolder": "", "type": "temp"}]},
            "7": {"images": [{"filename": "a.png", "subfolder": "flux2_klein", "type": "output"}]},
        }
    }
    assert [(i["node_id"], i["filename"]) for i in client.fetch_outputs(entry)] == [
        ("7", "a.png"),
        ("9", "b.png"),
    ]


# ---------------------------------------------------------------------------------------------------------
# Client: the HTTP calls, against a small stand-in for ComfyUI's routes (no websocket: polling path)


class _FakeComfy(BaseHTTPRequestHandler):
    uploads: dict = {}
    prompts: dict = {}

    def log_message(self, *args):
        pass

    def _send(self, code: int, body, ctype="application/json"):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/upload/image":
            assert b'name="overwrite"\r\n\r\ntrue' in body
            name = body.split(b'filename="')[1].split(b'"')[0].decode()
            self.uploads[name] = body
            return self._send(200, {"name": name, "subfolder": "", "type": "input"})
        if self.path == "/prompt":
            payload = json.loads(body)
            prompt = payload["prompt"]
            if any(
                n["class_type"] == "Flux2KleinModelLoader" and n["inputs"]["model_name"] == "missing"
                for n in prompt.values()
            ):
                return self._send(
                    400,
                    {
                        "error": {"message": "Prompt outputs failed validation", "details": ""},
                        "node_errors": {
                            "1": {
                                "errors": [{"message": "Value not in list"}],
                                "class_type": "Flux2KleinModelLoader",
                            }
                        },
                    },
                )
            self.prompts[payload["prompt_id"]] = prompt
            return self._send(200, {"prompt_id": payload["prompt_id"], "number": 0, "node_errors": {}})
        self._send(404, {})

    def do_GET(self):
        if self.path.startswith("/history/"):
            prompt_id = self.path.rsplit("/", 1)[1]
            prompt = self.prompts.get(prompt_id)
            if prompt is None:
                return self._send(200, {})
            text = next(
                n["inputs"]["text"] for n in prompt.values() if n["class_type"] == "Flux2KleinTextEncode"
            )
            if text == "FAIL":
                status = {
                    "status_str": "error",
                    "completed": False,
                    "messages": [
                        ["execution_start", {"prompt_id": prompt_id}],
                        [
                            "execution_error",
                            {
                                "prompt_id": prompt_id,
                                "node_id": "4",
                                "node_type": "Flux2KleinTextEncode",
                                "exception_type": "RuntimeError",
                                "exception_message": "boom",
                            },
                        ],
                    ],
                }
                return self._send(200, {prompt_id: {"prompt": [], "outputs": {}, "status": status}})
            outputs = {
                "7": {
                    "images": [{"filename": "out_00001_.png", "subfolder": "flux2_klein", "type": "output"}]
                }
            }
            status = {"status_str": "success", "completed": True, "messages": []}
            return self._send(200, {prompt_id: {"prompt": [], "outputs": outputs, "status": status}})
        if self.path.startswith("/view?"):
            assert "filename=out_00001_.png" in self.path and "type=output" in self.path
            return self._send(200, b"\x89PNG fake", "image/png")
        self._send(404, {})


@pytest.fixture()
def fake_server():
    _FakeComfy.uploads, _FakeComfy.prompts = {}, {}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeComfy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_client_round_trip_against_a_stand_in_server(fake_server, tmp_path, monkeypatch):
    monkeypatch.setattr(client, "connect_ws", lambda server, client_id, timeout=5.0: None)
    image = tmp_path / "mine.png"
    image.write_bytes(b"\x89PNG input")
    assert client.upload_image(fake_server, image) == "mine.png"

    entry, paths = client.run(
        fake_server,
        api("flux2_klein_4b_edit"),
        images=[image],
        prompt="make it blue",
        output_dir=tmp_path / "out",
    )
    (queued,) = _FakeComfy.prompts.values()
    assert [n["inputs"]["image"] for n in queued.values() if n["class_type"] == "LoadImage"] == ["mine.png"]
    assert [p.name for p in paths] == ["out_00001_.png"] and paths[0].read_bytes() == b"\x89PNG fake"

    with pytest.raises(
        client.ExecutionFailed, match=r"node 4 \(Flux2KleinTextEncode\) failed: RuntimeError: boom"
    ):
        client.run(fake_server, api("flux2_klein_4b_text_to_image"), prompt="FAIL")
    with pytest.raises(client.PromptRejected, match="Value not in list"):
        client.run(fake_server, api("flux2_klein_4b_text_to_image"), sets=["1.model_name=missing"])


def test_cli_exit_codes(fake_server, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(client, "connect_ws", lambda server, client_id, timeout=5.0: None)
    wf = str(API / "flux2_klein_4b_text_to_image.json")
    out = tmp_path / "out"
    assert (
        client.main(
            ["--server", fake_server, "--workflow", wf, "--prompt", "a fox", "--output-dir", str(out)]
        )
        == 0
    )
    assert (out / "out_00001_.png").exists()
    assert client.main(["--server", fake_server, "--workflow", wf, "--prompt", "FAIL", "--quiet"]) == 4
    assert client.main(["--server", fake_server, "--workflow", wf, "--set", "1.model_name=missing"]) == 3
    assert (
        client.main(["--server", fake_server, "--workflow", str(WORKFLOWS / "flux2_klein_4b_edit.json")]) == 1
    )
    assert client.main(["--server", "http://127.0.0.1:9", "--workflow", wf]) == 1
    assert "error:" in capsys.readouterr().err


def test_the_readme_lists_every_model_file_with_its_repo_licence_and_size():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in readme.splitlines() if line.startswith("| `")}
    for f in build_workflows.FILES.values():
        row = next(line for first, line in rows.items() if first.startswith(f"`{f.name}`"))
        assert f"`models/{f.folder}`" in row and f.repos_markdown in row, f.name
        assert f.licence in row and f"{f.size_gb:g} GB" in row, f.name


def test_lora_workflow_wiring():
    wf = api("flux2_klein_4b_lora")
    (lora,) = [n for n in wf.values() if n["class_type"] == "Flux2KleinLoraLoader"]
    (report,) = [n for n in wf.values() if n["class_type"] == "PreviewAny"]
    assert _link(wf, _sampler(wf), "model") == ("Flux2KleinLoraLoader", 0)
    assert _link(wf, report, "source") == ("Flux2KleinLoraLoader", 1)
    positive = _source(wf, _sampler(wf), "positive")
    assert _link(wf, positive, "text_encoder") == ("Flux2KleinLoraLoader", 2)
    assert _link(wf, lora, "model") == ("Flux2KleinModelLoader", 0)
    assert _link(wf, lora, "text_encoder") == ("Flux2KleinTextEncoderLoader", 0)
    assert lora["inputs"]["strength"] == 1.0 and lora["inputs"]["lora_name"].endswith(".safetensors")


def test_turbo_workflow_wiring():
    # the Turbo LoRA on dev, 8 steps on the model card's list shifted by 1024x1024's mu (docs/flux2-dev.md),
    # guidance 2.5, the list through a native ManualSigmas into the sampler's sigmas
    wf = api("flux2_dev_turbo")
    sampler = _sampler(wf)
    assert _link(wf, sampler, "sigmas") == ("ManualSigmas", 0)
    listed = [float(v) for v in _source(wf, sampler, "sigmas")["inputs"]["sigmas"].split(",")]
    assert (
        len(listed) == 9 and listed[0] == 1.0 and listed[-1] == 0.0 and listed == sorted(listed, reverse=True)
    )
    mu = 2.268  # diffusers' empirical mu for 4096 image tokens and 8 steps (the spec works it out)
    card = [1.0, 0.6509, 0.4374, 0.2932, 0.1893, 0.1108, 0.0495, 0.00031]
    shifted = [math.exp(mu) / (math.exp(mu) + 1 / s - 1) for s in card]
    assert listed[:-1] == pytest.approx(shifted, abs=6e-4)
    lora = _source(wf, sampler, "model")
    assert lora["class_type"] == "Flux2KleinLoraLoader" and lora["inputs"]["strength"] == 1.0
    assert lora["inputs"]["lora_name"] == "Flux_2-Turbo-LoRA_comfyui.safetensors"
    assert sampler["inputs"]["guidance"] == 2.5
    dev_lora = api("flux2_dev_lora")
    assert _link(dev_lora, _sampler(dev_lora), "model") == ("Flux2KleinLoraLoader", 0)


def test_the_generator_reads_the_contract_from_the_node_classes():
    # the generator's schemas come from the node classes: they must be the contract, input by input
    specs = build_workflows.NODE_SPECS
    assert {k for k in specs if k.startswith(("Flux2Klein", "Flux2Dev", "Flux1Fill"))} == set(NODE_CONTRACT)
    for node_id, node in NODE_CONTRACT.items():
        spec = specs[node_id]
        assert spec.display_name == node.display, node_id
        assert {s.name: (s.type, not s.optional) for s in spec.inputs} == node.sockets, node_id
        kinds = dict(node.required + node.optional)
        assert [(w.name, w.type) for w in spec.widgets] == [(w, kinds[w]) for w in node.widgets], node_id
        assert [w.name for w in spec.widgets if not w.optional] == [
            name for name in node.required_names if name in node.widgets
        ], node_id
        controls = [w.name for w in spec.widgets if w.control_after_generate]
        assert controls == list(node.control_after_generate), node_id
        assert [kind for _, kind in spec.outputs] == list(node.outputs), node_id


NATIVE_EXPECTED = {
    # name: (dit, variant, guider, cfg, steps, EasyCache on the model)
    "flux2_klein_4b_native_sampler": ("flux-2-klein-4b.safetensors", "distilled", "BasicGuider", None, 4, 0),
    "flux2_klein_4b_native_easycache": ("flux-2-klein-base-4b.safetensors", "base", "CFGGuider", 4.0, 50, 1),
}


@pytest.mark.parametrize("name", NATIVE_SAMPLING_NAMES)
def test_native_sampling_workflows_run_our_model_through_the_bridges(name):
    """Our loaders -> the two bridges -> a guider, KSamplerSelect euler, Flux2Scheduler, RandomNoise and an
    empty FLUX.2 latent -> SamplerCustomAdvanced -> our Decode; EasyCache between the model bridge and the
    guider in the EasyCache workflow."""
    dit, variant, guider_type, cfg, steps, cached = NATIVE_EXPECTED[name]
    wf = api(name)
    (sampler,) = [n for n in wf.values() if n["class_type"] == "SamplerCustomAdvanced"]
    guider = _source(wf, sampler, "guider")
    assert guider["class_type"] == guider_type and guider["inputs"].get("cfg") == cfg
    model = _source(wf, guider, "model")
    if cached:
        assert model["class_type"] == "EasyCache"
        model = _source(wf, model, "model")
    assert model["class_type"] == "Flux2KleinToNativeModel"
    loader = _source(wf, model, "model")
    assert loader["class_type"] == "Flux2KleinModelLoader"
    assert (loader["inputs"]["model_name"], loader["inputs"]["variant"]) == (dit, variant)
    prompts = ["conditioning"] if guider_type == "BasicGuider" else ["positive", "negative"]
    for which in prompts:
        bridge = _source(wf, guider, which)
        assert bridge["class_type"] == "Flux2KleinToNativeConditioning"
        assert _source(wf, bridge, "conditioning")["class_type"] == "Flux2KleinTextEncode"
    assert _source(wf, sampler, "sampler")["inputs"] == {"sampler_name": "euler"}
    sigmas = _source(wf, sampler, "sigmas")
    latent = _source(wf, sampler, "latent_image")
    assert sigmas["class_type"] == "Flux2Scheduler" and sigmas["inputs"]["steps"] == steps
    assert latent["class_type"] == "EmptyFlux2LatentImage"
    assert (sigmas["inputs"]["width"], sigmas["inputs"]["height"]) == (
        latent["inputs"]["width"], latent["inputs"]["height"]
    ) == (1024, 1024)  # fmt: skip
    assert _source(wf, sampler, "noise")["inputs"] == {"noise_seed": 42}
    (decode,) = [n for n in wf.values() if n["class_type"] == "Flux2KleinDecode"]
    assert _source(wf, decode, "latent") is sampler
    # the client finds the prompts and the seed through the native nodes
    patched = client.prepare_workflow(wf, prompt="a test prompt", seed=7, negative="" if cfg else None)
    (noise,) = [n for n in patched.values() if n["class_type"] == "RandomNoise"]
    assert noise["inputs"]["noise_seed"] == 7
    assert "a test prompt" in [n["inputs"].get("text") for n in patched.values()]


@pytest.mark.parametrize("name", CONTROL_NAMES)
def test_control_workflows_steer_dev_through_the_fun_controlnet(name):
    """Dev's files and settings; the control map from its own Load Image through FLUX.2 [dev] Apply
    ControlNet (0.75, the whole schedule) into the sampler's positive; the release file as a download
    entry; the inpaint workflow's image and mask feeding both Inpaint Prepare and the control net, with no
    reference tokens (the control net's inpaint mode sees the picture) and the composite at the end."""
    wf, sampler = api(name), _sampler(api(name))
    model = _source(wf, sampler, "model")["inputs"]
    assert (model["model_name"], model["variant"]) == ("flux2-dev.safetensors", "dev")
    s = sampler["inputs"]
    assert (s["steps"], s["guidance"], "negative" in s, "references" in s) == (50, 4.0, False, False)
    apply = _source(wf, sampler, "positive")
    assert apply["class_type"] == "Flux2DevApplyControlNet"
    assert (apply["inputs"]["strength"], apply["inputs"]["start"], apply["inputs"]["end"]) == (0.75, 0.0, 1.0)
    assert _source(wf, apply, "conditioning")["class_type"] == "Flux2KleinTextEncode"
    assert _source(wf, apply, "vae")["class_type"] == "Flux2KleinVAELoader"
    loader = _source(wf, apply, "control_net")
    assert loader["inputs"]["control_net_name"] == "FLUX.2-dev-Fun-Controlnet-Union-2602.safetensors"
    control_map = apply["inputs"]["control_image"]
    assert wf[control_map[0]]["class_type"] == "LoadImage" and control_map[1] == 0
    assert wf[control_map[0]]["_meta"]["title"] == "Control map (pose)"
    images = client.nodes_of_type(wf, "LoadImage")
    assert images[0] == control_map[0]  # the client's first --image is the map
    note = details(name)
    assert "preprocessor" in note and "0.65-0.80" in note and "--image pose.png" in note
    (save,) = [n for n in wf.values() if n["class_type"] == "SaveImage"]
    if name == "flux2_dev_controlnet_pose":
        assert (s["width"], s["height"], "latent" in s) == (0, 0, False)  # the map's aspect, about 1 MP
        assert "mask" not in apply["inputs"] and "image" not in apply["inputs"] and len(images) == 1
        assert _link(wf, save, "images") == ("Flux2KleinDecode", 0)
        return
    (image,) = images[1:]
    assert apply["inputs"]["image"] == [image, 0] and apply["inputs"]["mask"] == [image, 1]
    prepare = _source(wf, sampler, "latent")
    assert prepare["class_type"] == "Flux2KleinInpaintPrepare"
    assert prepare["inputs"]["image"] == [image, 0] and prepare["inputs"]["mask"] == [image, 1]
    assert (s["width"], s["height"], s["denoise"]) == (0, 0, 1.0)
    assert _link(wf, save, "images") == ("Flux2KleinComposite", 0)
    assert "--image pose.png --image image.png" in note and "MaskEditor" in note_of(name)


@pytest.mark.parametrize("name", CONTROL_NAMES)
def test_control_workflows_take_the_clients_prompt_map_and_image(name):
    """Headless, the prompt reaches the text encode behind Apply ControlNet, the first image is the map."""
    wf = api(name)
    names = ["map.png", "photo.png"][: len(client.nodes_of_type(wf, "LoadImage"))]
    patched = client.prepare_workflow(wf, images=names, prompt="a headless prompt", seed=9)
    apply = _source(patched, _sampler(patched), "positive")
    assert _source(patched, apply, "conditioning")["inputs"]["text"] == "a headless prompt"
    assert _source(patched, apply, "control_image")["inputs"]["image"] == "map.png"
    assert _sampler(patched)["inputs"]["seed"] == 9


def test_the_reference_strength_workflow_gives_its_references_different_strengths():
    wf = api("flux2_klein_4b_edit_reference_strength")
    encodes = sorted((n for n in wf.values() if n["class_type"] == "Flux2KleinReferenceEncode"),
                     key=lambda n: "references" in n["inputs"])  # fmt: skip
    weights = [(n["inputs"]["strength"], n["inputs"]["start"], n["inputs"]["end"]) for n in encodes]
    assert weights == [(1.0, 0.0, 1.0), (0.5, 0.0, 0.75)]


def test_the_regional_workflow_chains_two_regions_onto_the_global_prompt():
    wf = api("flux2_klein_4b_regional_prompt")
    sampler = _sampler(wf)
    last = wf[sampler["inputs"]["positive"][0]]
    first = wf[last["inputs"]["conditioning"][0]]
    assert last["class_type"] == first["class_type"] == "Flux2KleinRegionalPrompt"
    assert wf[first["inputs"]["conditioning"][0]]["class_type"] == "Flux2KleinTextEncode"
    masks = {wf[n["inputs"]["mask"][0]]["class_type"] for n in (first, last)}
    assert masks == {"MaskComposite", "InvertMask"}


def test_the_regional_edit_workflow_wires_regions_and_a_reference_into_one_sampler():
    wf = api("flux2_klein_4b_regional_edit")
    sampler = _sampler(wf)
    last = wf[sampler["inputs"]["positive"][0]]
    first = wf[last["inputs"]["conditioning"][0]]
    assert last["class_type"] == first["class_type"] == "Flux2KleinRegionalPrompt"
    assert wf[first["inputs"]["conditioning"][0]]["class_type"] == "Flux2KleinTextEncode"
    assert {wf[n["inputs"]["mask"][0]]["class_type"] for n in (first, last)} == {
        "MaskComposite",
        "InvertMask",
    }
    reference = _source(wf, sampler, "references")
    assert reference["class_type"] == "Flux2KleinReferenceEncode" and "references" not in reference["inputs"]
    assert _source(wf, reference, "image")["class_type"] == "LoadImage"
    assert (sampler["inputs"]["width"], sampler["inputs"]["height"]) == (0, 0)  # the photo's size


def _builder(module: str):
    """A module of the workflow builder (``scripts/workflow_builder``), imported as its script does."""
    import importlib

    sys.path.insert(0, str(REPO / "scripts"))
    try:
        return importlib.import_module(f"workflow_builder.{module}")
    finally:
        sys.path.remove(str(REPO / "scripts"))


def _drawn_boxes(wf: dict) -> tuple[list, list]:
    """Node boxes (title bar above pos, as the classic canvas draws it: the stored height enlarged to every
    widget's row, recorded from the real editor) and group boxes, as (x0, y0, x1, y1)."""
    MIN_SIZES = _builder("sizes").MIN_SIZES
    nodes = [(n["pos"][0], n["pos"][1] - 30, n["pos"][0] + n["size"][0],
              n["pos"][1] + max(n["size"][1], MIN_SIZES.get(n["type"], (0, 0))[1]))
             for n in wf["nodes"]]  # fmt: skip
    groups = [(g["bounding"][0], g["bounding"][1], g["bounding"][0] + g["bounding"][2],
               g["bounding"][1] + g["bounding"][3]) for g in wf["groups"]]  # fmt: skip
    return nodes, groups


def _touch(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


@pytest.mark.parametrize("name", NAMES, ids=str)
def test_the_layout_holds_at_the_sizes_the_editor_draws(name):
    # every node at least as wide as the editor draws it on the classic canvas and in Nodes 2.0 (both
    # recorded from the real editor) and as tall as Nodes 2.0 draws it (the classic canvas enlarges it to
    # every widget's row on opening: the boxes below count that), none touching another, no two groups
    # touching, no node inside a group it is not in, every group title inside its group
    sizes = _builder("sizes")
    MIN_SIZES, TITLE_HEIGHT, VUE_SIZES = sizes.MIN_SIZES, sizes.TITLE_HEIGHT, sizes.VUE_SIZES
    wf = editor(name)
    for n in wf["nodes"]:
        least, vue = MIN_SIZES[n["type"]], VUE_SIZES[n["type"]]
        assert n["size"][0] >= least[0], (name, n["type"])
        assert n["size"][0] >= vue[0] and n["size"][1] + TITLE_HEIGHT >= vue[1], (
            name,
            n["type"],
            "Nodes 2.0",
        )
    nodes, groups = _drawn_boxes(wf)
    assert not [(i, j) for i in range(len(nodes)) for j in range(i) if _touch(nodes[i], nodes[j])], name
    assert not [(i, j) for i in range(len(groups)) for j in range(i) if _touch(groups[i], groups[j])], name
    for g, box in zip(wf["groups"], groups):
        inside = [n for n, nb in zip(wf["nodes"], nodes) if _touch(box, nb)]
        members = [n for n, nb in zip(wf["nodes"], nodes) if box[0] <= nb[0] and nb[2] <= box[2]
                   and box[1] <= nb[1] and nb[3] <= box[3]]  # fmt: skip
        assert inside == members, f"{name}: a node reaches into group {g['title']!r} without being in it"
        assert sizes.title_width(g["title"]) < box[2] - box[0], (name, g["title"])


@pytest.mark.parametrize("name", NAMES, ids=str)
def test_every_node_is_as_wide_as_its_texts_and_shows_what_it_sets(name):
    # as wide as its title, labels and values need uncut on the classic canvas and its combos' values in Nodes
    # 2.0 (from the editor's recorded font advances; the real editor's check is
    # tests/integration/test_frontend_text.py), and a node that sets an advanced input away from its default
    # opens with its advanced inputs shown
    NODE_DOCS = _builder("schemas").NODE_DOCS
    sizes = _builder("sizes")
    text_width, text_width_needed = sizes.text_width, sizes.text_width_needed
    assert text_width("model_name") < text_width("model_name: flux-2-klein-4b.safetensors")
    for n in editor(name)["nodes"]:
        values = {} if n["type"] == "MarkdownNote" else editor_widget_values(n)
        need = text_width_needed(n["type"], values, n.get("title"))
        assert n["size"][0] >= need > 60, (name, n["type"], n["size"][0], need)
        doc = NODE_DOCS.get(n["type"])
        if doc is not None:
            sets = [
                i.name for i in doc.inputs if i.advanced and i.name in values and values[i.name] != i.default
            ]
            assert bool(n.get("showAdvanced")) == bool(sets), (name, n["type"], sets)


def test_the_high_resolution_workflows():
    """4 MP in one pass: position extrapolation on, a tiled decode. Upscale: Lanczos 2x, then Tiled Refine
    of the enlarged image with the prompt and the VAE, then a tiled decode."""
    wf = api("flux2_klein_4b_text_to_image_4mp")
    sampler = _sampler(wf)
    assert sampler["inputs"]["position_extrapolation"] == "dype"
    (save,) = [n for n in wf.values() if n["class_type"] == "SaveImage"]
    assert _source(wf, save, "images")["inputs"]["tile_size"] == 1024
    wf = api("flux2_klein_4b_upscale_2x")
    (refine,) = [n for n in wf.values() if n["class_type"] == "Flux2KleinTiledRefine"]
    scale = _source(wf, refine, "image")
    assert scale["class_type"] == "ImageScaleBy" and scale["inputs"]["upscale_method"] == "lanczos"
    assert scale["inputs"]["scale_by"] == 2.0 and _source(wf, scale, "image")["class_type"] == "LoadImage"
    assert _source(wf, refine, "positive")["class_type"] == "Flux2KleinTextEncode"
    assert _source(wf, refine, "vae")["class_type"] == "Flux2KleinVAELoader"
    assert (refine["inputs"]["tile_size"], refine["inputs"]["tile_overlap"]) == (1024, 128)
    (save,) = [n for n in wf.values() if n["class_type"] == "SaveImage"]
    decode = _source(wf, save, "images")
    assert decode["inputs"]["tile_size"] == 1024 and _source(wf, decode, "latent") is refine


# ---------------------------------------------------------------------------------------------------------
# The template browser: readable on opening, the first-run workflows first and found


LOW_QUALITY_THRESHOLD = 8 / 14  # the editor draws text from this scale up (8 px of its 14 px node text)
FIRST_RUN = ["flux2_klein_4b_text_to_image", "flux2_klein_4b_edit", *ALIASES]


def _fitted_scale(wf: dict, window: tuple[int, int]) -> float:
    """The scale the editor opens a template at from the template browser: its fitView (the nodes' boxes,
    title bars included, plus 10 px; 0.75 of the scale that fills the window, each side at least 300 px)."""
    nodes, _ = _drawn_boxes(wf)
    width = max(b[2] for b in nodes) - min(b[0] for b in nodes) + 20
    height = max(b[3] for b in nodes) - min(b[1] for b in nodes) + 20
    return 0.75 * min(window[0] / max(width, 300), window[1] / max(height, 300))


@pytest.mark.parametrize("name", FILES, ids=str)
def test_every_template_opens_with_its_text_drawn(name):
    # the layout as the editor fits it (the real editor's scale: tests/integration/test_frontend_templates.py)
    windows = [(1920, 1080)] + ([(1366, 768)] if name in FIRST_RUN else [])
    for window in windows:
        scale = _fitted_scale(editor(name), window)
        assert scale >= LOW_QUALITY_THRESHOLD * 1.04, f"{name} opens at {scale:.3f} in a {window} window"


@pytest.mark.parametrize("alias", ALIASES)
def test_the_first_run_workflows_second_names_are_the_same_graphs(alias):
    original, copy = editor(ALIASES[alias]), editor(alias)
    assert copy["id"] != original["id"]
    assert {**copy, "id": original["id"]} == original
    assert not (
        API / f"{alias}.json"
    ).exists()  # headless, the original's name: workflows/api/<original>.json


def test_the_first_run_workflows_sort_first_and_hold_the_words_users_type():
    names = [p.stem for p in WORKFLOWS.glob("*.json")]
    # NTFS lists a folder by the upper-cased names' code units; the editor's A-Z sorts as Unicode collation
    # does, where punctuation comes before digits: both put "FLUX.2 ..." before "flux1_..." and "flux2_..."
    assert sorted(names, key=str.upper)[:2] == sorted(ALIASES, key=str.upper)
    assert "klein text to image" in "FLUX.2 klein text to image".lower()
    assert [a for a in ALIASES if "klein edit" in a.lower()] == ["FLUX.2 klein edit"]
    assert [a for a in ALIASES if "klein text to image" in a.lower()] == ["FLUX.2 klein text to image"]


def test_the_template_order_puts_the_first_run_workflows_first_and_each_card_once():
    script = (REPO / "web" / "template_order.js").read_text(encoding="utf-8")
    order = json.loads(script.split("const ORDER = ", 1)[1].split(";", 1)[0])
    hidden = json.loads(script.split("const HIDDEN = new Set(", 1)[1].split(");", 1)[0])
    assert order[:2] == ["FLUX.2 klein text to image", "FLUX.2 klein edit"]
    assert sorted(hidden) == sorted(ALIASES.values())
    assert sorted(order) == sorted(set(FILES) - set(hidden)) and len(order) == len(set(order))


def test_the_notes_are_short_and_the_docs_say_the_rest():
    for name in FILES:
        note = note_of(name)
        assert len(note.splitlines()) <= 16, f"{name}: the note runs to {len(note.splitlines())} lines"
        assert "`docs/workflows.md`" in note
    text = DETAILS.read_text(encoding="utf-8")
    for name in NAMES:
        title = note_of(name).splitlines()[0].removeprefix("# ")
        assert f"## {title}\n\n`workflows/{name}.json`" in text
        assert f"`workflows/api/{name}.json`" in details(name)
