"""The FLUX.1 Fill [dev] nodes on a fake host (comfy_stubs.py) and tiny random files, on the CPU.

The files are the layouts users have (BFL and diffusers DiTs, a GGUF, ComfyUI's T5 / CLIP files, a FLUX.1
VAE), and the tokenizers are full-size CLIP / T5 vocabularies generated at test time
(tiny_flux1.py), laid out where a ComfyUI checkout has them, so the loader's host tokenizer lookup runs
as it does in ComfyUI.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from comfy_stubs import FakeHost, InterruptProcessingException, load_pack, pack_nodes, unload_pack
from node_contract import FILL_NODES, contract_mismatches
from quant_files import write_gguf
from tiny_dit import make_diffusers_dit
from tiny_dit import write_bfl_file as write_klein_dit
from tiny_flux1 import (
    CLIP_WIDTH,
    T5_WIDTH,
    fill_state_dict,
    make_tiny_clip,
    make_tiny_t5,
    write_clip_file,
    write_diffusers_fill_dit,
    write_fill_dit,
    write_flux1_vae,
    write_t5_file,
    write_tokenizer_folders,
)
from tiny_text import make_tiny_qwen3, write_comfy_file
from tiny_vae import TINY_VAE, random_vae_state_dict
from tiny_vae import write_bfl_file as write_flux2_vae

# Native ids of ComfyUI's own FLUX.1 Fill graphs; a custom id equal to a native one is silently dropped.
NATIVE_IDS = {
    "UNETLoader", "DualCLIPLoader", "CLIPLoader", "VAELoader", "CLIPTextEncode", "FluxGuidance",
    "InpaintModelConditioning", "DifferentialDiffusion", "KSampler", "VAEDecode", "VAEEncode",
    "ImagePadForOutpaint", "ModelSamplingFlux", "ConditioningZeroOut", "SetLatentNoiseMask",
}  # fmt: skip
PROMPT = "a wooden bench in a park"


@pytest.fixture(scope="module")
def fake_host(tmp_path_factory):
    root = tmp_path_factory.mktemp("comfy_fill")
    host = FakeHost(root / "models", comfy_dir=root / "ComfyUI" / "comfy")
    for folder in host.folders:
        host.folder(folder).mkdir(parents=True)
    write_tokenizer_folders(host.comfy_dir)
    dits, encoders, vaes = host.folder("diffusion_models"), host.folder("text_encoders"), host.folder("vae")
    write_fill_dit(dits / "fill_tiny.safetensors")
    write_fill_dit(dits / "fill_tiny_comfy.safetensors", prefix="model.diffusion_model.")
    write_diffusers_fill_dit(dits / "fill_tiny_diffusers.safetensors")
    sd = fill_state_dict()
    write_gguf(sd, dits / "fill_tiny-Q8_0.gguf", "flux",
               {k: "Q8_0" for k in sd if sd[k].ndim == 2 and sd[k].shape[1] % 32 == 0})  # fmt: skip
    write_klein_dit(make_diffusers_dit(), dits / "klein_tiny.safetensors")
    write_t5_file(make_tiny_t5(), encoders / "t5_tiny.safetensors")
    write_clip_file(make_tiny_clip(), encoders / "clip_tiny.safetensors")
    write_comfy_file(
        make_tiny_qwen3(num_hidden_layers=2, vocab_size=1024), encoders / "qwen_tiny.safetensors"
    )
    write_flux1_vae(vaes / "ae_tiny.safetensors")
    write_flux2_vae(random_vae_state_dict(TINY_VAE), vaes / "flux2_vae_tiny.safetensors")
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
    return pack_nodes(pack).classes


@pytest.fixture(scope="module")
def core(pack):
    """The pack's own ``flux2_core`` (imported under the pack's name, as in ComfyUI)."""
    return sys.modules[f"{pack.__name__}.flux2_core"]


@pytest.fixture(scope="module")
def Flux2Error(core):
    return core.Flux2Error


@pytest.fixture(scope="module")
def loaded(nodes, fake_host):
    (model,) = nodes["Flux1FillModelLoader"].execute("fill_tiny.safetensors")
    (encoder,) = nodes["Flux1FillTextEncoderLoader"].execute("t5_tiny.safetensors", "clip_tiny.safetensors")
    (vae,) = nodes["Flux1FillVAELoader"].execute("ae_tiny.safetensors")
    (positive,) = nodes["Flux1FillTextEncode"].execute(encoder, PROMPT)
    return dict(model=model, encoder=encoder, vae=vae, positive=positive)


def image(height: int, width: int, seed: int = 0) -> torch.Tensor:
    return torch.rand(1, height, width, 3, generator=torch.Generator().manual_seed(seed))


def box_mask(height: int, width: int, top: int, left: int, bottom: int, right: int, value: float = 1.0):
    mask = torch.zeros(1, height, width)
    mask[:, top:bottom, left:right] = value
    return mask


def run_sampler(nodes, loaded, source, mask, **overrides):
    args = dict(model=loaded["model"], positive=loaded["positive"], vae=loaded["vae"], image=source,
                mask=mask, seed=7, steps=2, guidance=30.0)  # fmt: skip
    latent, stitch = nodes["Flux1FillSampler"].execute(**{**args, **overrides})
    return latent, stitch


def fill_sampling(pack):
    """The pack's own ``flux2_core.flux1.sampling`` (the module ``sample_fill`` looks its helpers up in)."""
    return sys.modules[f"{pack.__name__}.flux2_core.flux1.sampling"]


