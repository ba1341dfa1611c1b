"""The ComfyUI node layer on a fake host (tests/comfy_stubs.py) and tiny random models, on the CPU.

The pack is imported the way ComfyUI imports a custom-node folder; the fake host modules live in sys.modules
only while this file's tests run.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest
import torch
from comfy_stubs import (
    REPO_ROOT,
    FakeHost,
    InterruptProcessingException,
    load_pack,
    pack_module_name,
    unload_pack,
)
from node_contract import KLEIN_NODES, contract_mismatches
from quant_files import write_gguf
from safetensors.torch import save_file
from tiny_dit import bfl_state_dict, make_diffusers_dit, write_bfl_file
from tiny_flux1 import make_tiny_clip, make_tiny_t5, write_clip_file, write_t5_file
from tiny_mistral import TINY_TEXT, TINY_TEXT_HEAD_128, make_tiny_mistral3, v7_tekken_json
from tiny_mistral import write_comfy_file as write_mistral_file
from tiny_text import make_tiny_qwen3, write_comfy_file
from tiny_vae import TINY_VAE, random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

# Native ids our ids could be confused with; a custom id equal to a native one is silently dropped by ComfyUI.
NATIVE_IDS = {
    "EmptyFlux2LatentImage", "Flux2Scheduler", "FluxKVCache", "ReferenceLatent", "FluxGuidance",
    "FluxKontextMultiReferenceLatentMethod", "CLIPTextEncodeFlux", "UNETLoader", "CLIPLoader", "VAELoader",
    "VAEDecode", "VAEEncode", "KSampler", "SamplerCustomAdvanced", "CLIPTextEncode", "EmptyLatentImage",
}  # fmt: skip
TEXT_WIDTH = 3 * 32  # tiny Qwen3: hidden 32, three hidden states per token
DEV_TEXT_WIDTH = 3 * TINY_TEXT["hidden_size"]  # tiny Mistral: hidden 16, hidden states 10/20/30 per token


@pytest.fixture(scope="module")
def fake_host(tmp_path_factory):
    root = tmp_path_factory.mktemp("comfy_models")
    host = FakeHost(root)
    for folder in host.folders:
        host.folder(folder).mkdir()
    dit = make_diffusers_dit(joint_attention_dim=TEXT_WIDTH)
    write_bfl_file(dit, host.folder("diffusion_models") / "klein_tiny.safetensors")
    write_bfl_file(dit, host.folder("diffusion_models") / "klein_tiny_base.safetensors")
    write_bfl_file(make_diffusers_dit(), host.folder("diffusion_models") / "klein_tiny_text24.safetensors")
    write_bfl_file(dit, root / "outside.safetensors")  # reachable only through "../"
    write_comfy_file(make_tiny_qwen3(), host.folder("text_encoders") / "qwen_tiny.safetensors")
    # FLUX.2 [dev]: a DiT with the guidance embedder, reading the tiny Mistral's width; the Mistral file as
    # ComfyUI ships it (no config.json, so Mistral Small's head size 128; its Tekken tokenizer inside)
    dev = make_diffusers_dit(seed=11, guidance_embeds=True, joint_attention_dim=DEV_TEXT_WIDTH)
    write_bfl_file(dev, host.folder("diffusion_models") / "flux2_dev_tiny.safetensors")
    heads = {k: TINY_TEXT_HEAD_128[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")}
    write_mistral_file(make_tiny_mistral3(seed=12, **heads), host.folder("text_encoders") /
                       "mistral_tiny.safetensors", v7_tekken_json(), layers=30, lm_head=False)  # fmt: skip
    # FLUX.1's text encoders, which the FLUX.2 text-encoder loader must refuse by name
    write_t5_file(make_tiny_t5(), host.folder("text_encoders") / "t5xxl_tiny.safetensors")
    write_clip_file(make_tiny_clip(), host.folder("text_encoders") / "clip_l_tiny.safetensors")
    write_vae_file(random_vae_state_dict(TINY_VAE), host.folder("vae") / "flux2_tiny_vae.safetensors")
    _write_lora(dit, host.folder("loras") / "tiny_lora.safetensors")
    sd = bfl_state_dict(dit)
    write_gguf(sd, host.folder("diffusion_models") / "klein_tiny-Q8_0.gguf", "flux",
               {k: "Q8_0" for k in sd if sd[k].ndim == 2 and sd[k].shape[1] % 32 == 0})  # fmt: skip
    with host.installed():
        try:
            yield host
        finally:
            unload_pack()


@pytest.fixture(scope="module")
def pack(fake_host):
    return load_pack()


@pytest.fixture
def host(fake_host):
    fake_host.reset()
    yield fake_host
    fake_host.reset()


@pytest.fixture(scope="module")
def nodes(pack):
    return {node_id: cls() for node_id, cls in pack.NODE_CLASS_MAPPINGS.items()}


@pytest.fixture(scope="module")
def Flux2Error(pack):
    return sys.modules[f"{pack.__name__}.flux2_core.errors"].Flux2Error


@pytest.fixture(scope="module")
def loaded(nodes, fake_host):
    """Tiny model, text encoder and VAE through the loader nodes, with two encoded prompts."""
    (model,) = nodes["Flux2KleinModelLoader"].load("klein_tiny.safetensors", "auto")
    (encoder,) = nodes["Flux2KleinTextEncoderLoader"].load("qwen_tiny.safetensors")
    (vae,) = nodes["Flux2KleinVAELoader"].load("flux2_tiny_vae.safetensors")
    (positive,) = nodes["Flux2KleinTextEncode"].encode(encoder, "a red apple on a table")
    (negative,) = nodes["Flux2KleinTextEncode"].encode(encoder, "")
    return dict(model=model, encoder=encoder, vae=vae, positive=positive, negative=negative)


def image(height: int, width: int, batch: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.rand(batch, height, width, 3, generator=torch.Generator().manual_seed(seed))


def run_sampler(nodes, loaded, **overrides):
    args = dict(model=loaded["model"], positive=loaded["positive"], seed=7, steps=2, guidance=1.0,
                width=64, height=64, batch_size=1)  # fmt: skip
    return nodes["Flux2KleinSampler"].sample(**{**args, **overrides})[0]["samples"]


def core_module(pack, name: str = ""):
    """The pack's own ``flux2_core`` (or one of its modules), as imported under the pack's name."""
    return sys.modules[f"{pack.__name__}.flux2_core" + (f".{name}" if name else "")]


def with_noise_item(pack, batch_size: int, k: int, run):
    """``run()`` with the sampler's noise for a batch of one replaced by item ``k`` of the noise a batch of
    ``batch_size`` draws from the same seed (``flow.make_noise``: one ``randn`` of [B, 128, h, w] from the
    seeded CPU generator, so item k of a batch is that slice)."""
    sampling = core_module(pack, "sampling")
    draw = sampling.make_noise

    def item(batch, height, width, seed, *rest):
        assert batch == 1
        return draw(batch_size, height, width, seed, *rest)[k : k + 1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sampling, "make_noise", item)
        return run()


def capture_start(pack, run):
    """(``run()``'s result, the latent the Euler loop started from, the sigmas it ran), by wrapping the
    core's ``flow.euler`` as ``sampling.sample`` calls it."""
    sampling = core_module(pack, "sampling")
    euler, seen = sampling.euler, []

    def recording(denoise, x, sigmas, *rest):
        seen.append((x.clone(), list(sigmas)))
        return euler(denoise, x, sigmas, *rest)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sampling, "euler", recording)
        out = run()
    ((start, sigmas),) = seen
    return out, start, sigmas


