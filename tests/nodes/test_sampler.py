"""FLUX.2 Sampler and Decode: the core's runs through the nodes, interrupts, refusals, memory checks."""

from __future__ import annotations

import pytest
import torch
from comfy_stubs import InterruptProcessingException, pack_nodes
from klein_nodes import TEXT_WIDTH, core_module, image, run_sampler


def test_end_to_end_chain(nodes, loaded, host):
    (refs,) = nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], image(64, 64))
    assert host.progress[0][:2] == (0, 1000) and host.progress[-1][:2] == (1000, 1000)  # the encode's bar
    host.progress.clear()
    samples = run_sampler(nodes, loaded, references=refs, steps=3, width=64, height=80)
    assert samples.shape == (1, 128, 5, 4) and samples.dtype == torch.float32 and samples.device.type == "cpu"
    assert torch.isfinite(samples).all()
    assert [(value, total) for value, total, _ in host.progress] == [(1, 3), (2, 3), (3, 3)]
    assert all(preview == ("JPEG", (1, 128, 5, 4), 512) for _, _, preview in host.progress)
    assert (loaded["model"].patcher, True) in host.loads
    assert not any(b._forward_pre_hooks for b in loaded["model"].core.transformer.blocks())  # hooks removed
    (pixels,) = nodes["Flux2KleinDecode"].execute(loaded["vae"], {"samples": samples})
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
    (pixels,) = nodes["Flux2KleinDecode"].execute(loaded["vae"], {"samples": latent})
    expected = ((loaded["vae"].vae.decode(latent) + 1) / 2).clamp(0, 1).permute(0, 2, 3, 1)
    torch.testing.assert_close(pixels, expected)


def test_decode_rejects_a_non_flux2_latent(nodes, loaded, Flux2Error):
    with pytest.raises(Flux2Error, match="FLUX.2 latent"):
        nodes["Flux2KleinDecode"].execute(loaded["vae"], {"samples": torch.zeros(1, 16, 8, 8)})


def test_width_zero_takes_the_reference_size(nodes, loaded):
    (refs,) = nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], image(80, 112))
    assert run_sampler(nodes, loaded, references=refs, width=0, height=0, steps=1).shape == (1, 128, 5, 7)
    assert run_sampler(nodes, loaded, references=refs, width=64, height=0, steps=1).shape == (1, 128, 5, 4)


def test_width_zero_without_references_is_1024(pack):
    inputs = core_module(pack).SamplerInputs(seed=0, steps=4, guidance=1.0, width=0, height=0, batch_size=2)
    assert inputs.output_size(None, None, None) == (1024, 1024, 2)


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
    assert not any(b._forward_pre_hooks for b in loaded["model"].core.transformer.blocks())


def test_interrupt_during_the_run_stops_it(nodes, loaded, host):
    host.on_progress = lambda value, total: setattr(host, "interrupted", value == 2)
    with pytest.raises(BaseException) as caught:
        run_sampler(nodes, loaded, steps=4)
    assert caught.type is InterruptProcessingException and not isinstance(caught.value, Exception)
    assert [value for value, _, _ in host.progress] == [1, 2]


def test_wrong_text_encoder_for_the_model(nodes, loaded, Flux2Error):
    (model,) = nodes["Flux2KleinModelLoader"].execute("klein_tiny_text24.safetensors", "distilled")
    with pytest.raises(Flux2Error, match="needs") as caught:
        run_sampler(nodes, loaded, model=model, steps=1)
    assert "24" in str(caught.value) and str(TEXT_WIDTH) in str(caught.value)


def test_base_model_guidance_needs_a_negative(nodes, loaded, host, Flux2Error):
    (base,) = nodes["Flux2KleinModelLoader"].execute("klein_tiny_base.safetensors", "auto")
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
    (kv,) = nodes["Flux2KleinModelLoader"].execute("klein_tiny.safetensors", "kv")
    (refs,) = nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], image(64, 64))
    samples = run_sampler(nodes, loaded, model=kv, references=refs, steps=2)
    settings = core.SampleSettings(64, 64, 2, 1.0, 7, 1)  # run_sampler's size, steps, guidance and seed
    request = core.SampleRequest(kv.core, loaded["positive"].embeds, settings, references=refs)
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
        choices = (
            pack_nodes(pack)
            .classes["Flux2KleinVAELoader"]
            .INPUT_TYPES()["required"]["vae_name"][1]["options"]
        )
        assert choices == ["(models/vae is empty: get flux2-vae.safetensors)"]
        link = "https://huggingface.co/Comfy-Org/flux2-dev/resolve/main/split_files/vae/flux2-vae.safetensors"
        with pytest.raises(
            Flux2Error, match="folder holds no model file: download flux2-vae.safetensors"
        ) as e:
            nodes["Flux2KleinVAELoader"].execute(choices[0])
        assert link in str(e.value) and "into ComfyUI/models/vae/" in str(e.value)
    finally:
        for f in moved:
            f.rename(folder / f.name)
    assert pack_nodes(pack).classes["Flux2KleinVAELoader"].INPUT_TYPES()["required"]["vae_name"][1][
        "options"
    ] == ["flux2_tiny_vae.safetensors"]