# -- registration and schemas ------------------------------------------------------------------------------


def test_the_nodes_follow_the_contract(pack):
    # the FLUX.1 Fill nodes against tests/fixtures/node_contract.json: ids, display names, categories, every
    # input's name, type and order, the seed's control, the outputs
    for node_id, node in FILL_NODES.items():
        cls = pack_nodes(pack).classes[node_id]
        assert not contract_mismatches(node_id, cls, pack_nodes(pack).display_names[node_id]), node_id
        assert len(cls.OUTPUT_TOOLTIPS) == len(node.outputs)
        assert cls.DESCRIPTION


def test_ids_never_collide_with_native_ones(pack):
    fill = [node_id for node_id in pack_nodes(pack).classes if node_id.startswith("Flux1Fill")]
    assert sorted(fill) == sorted(FILL_NODES)
    assert not set(pack_nodes(pack).classes) & NATIVE_IDS


def test_every_input_has_a_tooltip(pack):
    for node_id in FILL_NODES:
        spec = pack_nodes(pack).classes[node_id].INPUT_TYPES()
        for name, (kind, options) in {**spec["required"], **spec.get("optional", {})}.items():
            assert options.get("tooltip"), f"{node_id}.{name} has no tooltip"
            assert isinstance(kind, list) or kind.isupper(), (node_id, name, kind)


def test_widgets(pack):
    classes = pack_nodes(pack).classes
    spec = {k: v for part in classes["Flux1FillSampler"].INPUT_TYPES().values() for k, v in part.items()}
    assert spec["seed"][1].items() >= {"min": 0, "max": 2**64 - 1, "control_after_generate": True}.items()
    assert (spec["steps"][1]["default"], spec["steps"][1]["min"], spec["steps"][1]["max"]) == (50, 1, 200)
    assert spec["guidance"][1].items() >= {"default": 30.0, "min": 0.0, "max": 100.0}.items()  # FluxGuidance
    assert spec["denoise"][1].items() >= {"default": 1.0, "min": 0.0, "max": 1.0}.items()
    assert (spec["grow_mask"][1]["default"], spec["crop_to_mask"][1]["default"]) == (0, False)
    assert spec["context"][1]["default"] == 64 and spec["batch_size"][1]["default"] == 1
    types = [spec[k][0] for k in ("model", "positive", "vae", "image", "mask")]
    assert types == ["FLUX1_FILL_MODEL", "FLUX1_FILL_CONDITIONING", "FLUX1_FILL_VAE", "IMAGE", "MASK"]
    loader = classes["Flux1FillModelLoader"].INPUT_TYPES()
    assert loader["required"]["model_name"][1]["options"] == [
        "fill_tiny-Q8_0.gguf", "fill_tiny.safetensors", "fill_tiny_comfy.safetensors",
        "fill_tiny_diffusers.safetensors", "klein_tiny.safetensors",
    ]  # fmt: skip
    assert loader["optional"]["weight_dtype"][1]["options"] == [
        "default",
        "bfloat16",
        "float32",
    ]  # no float16
    te = classes["Flux1FillTextEncoderLoader"].INPUT_TYPES()
    names = ["clip_tiny.safetensors", "qwen_tiny.safetensors", "t5_tiny.safetensors"]
    assert te["required"]["t5_name"][1]["options"] == te["required"]["clip_name"][1]["options"] == names
    assert te["optional"]["device"][1]["options"] == ["default", "cpu"]
    vae_names = classes["Flux1FillVAELoader"].INPUT_TYPES()["required"]["vae_name"][1]["options"]
    assert vae_names == ["ae_tiny.safetensors", "flux2_vae_tiny.safetensors"]
    decode = classes["Flux1FillDecode"].INPUT_TYPES()
    assert decode["required"]["latent"][0] == "LATENT" and decode["optional"]["tile_size"][1]["default"] == 0
    text = classes["Flux1FillTextEncode"].INPUT_TYPES()["required"]["text"]
    assert text[0] == "STRING" and text[1]["multiline"] is True and text[1]["dynamicPrompts"] is False


