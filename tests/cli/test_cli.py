"""The command line end to end, on tiny random files; one run is compared with diffusers' whole pipeline
(tokenizer, Qwen3, DiT, VAE) given the same prompt and seed."""

import logging

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline
from PIL import Image
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_text import make_tiny_qwen3, reference_hf_tokenizer, write_comfy_file
from tiny_vae import make_diffusers_vae, random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.cli.main import main

PROMPT = "a red fox in the snow, watercolour"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli")
    qwen = make_tiny_qwen3(seed=5)  # 32 wide -> 96-wide conditioning
    vae_sd = random_vae_state_dict(seed=6)
    dit = make_diffusers_dit(seed=7, joint_attention_dim=96)
    paths = {
        "model": write_bfl_file(dit, root / "flux-2-klein-4b.safetensors"),
        "text_encoder": write_comfy_file(qwen, root / "qwen_3_4b.safetensors"),
        "vae": write_vae_file(vae_sd, root / "flux2-vae.safetensors"),
        "narrow_model": write_bfl_file(make_diffusers_dit(seed=8), root / "flux-2-klein-9b.safetensors"),
    }
    return {"paths": paths, "qwen": qwen, "vae": make_diffusers_vae(vae_sd), "root": root}


def _run(files, tmp_path, *extra, model="model", prompt=PROMPT):
    p = files["paths"]
    out = tmp_path / "out.png"
    argv = [
        "generate",
        "--model",
        str(p[model]),
        "--text-encoder",
        str(p["text_encoder"]),
        "--vae",
        str(p["vae"]),
    ]
    argv += ["--prompt", prompt] if prompt is not None else []
    return main([*argv, "--output", str(out), *extra]), out


def test_text_to_image_matches_diffusers_pipeline(files, tmp_path):
    code, out = _run(files, tmp_path, "--width", "96", "--height", "64", "--seed", "3")
    assert code == 0
    ours = np.asarray(Image.open(out)).astype(int)
    assert ours.shape == (64, 96, 3)

    pipe = Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential"),
        vae=files["vae"],
        text_encoder=files["qwen"],
        tokenizer=reference_hf_tokenizer(),
        transformer=make_diffusers_dit(seed=7, joint_attention_dim=96),
        is_distilled=True,
    )
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        image = pipe(
            prompt=PROMPT,
            width=96,
            height=64,
            num_inference_steps=4,
            guidance_scale=1.0,
            generator=torch.Generator("cpu").manual_seed(3),
            output_type="np",
        ).images[0]
    expected = (image * 255).round().astype(int)
    diff = np.abs(ours - expected).max()
    print(f"max pixel difference vs diffusers: {diff}/255")
    assert diff <= 1  # both round to 8 bit; float noise may flip one level


def test_batch_writes_numbered_files(files, tmp_path):
    code, out = _run(files, tmp_path, "--width", "64", "--height", "64", "--batch-size", "2")
    assert code == 0
    first, second = tmp_path / "out_1.png", tmp_path / "out_2.png"
    assert first.exists() and second.exists() and not out.exists()
    assert not np.array_equal(np.asarray(Image.open(first)), np.asarray(Image.open(second)))


def test_output_size_follows_the_first_reference(files, tmp_path):
    ref = tmp_path / "ref.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (72, 100, 3), dtype=np.uint8)).save(ref)
    code, out = _run(files, tmp_path, "--reference", str(ref), "--steps", "2")
    assert code == 0
    assert Image.open(out).size == (96, 64)  # 100x72 centre-cropped to multiples of 16


def test_wrong_text_encoder_is_reported_before_sampling(files, tmp_path, caplog):
    code, out = _run(files, tmp_path, "--width", "64", "--height", "64", model="narrow_model")
    assert code == 2 and not out.exists()
    assert "needs a Qwen3 text encoder of width 8: 24-wide conditioning" in caplog.text


def test_impossible_size_is_refused(files, tmp_path, caplog):
    code, _ = _run(files, tmp_path, "--width", "100", "--height", "64")
    assert code == 2 and "width 100 is not allowed: use a multiple of 16" in caplog.text


def test_unreadable_reference_is_refused(files, tmp_path, caplog):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"not an image")
    code, _ = _run(files, tmp_path, "--reference", str(bad))
    assert code == 2 and "could not read the reference image" in caplog.text