# -- registration and schemas ------------------------------------------------------------------------------


def test_the_nodes_follow_the_contract(pack):
    # the FLUX.2 nodes (the FLUX.1 Fill ones in test_nodes_fill.py) against tests/node_contract.py: ids,
    # display names, categories, every input's name, type and order, the seed's control, the outputs
    assert {i for i in pack.NODE_CLASS_MAPPINGS if i.startswith("Flux2Klein")} == set(KLEIN_NODES)
    assert set(pack.NODE_DISPLAY_NAME_MAPPINGS) == set(pack.NODE_CLASS_MAPPINGS)
    for node_id, node in KLEIN_NODES.items():
        cls = pack.NODE_CLASS_MAPPINGS[node_id]
        assert not contract_mismatches(node_id, cls, pack.NODE_DISPLAY_NAME_MAPPINGS[node_id]), node_id
        assert callable(getattr(cls, cls.FUNCTION)) and len(cls.OUTPUT_TOOLTIPS) == len(node.outputs)


def test_ids_are_prefixed_and_never_native(pack):
    ids = list(pack.NODE_CLASS_MAPPINGS)
    assert len(ids) == len(set(ids))
    assert all(node_id.startswith(("Flux2Klein", "Flux1Fill")) for node_id in ids)
    assert not set(ids) & NATIVE_IDS


def test_every_input_has_a_tooltip(pack):
    for node_id in KLEIN_NODES:
        spec = pack.NODE_CLASS_MAPPINGS[node_id].INPUT_TYPES()
        for name, (kind, options) in {**spec["required"], **spec.get("optional", {})}.items():
            assert options.get("tooltip"), f"{node_id}.{name} has no tooltip"
            assert isinstance(kind, list) or kind.isupper(), (node_id, name, kind)


def test_widgets(pack, fake_host):
    spec = {
        k: v
        for part in pack.NODE_CLASS_MAPPINGS["Flux2KleinSampler"].INPUT_TYPES().values()
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
    loader = pack.NODE_CLASS_MAPPINGS["Flux2KleinModelLoader"].INPUT_TYPES()
    names = ["klein_tiny.safetensors", "klein_tiny_base.safetensors", "klein_tiny_text24.safetensors",
             "flux2_dev_tiny.safetensors"]  # fmt: skip
    assert loader["required"]["model_name"][0] == sorted([*names, "klein_tiny-Q8_0.gguf"])
    assert loader["required"]["variant"][0] == ["auto", "distilled", "base", "kv", "dev"]
    assert loader["optional"]["weight_dtype"][0] == ["default", "bfloat16", "float16", "float32"]
    assert loader["optional"]["devices"][0] == "STRING" and loader["optional"]["devices"][1]["default"] == ""
    te = pack.NODE_CLASS_MAPPINGS["Flux2KleinTextEncoderLoader"].INPUT_TYPES()
    assert te["required"]["text_encoder_name"][0] == [
        "clip_l_tiny.safetensors", "mistral_tiny.safetensors", "qwen_tiny.safetensors",
        "t5xxl_tiny.safetensors",
    ]  # fmt: skip
    cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())]  # this machine's accelerators follow
    assert te["optional"]["device"][0][: 2 + len(cuda)] == ["default", "cpu", *cuda]
    assert pack.NODE_CLASS_MAPPINGS["Flux2KleinVAELoader"].INPUT_TYPES()["required"]["vae_name"][0] == [
        "flux2_tiny_vae.safetensors"
    ]
    text = pack.NODE_CLASS_MAPPINGS["Flux2KleinTextEncode"].INPUT_TYPES()["required"]["text"]
    assert text[0] == "STRING" and text[1]["multiline"] is True and text[1]["dynamicPrompts"] is False
    ref = pack.NODE_CLASS_MAPPINGS["Flux2KleinReferenceEncode"].INPUT_TYPES()["optional"]["max_megapixels"]
    assert ref[0] == "FLOAT" and ref[1]["default"] == 1.0
    assert "1024" in ref[1]["tooltip"]