# -- loaders -------------------------------------------------------------------------------------------------


def test_loaders_wrap_the_core_modules_in_patchers(loaded):
    model, encoder, vae = loaded["model"], loaded["encoder"], loaded["vae"]
    assert model.patcher.model.module is model.core.transformer
    both = encoder.patcher.model.module
    assert list(both) == [encoder.encoder.t5.model, encoder.encoder.clip.model]  # one patcher moves both
    assert vae.patcher.model.module is vae.vae and vae.vae.latent_channels == 16
    assert model.core.transformer.dtype == torch.float32 and model.core.config.in_channels == 384
    assert model.patcher.size == sum(t.nbytes for t in model.core.transformer.state_dict().values())
    assert encoder.encoder.widths == (T5_WIDTH, CLIP_WIDTH)


def test_the_text_encoders_use_the_host_tokenizer_folders(pack, fake_host, loaded):
    host_module = sys.modules[f"{pack.__name__}.nodes.host"]
    comfy = fake_host.comfy_dir
    assert host_module.tokenizer_folders() == [
        str(comfy / "sd1_tokenizer"), str(comfy / "text_encoders" / "t5_tokenizer")
    ]  # fmt: skip
    encoder = loaded["encoder"].encoder
    assert len(encoder.clip_tokenizer) == 49408 and len(encoder.t5_tokenizer) == 32100


def test_a_missing_host_tokenizer_is_a_clear_error(nodes, pack, monkeypatch, tmp_path, Flux2Error):
    host_module = sys.modules[f"{pack.__name__}.nodes.host"]
    monkeypatch.setattr(host_module, "tokenizer_folders", lambda: [str(tmp_path / "sd1_tokenizer")])
    with pytest.raises(Flux2Error, match="sd1_tokenizer"):
        nodes["Flux1FillTextEncoderLoader"].execute("t5_tiny.safetensors", "clip_tiny.safetensors")


@pytest.mark.parametrize(
    "name", ["fill_tiny_comfy.safetensors", "fill_tiny_diffusers.safetensors", "fill_tiny-Q8_0.gguf"]
)
def test_every_dit_layout_loads_and_samples(nodes, loaded, core, name):
    (model,) = nodes["Flux1FillModelLoader"].execute(name)
    assert model.core.config == loaded["model"].core.config
    latent, _ = run_sampler(
        nodes, {**loaded, "model": model}, image(64, 64), box_mask(64, 64, 16, 16, 48, 48)
    )
    assert latent["samples"].shape == (1, 16, 8, 8) and torch.isfinite(latent["samples"]).all()
    if name == "fill_tiny_comfy.safetensors":  # the same weights as fill_tiny, behind ComfyUI's prefix
        plain, _ = run_sampler(nodes, loaded, image(64, 64), box_mask(64, 64, 16, 16, 48, 48))
        assert torch.equal(latent["samples"], plain["samples"])
    if name.endswith(".gguf"):
        assert model.core.transformer.double_blocks[0].img_attn.qkv.weight.dtype == torch.uint8


def test_weight_dtype_choice(nodes):
    (model,) = nodes["Flux1FillModelLoader"].execute("fill_tiny.safetensors", weight_dtype="bfloat16")
    assert model.core.transformer.dtype == torch.bfloat16


# -- wrong files: each names the right one -------------------------------------------------------------------


def test_a_klein_dit_in_the_fill_loader_names_the_fill_file(nodes, Flux2Error):
    with pytest.raises(Flux2Error, match="FLUX.2 model .* choose flux1-fill-dev.safetensors"):
        nodes["Flux1FillModelLoader"].execute("klein_tiny.safetensors")