def _tiny_lora(files, path, scale=0.5):
    from safetensors.torch import save_file
    from tiny_dit import bfl_state_dict

    sd = bfl_state_dict(make_diffusers_dit(seed=7, joint_attention_dim=96))
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for layer in ("double_blocks.0.img_attn.qkv", "single_blocks.0.linear1", "double_blocks.1.img_mlp.0"):
        out, inp = sd[layer + ".weight"].shape
        tensors[f"diffusion_model.{layer}.lora_A.weight"] = torch.randn(4, inp, generator=g) * scale
        tensors[f"diffusion_model.{layer}.lora_B.weight"] = torch.randn(out, 4, generator=g) * scale
    tensors["diffusion_model.not_a_layer.lora_A.weight"] = torch.zeros(4, 32)
    tensors["diffusion_model.not_a_layer.lora_B.weight"] = torch.zeros(32, 4)
    save_file(tensors, str(path))
    return path


def test_lora_flag_changes_the_image_and_prints_its_report(files, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    lora = _tiny_lora(files, tmp_path / "style.safetensors")
    size = ("--width", "64", "--height", "64", "--seed", "2")
    code, plain_out = _run(files, tmp_path, *size)
    plain = np.asarray(Image.open(plain_out)).astype(int)
    code, out = _run(files, tmp_path, *size, "--lora", f"{lora}:1.5")
    assert code == 0
    assert np.abs(np.asarray(Image.open(out)).astype(int) - plain).mean() > 1
    assert "style.safetensors" in caplog.text and "not_a_layer" in caplog.text  # the unmatched key
    code, out = _run(files, tmp_path, *size, "--lora", f"{lora}:0", "--lora", str(lora) + ":0")
    assert code == 0 and np.array_equal(np.asarray(Image.open(out)).astype(int), plain)


@pytest.mark.parametrize(
    ("value", "message"),
    [("missing.safetensors", "is not a file"), ("{lora}:12", "strength 12 is out of range")],
)
def test_bad_lora_flags_are_refused_before_loading(files, tmp_path, caplog, value, message):
    lora = _tiny_lora(files, tmp_path / "style.safetensors")
    code, out = _run(files, tmp_path, "--lora", value.format(lora=lora))
    assert code == 2 and not out.exists() and message in caplog.text


def test_quantised_model_runs_from_the_cli(files, tmp_path):
    from quant_files import write_quantised
    from tiny_dit import bfl_state_dict

    sd = bfl_state_dict(make_diffusers_dit(seed=7, joint_attention_dim=96))
    path = tmp_path / "flux-2-klein-4b-fp8.safetensors"
    write_quantised(sd, path, "float8_e4m3fn")
    size = ("--width", "64", "--height", "64", "--seed", "2")
    code, plain_out = _run(files, tmp_path, *size)
    plain = np.asarray(Image.open(plain_out)).astype(int)
    files["paths"]["fp8"] = path
    code, out = _run(files, tmp_path, *size, model="fp8")
    assert code == 0
    auto = np.asarray(Image.open(out)).astype(int)
    assert 0 < np.abs(auto - plain).mean() < 8
    # a CPU has no fp8 matmul: auto dequantises, as --quant-compute dequantize does, bit for bit
    code, out = _run(files, tmp_path, *size, "--quant-compute", "dequantize", model="fp8")
    assert code == 0 and np.array_equal(np.asarray(Image.open(out)).astype(int), auto)


def test_quant_compute_format_multiplies_fp8_in_fp8_and_says_so(files, tmp_path, caplog):
    pytest.importorskip("comfy_kitchen", reason="in-format fp8 runs through comfy-kitchen (the test extra)")
    from quant_files import write_quantised
    from tiny_dit import bfl_state_dict

    sd = bfl_state_dict(make_diffusers_dit(seed=7, joint_attention_dim=96))
    files["paths"]["fp8"] = path = tmp_path / "flux-2-klein-4b-fp8.safetensors"
    write_quantised(sd, path, "float8_e4m3fn")
    size = ("--width", "64", "--height", "64", "--seed", "2")
    caplog.set_level(logging.INFO)
    code, out = _run(files, tmp_path, *size, "--quant-compute", "dequantize", model="fp8")
    dequantised = np.asarray(Image.open(out)).astype(int)
    assert code == 0 and "fp8 layers: dequantised (--quant-compute dequantize)" in caplog.text
    code, out = _run(files, tmp_path, *size, "--quant-compute", "format", model="fp8")
    assert code == 0 and "fp8 layers: fp8 matmul via comfy-kitchen eager" in caplog.text
    assert 0 < np.abs(np.asarray(Image.open(out)).astype(int) - dequantised).mean() < 8
    with pytest.raises(SystemExit):  # argparse names the choices
        _run(files, tmp_path, "--quant-compute", "fast")


def test_streaming_and_tiling_flags_keep_the_image(files, tmp_path):
    size = ("--width", "64", "--height", "64", "--seed", "4")
    code, plain_out = _run(files, tmp_path, *size)
    plain = np.asarray(Image.open(plain_out)).astype(int)
    code, out = _run(files, tmp_path, *size, "--offload", "stream", "--resident-mb", "0")
    assert code == 0 and np.array_equal(np.asarray(Image.open(out)).astype(int), plain)  # streaming is exact
    code, out = _run(files, tmp_path, *size, "--vae-tile", "128")  # one tile covers 64x64: exact
    assert code == 0 and np.array_equal(np.asarray(Image.open(out)).astype(int), plain)


def test_a_streamed_run_checks_that_ram_holds_the_whole_model(files, tmp_path, monkeypatch):
    """Streaming puts only the resident part and the blocks in flight on the device, but the whole DiT stays
    in RAM: the memory check gets both, and RAM that cannot hold the whole model is refused, with the fix."""
    from flux2_core import Flux2Error, limits
    from flux2_core.cli import inputs

    seen, check = [], inputs.check_memory
    monkeypatch.setattr(inputs, "check_memory", lambda *a: seen.append(a) or check(*a))
    code, out = _run(files, tmp_path, "--offload", "stream", "--resident-mb", "0", "--width", "64",
                     "--height", "64")  # fmt: skip
    assert code == 0 and out.exists()
    dit, in_ram = seen[0][1], seen[0][-1]
    # the tiny DiT has 4 blocks: 3 in flight of 4 (plus its small parts) on the device, all of it in RAM
    assert in_ram >= files["paths"]["model"].stat().st_size * 0.9 and dit < in_ram
    gb = limits.GB
    free = {"cpu": 10 * gb, "cuda": 40 * gb}
    monkeypatch.setattr(limits, "available_memory", lambda device: free[device.type])
    gpu = torch.device("cuda")
    check(gpu, 3 * gb, 8 * gb, 2 * gb, "x", 1, None, 9 * gb)  # 9 GB in 10 GB of RAM, 5 GB on the GPU
    with pytest.raises(Flux2Error) as refused:
        check(gpu, 3 * gb, 8 * gb, 2 * gb, "x", 1, None, 18 * gb)  # a 9B DiT streamed: 18 GB in RAM
    message = str(refused.value)
    assert "the streamed diffusion model in RAM while the text runs needs about 18.0 GB" in message
    assert "smaller model file" in message
    with pytest.raises(Flux2Error, match="on the CPU needs about 20.0 GB"):  # streamed onto the CPU itself
        check(torch.device("cpu"), 3 * gb, 2 * gb, 2 * gb, "x", 1, None, 18 * gb)


@pytest.mark.parametrize(
    ("flags", "message"),
    [(("--vae-tile", "100"), "VAE tile size 100 is not allowed"), (("--resident-mb", "-1"), "is negative")],
)
def test_bad_memory_flags_are_refused(files, tmp_path, caplog, flags, message):
    code, out = _run(files, tmp_path, *flags)
    assert code == 2 and not out.exists() and message in caplog.text


def _reference(tmp_path, name="ref.png", seed=0):
    ref = tmp_path / name
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (64, 64, 3), dtype=np.uint8)).save(ref)
    return str(ref)