def test_validate_inputs(pack):
    validate = pack.NODE_CLASS_MAPPINGS["Flux2KleinSampler"].VALIDATE_INPUTS
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
        assert pack.NODE_CLASS_MAPPINGS == {} and pack.NODE_DISPLAY_NAME_MAPPINGS == {}
        heavy = [m for m in ("torch", "transformers", "comfy", NAME + ".nodes") if m in sys.modules]
        assert not heavy, heavy
        """
    )
    names = (
        f"NAME, INIT, ROOT = {pack_module_name()!r}, {str(REPO_ROOT / '__init__.py')!r}, {str(REPO_ROOT)!r}"
    )
    result = subprocess.run([sys.executable, "-c", names + code], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stderr


# -- loaders -------------------------------------------------------------------------------------------------


def test_loaders_wrap_the_core_modules_in_patchers(loaded, fake_host):
    model, encoder, vae = loaded["model"], loaded["encoder"], loaded["vae"]
    assert model.patcher.model.module is model.model.transformer
    assert encoder.patcher.model.module is encoder.encoder.model
    assert vae.patcher.model.module is vae.vae
    assert model.model.variant.name == "distilled" and model.model.transformer.dtype == torch.float32
    assert model.patcher.size == sum(t.nbytes for t in model.model.transformer.state_dict().values())


def test_loader_dtype_and_variant_choice(nodes):
    (model,) = nodes["Flux2KleinModelLoader"].load("klein_tiny.safetensors", "kv", weight_dtype="bfloat16")
    assert model.model.variant.name == "kv" and model.model.transformer.dtype == torch.bfloat16
    (base,) = nodes["Flux2KleinModelLoader"].load("klein_tiny_base.safetensors", "auto")
    assert base.model.variant.name == "base"


def test_a_name_with_dotdot_is_never_opened(nodes, pack, monkeypatch, Flux2Error):
    loaders = sys.modules[f"{pack.__name__}.nodes.loaders"]
    opened = []
    monkeypatch.setattr(loaders, "load_transformer", lambda path, **kw: opened.append(path))
    with pytest.raises(Flux2Error, match="not a file"):
        nodes["Flux2KleinModelLoader"].load("../outside.safetensors", "auto")
    with pytest.raises(Flux2Error, match="not a file"):
        nodes["Flux2KleinVAELoader"].load("../diffusion_models/klein_tiny.safetensors")
    assert opened == []


# -- conditioning --------------------------------------------------------------------------------------------


def test_text_encode_gives_cpu_conditioning_and_frees_the_encoder(nodes, loaded, host):
    (cond,) = nodes["Flux2KleinTextEncode"].encode(loaded["encoder"], "a cat")
    assert cond.embeds.shape == (1, 512, TEXT_WIDTH) and cond.embeds.dtype == torch.float32
    assert cond.embeds.device.type == "cpu" and cond.width == TEXT_WIDTH and cond.encoder_name
    patcher = loaded["encoder"].patcher
    assert host.loads == [(patcher, True)] and host.unloads == [patcher]
    native = cond.to_native()
    assert native[0][0] is cond.embeds and native[0][1] == {"pooled_output": None}


def test_reference_batch_and_chain_keep_order(nodes, loaded):
    encode = nodes["Flux2KleinReferenceEncode"].encode
    (first,) = encode(loaded["vae"], image(64, 128, batch=2))
    assert first.grid_sizes == [(4, 8), (4, 8)]
    (chained,) = encode(loaded["vae"], image(80, 64), references=first)
    assert chained.grid_sizes == [(4, 8), (4, 8), (5, 4)]
    torch.testing.assert_close(chained.tokens[:, : first.num_tokens], first.tokens)


def test_reference_pixel_cap(nodes, loaded):
    encode = nodes["Flux2KleinReferenceEncode"].encode
    (small,) = encode(loaded["vae"], image(200, 120), max_megapixels=0.0625)  # 0.0625 MP = 256 x 256 px
    assert small.pixel_size(0) == (112, 192)  # under the cap: only centre-cropped to multiples of 16
    (large,) = encode(loaded["vae"], image(512, 256), max_megapixels=0.0625)
    assert large.pixel_size(0) == (176, 352)  # 256 x 512 scaled by sqrt(1/2) to 181 x 362, cropped to /16


# -- sampling and decoding -----------------------------------------------------------------------------------


def test_end_to_end_chain(nodes, loaded, host):
    (refs,) = nodes["Flux2KleinReferenceEncode"].encode(loaded["vae"], image(64, 64))
    samples = run_sampler(nodes, loaded, references=refs, steps=3, width=64, height=80)
    assert samples.shape == (1, 128, 5, 4) and samples.dtype == torch.float32 and samples.device.type == "cpu"
    assert torch.isfinite(samples).all()
    assert [(value, total) for value, total, _ in host.progress] == [(1, 3), (2, 3), (3, 3)]
    assert all(preview == ("JPEG", (1, 128, 5, 4), 512) for _, _, preview in host.progress)
    assert (loaded["model"].patcher, True) in host.loads
    assert not any(b._forward_pre_hooks for b in loaded["model"].model.transformer.blocks())  # hooks removed
    (pixels,) = nodes["Flux2KleinDecode"].decode(loaded["vae"], {"samples": samples})
    assert pixels.shape == (1, 80, 64, 3) and pixels.dtype == torch.float32
    assert 0.0 <= pixels.min() and pixels.max() <= 1.0


def test_same_seed_same_latent_and_no_previews_when_off(nodes, loaded, host):
    first = run_sampler(nodes, loaded, seed=123)
    host.previews_enabled = False
    host.progress.clear()
    again = run_sampler(nodes, loaded, seed=123)
    torch.testing.assert_close(first, again, atol=0, rtol=0)
    assert [preview for _, _, preview in host.progress] == [None, None]
    assert not torch.equal(first, run_sampler(nodes, loaded, seed=124))


def test_decode_is_vae_decode_mapped_to_0_1(nodes, loaded):
    latent = torch.randn(2, 128, 4, 3, generator=torch.Generator().manual_seed(1))
    (pixels,) = nodes["Flux2KleinDecode"].decode(loaded["vae"], {"samples": latent})
    expected = ((loaded["vae"].vae.decode(latent) + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1)
    torch.testing.assert_close(pixels, expected)


def test_decode_rejects_a_non_flux2_latent(nodes, loaded, Flux2Error):
    with pytest.raises(Flux2Error, match="FLUX.2 latent"):
        nodes["Flux2KleinDecode"].decode(loaded["vae"], {"samples": torch.zeros(1, 16, 8, 8)})


def test_width_zero_takes_the_reference_size(nodes, loaded):
    (refs,) = nodes["Flux2KleinReferenceEncode"].encode(loaded["vae"], image(80, 112))
    assert run_sampler(nodes, loaded, references=refs, width=0, height=0, steps=1).shape == (1, 128, 5, 7)
    assert run_sampler(nodes, loaded, references=refs, width=64, height=0, steps=1).shape == (1, 128, 5, 4)


def test_width_zero_without_references_is_1024(pack):
    convert = sys.modules[f"{pack.__name__}.nodes.convert"]
    assert convert.output_size(0, 0, 2) == (1024, 1024, 2)


def test_native_latent_sets_size_and_batch(nodes, loaded):
    latent = {"samples": torch.full((2, 128, 4, 6), 5.0)}  # like EmptyFlux2LatentImage(96, 64, 2)
    samples = run_sampler(nodes, loaded, latent=latent, width=1024, height=1024, batch_size=1, steps=1)
    assert samples.shape == (2, 128, 4, 6)
    plain = run_sampler(nodes, loaded, width=96, height=64, batch_size=2, steps=1)
    torch.testing.assert_close(samples, plain, atol=0, rtol=0)  # content ignored: pure noise either way


def test_interrupt_before_the_run(nodes, loaded, host):
    host.interrupted = True
    with pytest.raises(InterruptProcessingException):
        run_sampler(nodes, loaded, steps=4)
    assert host.progress == []
    assert not any(b._forward_pre_hooks for b in loaded["model"].model.transformer.blocks())


def test_interrupt_during_the_run_stops_it(nodes, loaded, host):
    host.on_progress = lambda value, total: setattr(host, "interrupted", value == 2)
    with pytest.raises(BaseException) as caught:
        run_sampler(nodes, loaded, steps=4)
    assert caught.type is InterruptProcessingException and not isinstance(caught.value, Exception)
    assert [value for value, _, _ in host.progress] == [1, 2]


def test_wrong_text_encoder_for_the_model(nodes, loaded, Flux2Error):
    (model,) = nodes["Flux2KleinModelLoader"].load("klein_tiny_text24.safetensors", "distilled")
    with pytest.raises(Flux2Error, match="needs") as caught:
        run_sampler(nodes, loaded, model=model, steps=1)
    assert "24" in str(caught.value) and str(TEXT_WIDTH) in str(caught.value)


def test_base_model_guidance_needs_a_negative(nodes, loaded, host, Flux2Error):
    (base,) = nodes["Flux2KleinModelLoader"].load("klein_tiny_base.safetensors", "auto")
    with pytest.raises(Flux2Error, match="negative"):
        run_sampler(nodes, loaded, model=base, guidance=4.0, steps=1)
    with_cfg = run_sampler(nodes, loaded, model=base, guidance=4.0, negative=loaded["negative"], steps=1)
    without = run_sampler(nodes, loaded, model=base, guidance=1.0, steps=1)
    assert with_cfg.shape == without.shape and not torch.equal(with_cfg, without)


def test_kv_model_with_references_is_the_core_kv_run(nodes, loaded, pack):
    """The node gives the KV model, prompt, seed, size and references to the core unchanged, and its K/V from
    the store are the ones the core computes itself (the core's KV run is checked against diffusers'
    Flux2KleinKVPipeline in test_pipeline_parity.py)."""
    core = core_module(pack)
    (kv,) = nodes["Flux2KleinModelLoader"].load("klein_tiny.safetensors", "kv")
    (refs,) = nodes["Flux2KleinReferenceEncode"].encode(loaded["vae"], image(64, 64))
    samples = run_sampler(nodes, loaded, model=kv, references=refs, steps=2)
    settings = core.SampleSettings(64, 64, 2, 1.0, 7, 1)  # run_sampler's size, steps, guidance and seed
    request = core.SampleRequest(kv.model, loaded["positive"].embeds, settings, references=refs)
    expected = core.sample(request)  # no cache given
    assert samples.shape == (1, 128, 4, 4) and torch.equal(samples, expected)
    # controls: the references matter, and the KV attention is not the plain models' joint attention
    assert not torch.equal(samples, run_sampler(nodes, loaded, model=kv, steps=2))
    assert not torch.equal(samples, run_sampler(nodes, loaded, references=refs, steps=2))


def test_sampler_rejects_a_bad_size_at_run_time(nodes, loaded, Flux2Error):
    with pytest.raises(Flux2Error, match="multiple of 16"):
        run_sampler(nodes, loaded, latent={"samples": torch.zeros(1, 128, 2, 2)})  # 32 x 32 px


def test_linked_values_out_of_range_are_node_errors(nodes, loaded, host, Flux2Error):
    # A value from a linked node skips ComfyUI's widget ranges; the sampler checks it before loading.
    with pytest.raises(Flux2Error, match="steps is 1000: use 1 to 200"):
        run_sampler(nodes, loaded, steps=1000)
    with pytest.raises(Flux2Error, match="seed -5 is out of range"):
        run_sampler(nodes, loaded, seed=-5)
    assert host.loads == []


def test_a_run_that_cannot_fit_is_refused_before_sampling_and_the_next_one_runs(
    nodes, loaded, host, Flux2Error
):
    expected = run_sampler(nodes, loaded, width=96, height=64)
    host.free_memory = 1024**2
    host.progress.clear()
    with pytest.raises(Flux2Error, match=r"sampling 96x64 needs about .* GB but CPU memory has 0.0 GB free"):
        run_sampler(nodes, loaded, width=96, height=64)
    assert host.progress == []  # no step ran
    host.free_memory = 64 * 1024**3
    torch.testing.assert_close(run_sampler(nodes, loaded, width=96, height=64), expected, atol=0, rtol=0)


def test_an_empty_folder_says_so_in_the_list_and_the_loader_names_the_file_and_its_link(
    nodes, pack, fake_host, Flux2Error
):
    folder = fake_host.folder("vae")
    aside = folder.parent / "aside"
    aside.mkdir(exist_ok=True)
    moved = [f.rename(aside / f.name) for f in list(folder.iterdir())]
    try:
        choices = pack.NODE_CLASS_MAPPINGS["Flux2KleinVAELoader"].INPUT_TYPES()["required"]["vae_name"][0]
        assert choices == ["(models/vae is empty: get flux2-vae.safetensors)"]
        link = "https://huggingface.co/Comfy-Org/flux2-dev/resolve/main/split_files/vae/flux2-vae.safetensors"
        with pytest.raises(
            Flux2Error, match="folder holds no model file: download flux2-vae.safetensors"
        ) as e:
            nodes["Flux2KleinVAELoader"].load(choices[0])
        assert link in str(e.value) and "into ComfyUI/models/vae/" in str(e.value)
    finally:
        for f in moved:
            f.rename(folder / f.name)
    assert pack.NODE_CLASS_MAPPINGS["Flux2KleinVAELoader"].INPUT_TYPES()["required"]["vae_name"][0] == [
        "flux2_tiny_vae.safetensors"
    ]


# -- editing ------------------------------------------------------------------------------------------------


def test_img2img_from_an_encoded_image(nodes, loaded, pack):
    (latent,) = nodes["Flux2KleinEncode"].encode(loaded["vae"], image(70, 100))  # cropped to 96 x 64
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
    latent, refs, stitch = nodes["Flux2KleinInpaintPrepare"].prepare(loaded["vae"], source, mask)
    assert latent["noise_mask"].shape == (1, 1, 80, 96) and len(refs) == 1  # the source is reference 1
    samples = run_sampler(nodes, loaded, latent=latent, references=refs, width=0, height=0)
    (decoded,) = nodes["Flux2KleinDecode"].decode(loaded["vae"], {"samples": samples})
    for feather in (0, 6):
        (out,) = nodes["Flux2KleinComposite"].composite(decoded, stitch, feather)
        assert out.shape == source.shape
        outside = mask[0] < 0.5
        assert torch.equal(out[0][outside], source[0][outside])
        assert not torch.equal(out[0][~outside], source[0][~outside])


def test_a_native_noise_mask_on_a_native_layout_latent_inpaints(nodes, loaded):
    (latent,) = nodes["Flux2KleinEncode"].encode(loaded["vae"], image(64, 64))
    native = {"samples": latent["samples"], "noise_mask": torch.zeros(1, 1, 64, 64)}  # SetLatentNoiseMask
    kept = run_sampler(nodes, loaded, latent=native)
    torch.testing.assert_close(kept, latent["samples"], atol=1e-5, rtol=0)  # nothing masked: kept as is


def test_outpaint_pad_gives_the_canvas_and_the_mask(nodes):
    canvas, mask = nodes["Flux2KleinOutpaintPad"].pad(image(64, 64), 0, 16, 32, 0, 8)
    assert canvas.shape == (1, 80, 96, 3) and mask.shape == (1, 80, 96)
    assert mask[0, :16].eq(1).all() and mask[0, 40, 64:].eq(1).all()  # the new areas
    assert mask[0, 40, :56].eq(0).all() and 0 < mask[0, 40, 60] < 1  # the ramp into the original edge


def test_reference_resize_keeps_the_whole_picture(nodes, loaded):
    (cropped,) = nodes["Flux2KleinReferenceEncode"].encode(loaded["vae"], image(70, 100))
    (resized,) = nodes["Flux2KleinReferenceEncode"].encode(loaded["vae"], image(70, 100), resize="resize")
    assert cropped.pixel_size(0) == (96, 64) and resized.pixel_size(0) == (96, 64)
    assert not torch.equal(cropped.tokens, resized.tokens)


def test_kv_cache_is_reused_across_runs_with_the_same_output(nodes, pack, loaded):
    sampler_module = sys.modules[f"{pack.__name__}.nodes.sampler"]
    store = sampler_module.KV_STORE
    store.clear()
    (kv_model,) = nodes["Flux2KleinModelLoader"].load("klein_tiny.safetensors", "kv")
    (refs,) = nodes["Flux2KleinReferenceEncode"].encode(loaded["vae"], image(64, 64, seed=1))
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
    (other,) = nodes["Flux2KleinReferenceEncode"].encode(loaded["vae"], image(64, 64, seed=2))
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
    latent, refs, _ = nodes["Flux2KleinInpaintPrepare"].prepare(loaded["vae"], source, mask)
    args = dict(model=loaded["model"], positive=loaded["positive"], seed=1, steps=2, guidance=1.0, width=0,
                height=0, batch_size=1, references=refs)  # fmt: skip
    (first,) = nodes["Flux2KleinSampler"].sample(**args, latent=latent)
    assert torch.equal(first["noise_mask"], latent["noise_mask"])
    (second,) = nodes["Flux2KleinSampler"].sample(**args, latent=first, denoise=0.5)
    assert torch.equal(second["noise_mask"], latent["noise_mask"])
    # the second pass is the core's inpaint of the first pass's latent, under the same mask, half the schedule
    packed_mask = core.latent_mask(latent["noise_mask"], (4, 4), 1)
    settings = core.SampleSettings(64, 64, 2, 1.0, 1)  # args' size (the latent's), steps, guidance, seed
    request = core.SampleRequest(loaded["model"].model, loaded["positive"].embeds, settings, references=refs,
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
    (latent,) = nodes["Flux2KleinEncode"].encode(loaded["vae"], image(64, 64, batch=2))
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


def _write_lora(dit, path):
    """ai-toolkit layout on two layers, plus one text-encoder key (kohya) for the tiny Qwen3."""
    g = torch.Generator().manual_seed(5)
    sd = bfl_state_dict(dit)
    tensors = {}
    for layer in ("double_blocks.0.img_attn.qkv", "single_blocks.1.linear1"):
        out, inp = sd[layer + ".weight"].shape
        tensors[f"diffusion_model.{layer}.lora_A.weight"] = torch.randn(4, inp, generator=g)
        tensors[f"diffusion_model.{layer}.lora_B.weight"] = torch.randn(out, 4, generator=g)
    tensors["lora_te_model_layers_0_self_attn_q_proj.lora_down.weight"] = torch.randn(4, 32, generator=g)
    tensors["lora_te_model_layers_0_self_attn_q_proj.lora_up.weight"] = torch.randn(32, 4, generator=g)
    save_file(tensors, str(path))


def test_lora_loader_applies_on_top_and_leaves_the_base_model_alone(nodes, loaded):
    plain = run_sampler(nodes, loaded)
    out = nodes["Flux2KleinLoraLoader"].load(loaded["model"], "tiny_lora.safetensors", 0.8)
    model, report, text_encoder = out["result"]
    assert out["ui"]["text"] == [report] and text_encoder is None
    # _write_lora's file: ai-toolkit names (diffusion_model. + lora_A/lora_B) on 2 layers of the tiny DiT
    # (hidden 32, 2 double + 2 single blocks, txt_in 96 wide), no .alpha (scale 1, on both: "(2)"), plus 1
    # kohya text-encoder module, not applied without a text encoder
    assert report.splitlines() == [
        "LoRA tiny_lora.safetensors: BFL / ai-toolkit (diffusion_model.), LoRA, for FLUX.2 DiT (32 wide, "
        "2+2 blocks, 96-wide text)",
        "  diffusion model: 2 of the file's 3 modules applied here (2 layers); scale 1 (no alpha) (2)",
        "  text encoder: 1 text encoder keys not applied (no text encoder connected)",
    ]
    with_lora = run_sampler(nodes, {**loaded, "model": model})
    assert (with_lora - plain).abs().max() > 1e-3
    assert torch.equal(run_sampler(nodes, loaded), plain)  # the input model is unchanged
    assert model.model.transformer is loaded["model"].model.transformer  # one copy of the weights
    chained = nodes["Flux2KleinLoraLoader"].load(model, "tiny_lora.safetensors", -0.8)["result"][0]
    torch.testing.assert_close(run_sampler(nodes, {**loaded, "model": chained}), plain)


def test_lora_loader_text_encoder_part_and_block_strengths(nodes, loaded, Flux2Error):
    loader = nodes["Flux2KleinLoraLoader"]
    _, _, encoder = loader.load(loaded["model"], "tiny_lora.safetensors", 1.0, "", loaded["encoder"])[
        "result"
    ]
    (changed,) = nodes["Flux2KleinTextEncode"].encode(encoder, "a red apple on a table")
    (again,) = nodes["Flux2KleinTextEncode"].encode(loaded["encoder"], "a red apple on a table")
    assert not torch.equal(changed.embeds, loaded["positive"].embeds)
    assert torch.equal(again.embeds, loaded["positive"].embeds)
    off = loader.load(loaded["model"], "tiny_lora.safetensors", 1.0, "double=0, single=0")["result"][0]
    assert torch.equal(run_sampler(nodes, {**loaded, "model": off}), run_sampler(nodes, loaded))
    message = loader.VALIDATE_INPUTS(block_strengths="double=lots")
    assert isinstance(message, str) and "double=lots" in message
    with pytest.raises(Flux2Error, match="out of range"):
        loader.load(loaded["model"], "tiny_lora.safetensors", 11.0)


def test_gguf_files_are_listed_and_load(nodes, loaded):
    choices = nodes["Flux2KleinModelLoader"].INPUT_TYPES()["required"]["model_name"][0]
    assert "klein_tiny-Q8_0.gguf" in choices and "klein_tiny.safetensors" in choices
    (model,) = nodes["Flux2KleinModelLoader"].load("klein_tiny-Q8_0.gguf", "distilled")
    assert model.model.transformer.double_blocks[0].img_attn.qkv.weight.dtype == torch.uint8
    out = run_sampler(nodes, {**loaded, "model": model})
    plain = run_sampler(nodes, loaded)
    assert ((out - plain).norm() / plain.norm()).item() < 0.1


# -- tiled VAE decode and encode (tile_size / tile_overlap) --------------------------------------------------


def _reserved(pack, monkeypatch):
    """Records the memory each node asks ComfyUI to keep free when it loads a model."""
    host_module = sys.modules[pack.__name__ + ".nodes.host"]
    reserved, load = [], host_module.load
    monkeypatch.setattr(
        host_module, "load", lambda patcher, memory=0: reserved.append(memory) or load(patcher, memory)
    )
    return reserved


def test_tile_inputs_are_optional_widgets(pack):
    for node_id in ("Flux2KleinDecode", "Flux2KleinReferenceEncode"):
        optional = pack.NODE_CLASS_MAPPINGS[node_id].INPUT_TYPES()["optional"]
        size = {k: optional["tile_size"][1][k] for k in ("default", "min", "max", "step")}
        assert optional["tile_size"][0] == "INT" and size == {"default": 0, "min": 0, "max": 8192, "step": 16}
        assert optional["tile_overlap"][1]["default"] == 64 and optional["tile_overlap"][1]["max"] == 512
        assert optional["tile_size"][1]["tooltip"] and optional["tile_overlap"][1]["tooltip"]


def test_decode_tiles_and_reserves_the_tiled_estimate(nodes, loaded, pack, monkeypatch, Flux2Error):
    reserved = _reserved(pack, monkeypatch)
    vae = loaded["vae"].vae
    latent = torch.randn(1, 128, 12, 12, generator=torch.Generator().manual_seed(4))
    (pixels,) = nodes["Flux2KleinDecode"].decode(loaded["vae"], {"samples": latent}, 128, 32)
    expected = ((vae.decode(latent, 128, 32) + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1)
    torch.testing.assert_close(pixels, expected)
    assert reserved == [vae.decode_memory(192, 192, 128, 32)] and reserved[0] < vae.decode_memory(192, 192)
    reserved.clear()
    nodes["Flux2KleinDecode"].decode(loaded["vae"], {"samples": latent})  # automatic: the untiled estimate
    assert reserved == [vae.decode_memory(192, 192)]
    with pytest.raises(Flux2Error, match="smaller than half the tile"):
        nodes["Flux2KleinDecode"].decode(loaded["vae"], {"samples": latent}, 128, 64)


def test_reference_encode_tiles_and_reserves_the_tiled_estimate(nodes, loaded, pack, monkeypatch):
    reserved = _reserved(pack, monkeypatch)
    vae = loaded["vae"].vae
    (refs,) = nodes["Flux2KleinReferenceEncode"].encode(loaded["vae"], image(192, 160), tile_size=128,
                                                         tile_overlap=32)  # fmt: skip
    pixels = (image(192, 160)[0].permute(2, 0, 1) * 2 - 1)[None]
    torch.testing.assert_close(refs.latents()[0], vae.encode(pixels, 128, 32))
    assert reserved == [vae.encode_memory(192, 160, 128, 32)] and reserved[0] < vae.encode_memory(192, 160)
    reserved.clear()
    (plain,) = nodes["Flux2KleinReferenceEncode"].encode(loaded["vae"], image(192, 160))
    torch.testing.assert_close(plain.latents()[0], vae.encode(pixels))
    assert reserved == [vae.encode_memory(192, 160)]


def test_model_loader_streams_blocks_with_the_same_result(nodes, loaded):
    (streamed,) = nodes["Flux2KleinModelLoader"].load(
        "klein_tiny.safetensors", "auto", "default", "stream", 0
    )
    net = streamed.model.transformer
    resident = sum(t.numel() for t in net.parameters())
    full = sum(t.numel() for t in loaded["model"].model.transformer.parameters())
    assert resident < 0.5 * full  # the patcher manages (and moves) only what stays resident
    assert torch.equal(run_sampler(nodes, {**loaded, "model": streamed}), run_sampler(nodes, loaded))


# -- FLUX.2 [dev]: the dev DiT and the Mistral encoder through the same nodes --------------------------------


@pytest.fixture(scope="module")
def dev(nodes, fake_host):
    """The tiny dev DiT (found by its guidance embedder) and the tiny Mistral (by its shapes), via the
    nodes."""
    (model,) = nodes["Flux2KleinModelLoader"].load("flux2_dev_tiny.safetensors", "auto")
    (encoder,) = nodes["Flux2KleinTextEncoderLoader"].load("mistral_tiny.safetensors")
    (positive,) = nodes["Flux2KleinTextEncode"].encode(encoder, "a red apple on a table")
    return dict(model=model, encoder=encoder, positive=positive)


def test_dev_model_and_mistral_encoder_load_through_the_nodes(dev):
    model, encoder, positive = dev["model"], dev["encoder"], dev["positive"]
    assert model.model.variant.name == "dev" and model.model.config.guidance_embed
    assert model.more_patchers == () and model.split == ""  # one device: one patcher, as for klein
    assert "Mistral" in encoder.encoder.name and encoder.patcher.model.module is encoder.encoder.model
    assert positive.embeds.shape == (1, 512, DEV_TEXT_WIDTH) and positive.width == DEV_TEXT_WIDTH
    assert "Mistral" in positive.encoder_name
    # the Tekken tokenizer ComfyUI's file carries is the one used (ComfyUI ships no Mistral vocabulary)
    assert encoder.encoder.tokenizer.source == "mistral_tiny.safetensors (tekken_model)"


def test_dev_sampling_embeds_the_guidance_and_equals_the_core_run(nodes, dev, loaded, pack, host):
    """The node passes prompt, seed, size and guidance to the core's sampler unchanged (the core's dev path
    is checked against diffusers' Flux2Pipeline in test_dev_parity.py), one pass per step."""
    core = sys.modules[f"{pack.__name__}.flux2_core"]
    args = dict(model=dev["model"], positive=dev["positive"], seed=5, steps=2, guidance=4.0, width=64,
                height=80, batch_size=1)  # fmt: skip
    (out,) = nodes["Flux2KleinSampler"].sample(**args)
    settings = core.SampleSettings(64, 80, 2, 4.0, 5, 1)
    expected = core.sample(core.SampleRequest(dev["model"].model, dev["positive"].embeds, settings))
    assert torch.equal(out["samples"], expected) and out["samples"].shape == (1, 128, 5, 4)
    assert [(v, t) for v, t, _ in host.progress] == [(1, 2), (2, 2)]
    (lower,) = nodes["Flux2KleinSampler"].sample(**{**args, "guidance": 2.0})
    assert not torch.equal(lower["samples"], out["samples"])  # the value reaches the guidance embedder
    # no CFG for dev: a negative prompt changes nothing
    (with_negative,) = nodes["Flux2KleinSampler"].sample(**args, negative=dev["positive"])
    assert torch.equal(with_negative["samples"], out["samples"])