def test_a_fill_dit_in_the_klein_loader_names_the_fill_loader(nodes, Flux2Error):
    with pytest.raises(Flux2Error, match="FLUX.1 Fill \\[dev\\].* not FLUX.2: load it with the FLUX.1 Fill"):
        nodes["Flux2KleinModelLoader"].execute("fill_tiny.safetensors", "auto")


def test_a_qwen3_file_as_t5_names_the_t5_file(nodes, Flux2Error):
    with pytest.raises(Flux2Error, match="qwen_tiny.* language model .* choose t5xxl_fp16.safetensors"):
        nodes["Flux1FillTextEncoderLoader"].execute("qwen_tiny.safetensors", "clip_tiny.safetensors")
    with pytest.raises(Flux2Error, match="qwen_tiny.* language model .* choose clip_l.safetensors"):
        nodes["Flux1FillTextEncoderLoader"].execute("t5_tiny.safetensors", "qwen_tiny.safetensors")


def test_swapped_t5_and_clip_name_the_right_files(nodes, Flux2Error):
    with pytest.raises(Flux2Error, match="clip_tiny.safetensors is .* not a T5 encoder: choose t5xxl_fp16"):
        nodes["Flux1FillTextEncoderLoader"].execute("clip_tiny.safetensors", "t5_tiny.safetensors")


def test_the_flux2_vae_in_the_fill_vae_loader_names_ae(nodes, Flux2Error):
    with pytest.raises(Flux2Error, match="FLUX.2 VAE .* needs ae.safetensors"):
        nodes["Flux1FillVAELoader"].execute("flux2_vae_tiny.safetensors")


def test_flux1_files_in_the_klein_loaders_name_the_klein_files(nodes, Flux2Error):
    for name in ("t5_tiny.safetensors", "clip_tiny.safetensors"):
        with pytest.raises(Flux2Error, match=r"a FLUX.1 text encoder.*qwen_3_4b.safetensors.*qwen_3_8b"):
            nodes["Flux2KleinTextEncoderLoader"].execute(name)
    with pytest.raises(Flux2Error, match="FLUX.1 .* VAE .* needs flux2-vae.safetensors"):
        nodes["Flux2KleinVAELoader"].execute("ae_tiny.safetensors")


def test_an_empty_folder_names_the_fill_files_and_their_links(nodes, pack, fake_host, Flux2Error):
    loaders = {  # node -> (input, folder, file to get, link)
        "Flux1FillVAELoader": ("vae_name", "vae", "ae.safetensors",
                               "https://huggingface.co/Comfy-Org/Lumina_Image_2.0_Repackaged/resolve/main/"
                               "split_files/vae/ae.safetensors"),
        "Flux1FillModelLoader": ("model_name", "diffusion_models", "flux1-fill-dev.safetensors",
                                 "https://huggingface.co/Comfy-Org/flux1-dev/resolve/main/split_files/"
                                 "diffusion_models/flux1-fill-dev.safetensors"),
    }  # fmt: skip
    for node_id, (widget, folder, filename, link) in loaders.items():
        aside = fake_host.folder(folder).parent / "aside"
        aside.mkdir(exist_ok=True)
        moved = [f.rename(aside / f.name) for f in list(fake_host.folder(folder).iterdir())]
        try:
            (choice,) = pack_nodes(pack).classes[node_id].INPUT_TYPES()["required"][widget][1]["options"]
            assert choice == f"(models/{folder} is empty: get {filename})"
            with pytest.raises(Flux2Error, match=f"holds no model file: download {filename}") as e:
                nodes[node_id].execute(choice)
            assert link in str(e.value) and f"into ComfyUI/models/{folder}/" in str(e.value)
        finally:
            for f in moved:
                f.rename(fake_host.folder(folder) / f.name)
    model_files = sys.modules[f"{pack.__name__}.nodes.model_files"]
    assert model_files.empty_folder_entry("text_encoders", "t5xxl_fp16.safetensors") == (
        "(models/text_encoders is empty: get t5xxl_fp16.safetensors)"
    )
    assert "clip_l.safetensors" in model_files.empty_folder_message("text_encoders", "clip_l.safetensors")


# -- conditioning --------------------------------------------------------------------------------------------