def test_reference_strength_zero_writes_the_text_to_image_picture(files, tmp_path):
    size = ["--width", "64", "--height", "64", "--steps", "2"]
    ref = _reference(tmp_path)
    _, plain_out = _run(files, tmp_path / "t2i", *size)
    _, off_out = _run(files, tmp_path / "off", *size, "--reference", ref, "--reference-strength", "0")
    _, on_out = _run(files, tmp_path / "on", *size, "--reference", ref, "--reference-strength", "1")
    t2i, off, on = (np.asarray(Image.open(p)) for p in (plain_out, off_out, on_out))
    assert np.array_equal(off, t2i) and not np.array_equal(on, t2i)


def test_one_reference_strength_per_reference_or_one_for_all(files, tmp_path):
    size = ["--width", "64", "--height", "64", "--steps", "2"]
    a, b = _reference(tmp_path, "a.png", 0), _reference(tmp_path, "b.png", 1)
    refs = ["--reference", a, "--reference", b]
    _, both_out = _run(files, tmp_path / "both", *size, *refs, "--reference-strength", "0.5")
    _, each_out = _run(files, tmp_path / "each", *size, *refs, *["--reference-strength", "0.5"] * 2)
    _, mixed_out = _run(files, tmp_path / "mixed", *size, *refs, "--reference-strength", "0.5",
                        "--reference-strength", "2")  # fmt: skip
    both, each, mixed = (np.asarray(Image.open(p)) for p in (both_out, each_out, mixed_out))
    assert np.array_equal(both, each) and not np.array_equal(both, mixed)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--reference-strength", "0.5"], "--reference-strength needs reference images"),
        (["--reference", "R", *[f"--reference-strength={s}" for s in (1, 2, 3)]],
         "3 --reference-strength values for 1 --reference images"),
        (["--reference", "R", "--reference-strength", "-2"], "--reference-strength: reference strength -2"),
    ],
)  # fmt: skip
def test_bad_reference_strengths_are_refused_before_loading(files, tmp_path, caplog, extra, message):
    extra = [_reference(tmp_path) if x == "R" else x for x in extra]
    code, out = _run(files, tmp_path, *extra)
    assert code == 2 and not out.exists() and message in caplog.text