def test_dev_with_qwen3_and_klein_with_mistral_are_refused_before_the_model_loads(
    nodes, dev, loaded, host, Flux2Error
):
    with pytest.raises(Flux2Error, match="needs the Mistral Small 3.x text encoder") as caught:
        run_sampler(nodes, loaded, model=dev["model"], positive=loaded["positive"])
    assert f"{DEV_TEXT_WIDTH}-wide" in str(caught.value) and f"gives {TEXT_WIDTH}" in str(caught.value)
    with pytest.raises(Flux2Error, match="needs a Qwen3 text encoder") as caught:
        run_sampler(nodes, loaded, positive=dev["positive"])
    assert f"{TEXT_WIDTH}-wide" in str(caught.value) and f"gives {DEV_TEXT_WIDTH}" in str(caught.value)
    assert host.loads == [] and host.progress == []  # neither model was moved, no step ran


@pytest.mark.parametrize(("name", "kind"), [("t5xxl_tiny.safetensors", "T5-XXL"),
                                            ("clip_l_tiny.safetensors", "CLIP-L")])  # fmt: skip
def test_a_flux1_text_encoder_in_the_flux2_loader_names_the_right_files(nodes, name, kind, Flux2Error):
    with pytest.raises(Flux2Error, match=f"{name} is {kind}, a FLUX.1 text encoder") as caught:
        nodes["Flux2KleinTextEncoderLoader"].load(name)
    message = str(caught.value)
    assert "mistral_3_small_flux2_bf16.safetensors" in message and "qwen_3_4b.safetensors" in message
    assert "FLUX.1 Fill [dev]'s text encoder loader" in message