def test_text_encode_gives_cpu_conditioning_equal_to_the_core_and_frees_the_encoder(nodes, loaded, host):
    (cond,) = nodes["Flux1FillTextEncode"].execute(loaded["encoder"], "a cat")
    assert cond.t5.shape == (1, 512, T5_WIDTH) and cond.pooled.shape == (1, CLIP_WIDTH)
    assert cond.t5.dtype == torch.float32 and cond.t5.device.type == "cpu"
    patcher = loaded["encoder"].patcher
    assert host.loads == [(patcher, True)] and host.unloads == [patcher]
    direct = loaded["encoder"].encoder.encode(["a cat"])
    assert torch.equal(cond.t5, direct.t5) and torch.equal(cond.pooled, direct.pooled)
    assert not torch.equal(cond.pooled, loaded["positive"].pooled)  # the prompt matters
    (native,) = cond.to_native()
    assert native[0] is not None and torch.equal(native[1]["pooled_output"], cond.pooled)


# -- sampling, decoding, compositing -------------------------------------------------------------------------


def test_inpaint_chain_keeps_every_pixel_outside_the_mask(nodes, loaded, host):
    source, mask = image(80, 96, seed=3), box_mask(80, 96, 20, 30, 50, 70)
    latent, stitch = run_sampler(nodes, loaded, source, mask, steps=3)
    samples = latent["samples"]
    assert set(latent) == {"samples"} and samples.shape == (1, 16, 10, 12) and samples.dtype == torch.float32
    assert [(value, total) for value, total, _ in host.progress] == [(1, 3), (2, 3), (3, 3)]
    assert all(preview == ("JPEG", (1, 16, 10, 12), 512) for _, _, preview in host.progress)
    assert host.previewers == ["Flux"]  # FLUX.1 previews: native FLUX.1 latent format
    assert (loaded["vae"].patcher, True) in host.loads and (loaded["model"].patcher, True) in host.loads
    assert not any(b._forward_pre_hooks for b in loaded["model"].core.transformer.blocks())  # hooks removed
    (decoded,) = nodes["Flux1FillDecode"].execute(loaded["vae"], latent)
    assert decoded.shape == (1, 80, 96, 3) and 0.0 <= decoded.min() and decoded.max() <= 1.0
    outside = mask[0] < 0.5
    for feather in (0, 6):
        (out,) = nodes["Flux2KleinComposite"].execute(decoded, stitch, feather)
        assert out.shape == source.shape
        assert torch.equal(out[0][outside], source[0][outside])
        assert not torch.equal(out[0][~outside], source[0][~outside])
    (hard,) = nodes["Flux2KleinComposite"].execute(decoded, stitch, 0)
    assert torch.equal(hard[0][~outside], decoded[0][~outside])  # a hard mask: wholly the painted pixels


def test_the_node_gives_what_the_core_gives(nodes, loaded, core):
    source, mask = image(64, 96, seed=5), box_mask(64, 96, 8, 8, 40, 56)
    latent, _ = run_sampler(nodes, loaded, source, mask, seed=11, grow_mask=4)
    crop, crop_mask, _ = core.prepare_inpaint(source[0], mask, 4)
    pixels = (crop * 2 - 1).permute(2, 0, 1)[None]
    fill = core.fill_inputs(loaded["vae"].vae, pixels, crop_mask)
    settings = core.FillSettings(seed=11, steps=2, guidance=30.0)
    direct = core.sample_fill(loaded["model"].core, loaded["positive"], fill, settings)
    assert torch.equal(latent["samples"], direct)


def test_a_seed_reproduces_and_another_differs(nodes, loaded, host):
    source, mask = image(64, 64, seed=1), box_mask(64, 64, 16, 16, 48, 48)
    first, _ = run_sampler(nodes, loaded, source, mask, seed=123)
    host.previews_enabled = False
    host.progress.clear()
    again, _ = run_sampler(nodes, loaded, source, mask, seed=123)
    assert torch.equal(first["samples"], again["samples"])
    assert [preview for _, _, preview in host.progress] == [None, None]
    other, _ = run_sampler(nodes, loaded, source, mask, seed=124)
    assert not torch.equal(first["samples"], other["samples"])


def test_a_white_png_mask_read_as_0_996_hides_the_source_like_a_mask_of_1(nodes, loaded):
    source = image(64, 64, seed=2)
    full, _ = run_sampler(nodes, loaded, source, box_mask(64, 64, 16, 16, 48, 48, 1.0))
    png, _ = run_sampler(nodes, loaded, source, box_mask(64, 64, 16, 16, 48, 48, 255 / 256))
    assert torch.equal(full["samples"], png["samples"])  # the model never saw a trace of the source there
    changed = source.clone()
    changed[:, 16:48, 16:48] = 1.0 - changed[:, 16:48, 16:48]  # other pixels under the mask: same result
    hidden, _ = run_sampler(nodes, loaded, changed, box_mask(64, 64, 16, 16, 48, 48, 255 / 256))
    assert torch.equal(hidden["samples"], png["samples"])