def _mask(tmp_path, name, left: bool):
    pixels = np.zeros((64, 64), dtype=np.uint8)
    pixels[:, :32] = 255
    path = tmp_path / name
    Image.fromarray(pixels if left else 255 - pixels).save(path)
    return str(path)


def test_regions_on_the_command_line(files, tmp_path):
    size = ["--width", "64", "--height", "64", "--steps", "2"]
    whole = tmp_path / "whole.png"
    Image.fromarray(np.full((48, 48), 255, dtype=np.uint8)).save(whole)  # any size: scaled to the output
    # no global prompt, one region over the whole picture: the plain run of its prompt
    code, regional = _run(files, tmp_path / "r", "--region", "a cat", str(whole), *size, prompt=None)
    assert code == 0 and _run(files, tmp_path / "p", *size, prompt="a cat")[0] == 0
    assert np.array_equal(
        np.asarray(Image.open(regional)), np.asarray(Image.open(tmp_path / "p" / "out.png"))
    )
    # a global prompt and two regions
    left, right = _mask(tmp_path, "l.png", True), _mask(tmp_path, "r.png", False)
    code, out = _run(files, tmp_path, *size, "--region", "a cat", left, "--region", "a dog", right)
    assert code == 0 and out.exists()


def test_no_prompt_at_all_is_refused(files, tmp_path, caplog):
    # (--region with --reference, --mask or --outpaint: tests/cli/test_cli_regional_edit.py)
    assert _run(files, tmp_path, prompt=None)[0] == 2 and "give a prompt" in caplog.text


def test_regions_that_cannot_run_are_refused_before_a_file_is_resolved(files, tmp_path, caplog, monkeypatch):
    import flux2_core.cli.run as run

    loaded = []  # a model file's header read (a Hub id would be downloaded there)
    monkeypatch.setattr(run, "weight_bytes", lambda *a: loaded.append(a) or pytest.fail("model resolved"))
    size = ["--width", "64", "--height", "64", "--steps", "2"]
    black, speck = tmp_path / "black.png", tmp_path / "speck.png"
    Image.fromarray(np.zeros((64, 64), dtype=np.uint8)).save(black)
    pixels = np.zeros((64, 64), dtype=np.uint8)
    pixels[:4, :4] = 255  # under half of one 16 x 16 token
    Image.fromarray(pixels).save(speck)
    for mask in (black, speck):
        caplog.clear()
        code, _ = _run(files, tmp_path, *size, "--region", "a cat", str(mask), prompt=None)
        assert code == 2 and "every --region mask is empty at 64x64" in caplog.text
        assert "or give a global --prompt" in caplog.text
    caplog.clear()
    code, _ = _run(files, tmp_path, *size, "--region", "a", str(tmp_path / "missing.png"), prompt=None)
    assert code == 2 and "missing.png" in caplog.text and "(white = the region)" in caplog.text
    assert not loaded


def test_a_region_that_covers_no_token_is_left_out_with_a_warning(files, tmp_path, caplog):
    size = ["--width", "64", "--height", "64", "--steps", "2"]
    black = tmp_path / "black.png"
    Image.fromarray(np.zeros((64, 64), dtype=np.uint8)).save(black)
    code, out = _run(files, tmp_path / "r", *size, "--region", "a dog", str(black))
    assert code == 0 and "region 1 of 1 covers no 16 x 16 token at 64x64" in caplog.text
    code, plain = _run(files, tmp_path / "p", *size)  # the plain run of the global prompt
    assert code == 0 and np.array_equal(np.asarray(Image.open(out)), np.asarray(Image.open(plain)))