def test_the_klein_lora_loader_refuses_a_dev_model(nodes, dev, Flux2Error):
    with pytest.raises(Flux2Error, match="is FLUX.2 \\[dev\\]: the FLUX.2 \\[klein\\] LoRA Loader"):
        nodes["Flux2KleinLoraLoader"].load(dev["model"], "tiny_lora.safetensors", 1.0)


# -- the block split across devices (devices), with two CPU "devices" standing in ----------------------------


def test_block_split_on_two_cpu_devices_is_bit_identical_and_loads_every_part(nodes, dev, host):
    loader = nodes["Flux2KleinModelLoader"]
    out = loader.load("flux2_dev_tiny.safetensors", "auto", devices="cpu, cpu")
    (split,) = out["result"]
    net = split.model.transformer
    assert len(split.patchers) == 2 and split.patchers[1] is split.more_patchers[0]
    # each patcher manages the modules placed on its device; together every weight, each exactly once
    held = [{id(p) for p in patcher.model.module.parameters()} for patcher in split.patchers]
    assert (
        held[0]
        and held[1]
        and not held[0] & held[1]
        and held[0] | held[1] == {id(p) for p in net.parameters()}
    )
    assert {id(p) for p in net.img_in.parameters()} <= held[0]  # the parts outside the blocks: first device
    last = net.blocks()[-1]
    assert {id(p) for p in last.parameters()} <= held[1]
    nbytes = [sum(t.nbytes for t in patcher.model.module.state_dict().values()) for patcher in split.patchers]
    assert [patcher.size for patcher in split.patchers] == nbytes
    # the memory per device: on the node and in the model
    assert out["ui"]["text"] == [split.split]
    on_second = [i for i, block in enumerate(net.blocks()) if {id(p) for p in block.parameters()} <= held[1]]
    assert on_second == list(range(on_second[0], len(net.blocks())))  # one contiguous run, to the end
    first = "block 0" if on_second[0] == 1 else f"blocks 0-{on_second[0] - 1}"
    second = f"blocks {on_second[0]}-{on_second[-1]}" if len(on_second) > 1 else f"block {on_second[0]}"
    assert split.split == (
        f"cpu: {first} and the rest, {nbytes[0] / 1e9:.2f} GB; cpu: {second}, {nbytes[1] / 1e9:.2f} GB"
    )
    assert all(block._forward_pre_hooks for block in net.blocks())  # inputs follow each block's weights

    args = dict(positive=dev["positive"], seed=9, steps=2, guidance=4.0, width=64, height=64, batch_size=1)
    host.loads.clear()
    (whole,) = nodes["Flux2KleinSampler"].sample(model=dev["model"], **args)
    (parts,) = nodes["Flux2KleinSampler"].sample(model=split, **args)
    assert torch.equal(parts["samples"], whole["samples"])
    assert host.loads[-2:] == [(split.patchers[0], True), (split.patchers[1], True)]  # both, fully, first