def test_a_2d_mask_works_like_a_batch_of_one(nodes, loaded):
    source, mask = image(64, 64), box_mask(64, 64, 0, 0, 32, 64)
    batched, _ = run_sampler(nodes, loaded, source, mask)
    flat, _ = run_sampler(nodes, loaded, source, mask[0])
    assert torch.equal(batched["samples"], flat["samples"])


def test_crop_to_mask_samples_only_the_masks_neighbourhood(nodes, loaded):
    source, mask = image(384, 512, seed=4), box_mask(384, 512, 100, 200, 116, 216)
    latent, stitch = run_sampler(nodes, loaded, source, mask, crop_to_mask=True, context=8, steps=1)
    assert latent["samples"].shape == (1, 16, 32, 32)  # a 64 px box, enlarged 4x
    assert stitch.box[2:] == (64, 64) and stitch.size == (256, 256)
    (decoded,) = nodes["Flux1FillDecode"].execute(loaded["vae"], latent)
    (out,) = nodes["Flux2KleinComposite"].execute(decoded, stitch, 4)
    assert out.shape == source.shape
    outside = mask[0] < 0.5
    assert torch.equal(out[0][outside], source[0][outside])
    assert not torch.equal(out[0][~outside], source[0][~outside])


def test_outpaint_through_the_pad_node(nodes, loaded):
    source = image(64, 64, seed=6)
    canvas, mask = nodes["Flux2KleinOutpaintPad"].execute(source, 0, 0, 32, 16, 8)
    latent, stitch = run_sampler(nodes, loaded, canvas, mask)
    assert latent["samples"].shape == (1, 16, 10, 12)
    (decoded,) = nodes["Flux1FillDecode"].execute(loaded["vae"], latent)
    (out,) = nodes["Flux2KleinComposite"].execute(decoded, stitch, 8)
    assert out.shape == (1, 80, 96, 3)
    kept = mask[0] == 0
    assert torch.equal(out[0][kept], canvas[0][kept]) and torch.equal(out[0, :56, :56], source[0, :56, :56])
    new = mask[0] == 1
    assert torch.equal(out[0][new], decoded[0][new])  # the new area is wholly the painted one


def test_denoise_below_one_starts_from_the_image(nodes, loaded, pack, core, monkeypatch, Flux2Error):
    source, mask = image(64, 64, seed=8), box_mask(64, 64, 8, 8, 56, 56)
    sampling = fill_sampling(pack)
    euler, seen = sampling.euler, []

    def recording(denoise, x, sigmas, *rest):  # the latent and the schedule the Euler loop gets
        seen.append((x.clone(), list(sigmas)))
        return euler(denoise, x, sigmas, *rest)

    monkeypatch.setattr(sampling, "euler", recording)
    part, _ = run_sampler(nodes, loaded, source, mask, denoise=0.5)
    ((start, sigmas),) = seen
    # the last half of the schedule (flow.truncate: int(2 - 2 * 0.5) = 1 of the 2 steps skipped), from the
    # unmasked image's latent noised to its first sigma s: x = (1 - s) * image + s * noise (flow.start_from)
    full = sampling.fill_sigmas(2, 4 * 4).tolist()  # 64 x 64: a 4 x 4 token grid
    assert sigmas == full[1:] and 0 < sigmas[0] < 1
    crop, crop_mask, _ = core.prepare_inpaint(source[0], mask)
    pixels = (crop * 2 - 1).permute(2, 0, 1)[None]
    fill = core.fill_inputs(loaded["vae"].vae, pixels, crop_mask, with_source=True)
    noise = sampling.pack_latent(core.make_noise(1, 64, 64, 7, core.FLUX1))  # run_sampler's seed; FLUX.1's
    s = sigmas[0]
    assert torch.equal(start, (1 - s) * fill.source + s * noise)
    assert part["samples"].shape == (1, 16, 8, 8)
    with pytest.raises(Flux2Error, match="denoise is 1.5"):
        run_sampler(nodes, loaded, source, mask, denoise=1.5)