def test_devices_are_validated_with_clear_messages(nodes, pack, Flux2Error):
    loader = pack.NODE_CLASS_MAPPINGS["Flux2KleinModelLoader"]
    assert loader.VALIDATE_INPUTS(devices="") is True and loader.VALIDATE_INPUTS(devices=None) is True
    assert loader.VALIDATE_INPUTS(devices="cpu,cpu") is True
    assert "not a device name" in loader.VALIDATE_INPUTS(devices="gpu0,gpu1")
    missing = f"cuda:{torch.cuda.device_count()}"
    assert "does not exist" in loader.VALIDATE_INPUTS(devices=f"cpu,{missing}")
    with pytest.raises(Flux2Error, match="does not exist"):
        nodes["Flux2KleinModelLoader"].load("klein_tiny.safetensors", "auto", devices=missing)
    with pytest.raises(Flux2Error, match="devices and offload 'stream' cannot be combined"):
        nodes["Flux2KleinModelLoader"].load(
            "klein_tiny.safetensors", "auto", "default", "stream", 0, "cpu,cpu"
        )


def test_a_klein_model_splits_too_and_one_device_is_no_split(nodes, loaded):
    (split,) = nodes["Flux2KleinModelLoader"].load("klein_tiny.safetensors", "auto", devices="cpu,cpu")[
        "result"
    ]
    assert torch.equal(run_sampler(nodes, {**loaded, "model": split}), run_sampler(nodes, loaded))
    (one,) = nodes["Flux2KleinModelLoader"].load("klein_tiny.safetensors", "auto", devices="cpu")
    assert one.more_patchers == () and one.patcher.load_device == torch.device("cpu") and one.split == ""
    assert not any(block._forward_pre_hooks for block in one.model.transformer.blocks())