def test_a_batch_gives_that_many_different_images(nodes, loaded, pack):
    source, mask = image(64, 64), box_mask(64, 64, 0, 0, 64, 32)
    latent, stitch = run_sampler(nodes, loaded, source, mask, batch_size=2)
    samples = latent["samples"]
    assert samples.shape == (2, 16, 8, 8) and not torch.equal(samples[0], samples[1])
    # item k is the single-image run on item k of the batch's noise (flow.make_noise: one randn of
    # [2, 16, 8, 8] from the seeded CPU generator)
    sampling = fill_sampling(pack)
    draw = sampling.make_noise

    def item(k):  # for a batch of one: item k of the batch of two's noise
        return lambda batch, height, width, seed, *rest: draw(2, height, width, seed, *rest)[k : k + 1]

    for k in range(2):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sampling, "make_noise", item(k))
            single, _ = run_sampler(nodes, loaded, source, mask)
        torch.testing.assert_close(samples[k : k + 1], single["samples"], atol=1e-5, rtol=0)  # batched: ~1e-6
    (decoded,) = nodes["Flux1FillDecode"].execute(loaded["vae"], latent)
    (out,) = nodes["Flux2KleinComposite"].execute(decoded, stitch, 0)
    assert out.shape == (2, 64, 64, 3)


def test_bad_masks_and_images_are_clear_errors(nodes, loaded, host, Flux2Error):
    source = image(64, 64)
    with pytest.raises(Flux2Error, match="the mask is empty: paint the area"):
        run_sampler(nodes, loaded, source, torch.zeros(1, 64, 64))
    with pytest.raises(Flux2Error, match="the mask is empty"):  # Load Image of a picture without alpha
        run_sampler(nodes, loaded, source, torch.zeros(1, 64, 64) + 0.2)
    with pytest.raises(Flux2Error, match="one image at a time"):
        run_sampler(nodes, loaded, torch.cat([source, source]), box_mask(64, 64, 0, 0, 32, 32))
    with pytest.raises(Flux2Error, match="use a mask of the image's size"):
        run_sampler(nodes, loaded, source, box_mask(64, 80, 0, 0, 32, 32))
    assert host.loads == []  # refused before any model was loaded


def test_linked_values_out_of_range_are_node_errors_before_loading(nodes, loaded, host, Flux2Error):
    source, mask = image(64, 64), box_mask(64, 64, 0, 0, 32, 32)
    with pytest.raises(Flux2Error, match="steps is 1000"):
        run_sampler(nodes, loaded, source, mask, steps=1000)
    with pytest.raises(Flux2Error, match="guidance is 145"):
        run_sampler(nodes, loaded, source, mask, guidance=145.0)
    with pytest.raises(Flux2Error, match="seed -5 is out of range"):
        run_sampler(nodes, loaded, source, mask, seed=-5)
    assert host.loads == []


def test_a_run_that_cannot_fit_is_refused_before_sampling(nodes, loaded, host, Flux2Error):
    source, mask = image(64, 64), box_mask(64, 64, 0, 0, 32, 32)
    host.free_memory = 1024
    with pytest.raises(Flux2Error, match=r"sampling 64x64 needs about .* GB but CPU memory has 0.0 GB free"):
        run_sampler(nodes, loaded, source, mask)
    assert host.progress == []


def test_interrupt_before_and_during_the_run(nodes, loaded, host):
    source, mask = image(64, 64), box_mask(64, 64, 0, 0, 32, 32)
    host.interrupted = True
    with pytest.raises(InterruptProcessingException):
        run_sampler(nodes, loaded, source, mask, steps=3)
    assert host.progress == []
    host.on_progress = lambda value, total: setattr(host, "interrupted", value == 1)
    with pytest.raises(BaseException) as caught:
        run_sampler(nodes, loaded, source, mask, steps=3)
    assert caught.type is InterruptProcessingException and not isinstance(caught.value, Exception)
    assert [value for value, _, _ in host.progress] == [1]
    assert not any(b._forward_pre_hooks for b in loaded["model"].core.transformer.blocks())