def test_text_encoder_on_a_device_of_its_own_stays_loaded(nodes, pack, dev, host, monkeypatch):
    # Two CUDA devices are pretended (nothing runs on them): the choice reaches ComfyUI's patcher.
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    choices = pack.NODE_CLASS_MAPPINGS["Flux2KleinTextEncoderLoader"].INPUT_TYPES()["optional"]["device"][0]
    assert choices[:4] == ["default", "cpu", "cuda:0", "cuda:1"]
    (encoder,) = nodes["Flux2KleinTextEncoderLoader"].load("mistral_tiny.safetensors", device="cuda:1")
    assert encoder.patcher.load_device == torch.device("cuda:1") and encoder.keep_loaded
    assert encoder.encoder.device == torch.device("cpu")  # built on the offload device, moved when used
    monkeypatch.undo()
    # kept loaded between prompts (shown on the CPU: the same encoder, marked to stay)
    resident = dataclasses.replace(dev["encoder"], keep_loaded=True)
    (cond,) = nodes["Flux2KleinTextEncode"].encode(resident, "a red apple on a table")
    assert host.loads == [(resident.patcher, True)] and host.unloads == []
    assert torch.equal(cond.embeds, dev["positive"].embeds)


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="moving activations between a GPU and the CPU needs a GPU"
)
def test_block_split_across_a_gpu_and_the_cpu_matches_the_gpu_alone(nodes, dev, monkeypatch, pack):
    """With a GPU: the first half of the blocks on cuda:0, the rest on the CPU (real moves both ways)."""
    (whole,) = nodes["Flux2KleinModelLoader"].load("flux2_dev_tiny.safetensors", "auto", devices="cuda:0")
    (split,) = nodes["Flux2KleinModelLoader"].load("flux2_dev_tiny.safetensors", "auto",
                                                   devices="cuda:0,cpu")["result"]  # fmt: skip
    args = dict(positive=dev["positive"], seed=9, steps=2, guidance=4.0, width=64, height=64, batch_size=1)
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        (a,) = nodes["Flux2KleinSampler"].sample(model=whole, **args)
        (b,) = nodes["Flux2KleinSampler"].sample(model=split, **args)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous
    blocks = split.model.transformer.blocks()
    assert next(blocks[0].parameters()).is_cuda and not next(blocks[-1].parameters()).is_cuda
    torch.testing.assert_close(b["samples"], a["samples"], rtol=0, atol=1e-4)


def test_the_step_cache_input_runs_the_cores_cache_and_says_what_it_did(nodes, loaded, pack):
    args = dict(model=loaded["model"], positive=loaded["positive"], seed=7, steps=8, guidance=1.0,
                width=64, height=64, batch_size=1)  # fmt: skip
    sampler = nodes["Flux2KleinSampler"]
    plain = sampler.sample(**args)
    assert isinstance(plain, tuple)  # 0, the default: no cache, nothing shown
    assert torch.equal(sampler.sample(**args, step_cache=0.0)[0]["samples"], plain[0]["samples"])
    shown = sampler.sample(**args, step_cache=1.0)  # random weights change by about 1 per step
    core = core_module(pack)
    cache = core.StepCache(1.0)
    expected = core.sample(core.SampleRequest(loaded["model"].model, loaded["positive"].embeds,
                           core.SampleSettings(64, 64, 8, 1.0, 7, 1), step_cache=cache))  # fmt: skip
    assert torch.equal(shown["result"][0]["samples"], expected)
    assert shown["ui"]["text"] == [cache.describe()] and 1 < cache.passes[0].full_steps < 8
    assert cache.describe().startswith("step cache 1: ") and cache.describe().endswith(
        " of 8 steps ran every block"
    )