def test_decode_is_the_raw_vae_decode_of_a_native_flux1_latent(nodes, loaded, Flux2Error):
    latent = torch.randn(2, 16, 8, 6, generator=torch.Generator().manual_seed(1))  # VAEEncode's layout
    (pixels,) = nodes["Flux1FillDecode"].execute(loaded["vae"], {"samples": latent})
    expected = ((loaded["vae"].vae.decode(latent) + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1)
    assert pixels.shape == (2, 64, 48, 3)
    torch.testing.assert_close(pixels, expected)
    (tiled,) = nodes["Flux1FillDecode"].execute(loaded["vae"], {"samples": latent}, 128, 32)
    assert tiled.shape == pixels.shape
    with pytest.raises(Flux2Error, match="not a FLUX.1 latent .* Fill \\[dev\\] Sampler"):
        nodes["Flux1FillDecode"].execute(loaded["vae"], {"samples": torch.zeros(1, 128, 4, 4)})


def test_the_klein_decode_refuses_a_fill_latent(nodes, loaded, Flux2Error):
    latent, _ = run_sampler(nodes, loaded, image(64, 64), box_mask(64, 64, 0, 0, 32, 32), steps=1)
    with pytest.raises(Flux2Error, match="not a FLUX.2 latent"):
        nodes["Flux2KleinDecode"].execute(None, latent)


def test_text_encoders_on_the_cpu_choice(nodes, loaded):
    (encoder,) = nodes["Flux1FillTextEncoderLoader"].execute(
        "t5_tiny.safetensors", "clip_tiny.safetensors", device="cpu"
    )
    (cond,) = nodes["Flux1FillTextEncode"].execute(encoder, PROMPT)
    assert torch.equal(cond.t5, loaded["positive"].t5)


def test_tiny_tokenizer_folders_read_as_the_real_ones(tmp_path):
    # The generated folders load through the core's own tokenizer reader, with the real special ids.
    from flux2_core.flux1.tokenizers import load_fill_tokenizers, tokenize

    found = load_fill_tokenizers(write_tokenizer_folders(tmp_path))
    clip_ids = tokenize(found["clip"], ["a cat"], 77, "CLIP")[0]
    t5_ids = tokenize(found["t5"], ["a cat"], 512, "T5")[0]
    end = int((clip_ids == 49407).nonzero()[0])
    assert clip_ids[0] == 49406 and 1 < end < 8 and clip_ids[end:].eq(49407).all()
    ends = (t5_ids == 1).nonzero()
    assert len(ends) == 1 and t5_ids[int(ends[0]) + 1 :].eq(0).all() and int(ends[0]) > 0


def test_the_tokenizers_of_a_comfyui_checkout_load_too():
    import os

    root = os.environ.get("COMFYUI_PATH")
    if not root:
        pytest.skip("COMFYUI_PATH is not set: no ComfyUI checkout to read comfy/sd1_tokenizer from")
    from flux2_core.flux1.tokenizers import load_fill_tokenizers, tokenize

    comfy = Path(root) / "comfy"
    found = load_fill_tokenizers([comfy / "sd1_tokenizer", comfy / "text_encoders" / "t5_tokenizer"])
    prompt = ["A painting of a squirrel eating a burger"]
    assert tokenize(found["clip"], prompt, 77, "CLIP")[0, :10].tolist() == [
        49406, 320, 3086, 539, 320, 14004, 4371, 320, 6548, 49407
    ]  # fmt: skip
    assert tokenize(found["t5"], prompt, 512, "T5")[0, :12].tolist() == [
        71, 3924, 13, 3, 9, 26364, 3182, 3, 9, 3, 9079, 1
    ]  # fmt: skip


def test_the_step_cache_input_says_what_it_did(nodes, loaded, pack):
    source, mask = image(64, 64, seed=4), box_mask(64, 64, 16, 16, 48, 48)
    (plain, _) = run_sampler(nodes, loaded, source, mask, steps=8)
    (same, _) = run_sampler(nodes, loaded, source, mask, steps=8, step_cache=0.0)
    assert torch.equal(plain["samples"], same["samples"])
    shown = run_sampler_ui(nodes, loaded, source, mask, steps=8, step_cache=1.0)
    (text,) = shown.ui["text"]
    assert text.startswith("step cache 1: ") and text.endswith(" of 8 steps ran every block")
    full = int(text.split(": ")[1].split(" ")[0])
    assert 0 < full < 8 and not torch.equal(shown.args[0]["samples"], plain["samples"])


def run_sampler_ui(nodes, loaded, source, mask, **overrides):
    args = dict(model=loaded["model"], positive=loaded["positive"], vae=loaded["vae"], image=source,
                mask=mask, seed=7, steps=2, guidance=30.0)  # fmt: skip
    return nodes["Flux1FillSampler"].execute(**{**args, **overrides})
