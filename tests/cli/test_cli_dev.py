"""FLUX.2 [dev] from the command line: the dev DiT and its Mistral text encoder detected from their tensors,
the wrong pairings refused before a weight is read, and ``torchrun --nproc-per-node 2 ... --parallel
tensor|sequence`` (gloo on the CPU) writing the single-process image from rank 0 alone."""

import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_flux1 import make_tiny_t5, write_t5_file
from tiny_mistral import TINY_TEXT, make_tiny_mistral3, write_hf_folder
from tiny_text import make_tiny_qwen3
from tiny_text import write_comfy_file as write_qwen_file
from tiny_vae import random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core import SampleRequest, SampleSettings, load_text_encoder, load_transformer, load_vae, sample
from flux2_core.cli.main import main

REPO = Path(__file__).resolve().parents[2]
PROMPT = "a red fox in the snow"
STEPS, SEED, GUIDANCE = 3, 5, 4.0


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_dev")
    dev = make_diffusers_dit(seed=7, guidance_embeds=True, joint_attention_dim=3 * TINY_TEXT["hidden_size"])
    return {
        "dev": write_bfl_file(dev, root / "flux2-dev.safetensors"),
        # an HF folder (its config.json gives the tiny head size; ComfyUI's single files hold the real 128)
        "mistral": write_hf_folder(make_tiny_mistral3(seed=5), root / "text_encoder"),
        "klein": write_bfl_file(
            make_diffusers_dit(seed=8, joint_attention_dim=96), root / "klein.safetensors"
        ),
        "qwen": write_qwen_file(make_tiny_qwen3(seed=5), root / "qwen_3_4b.safetensors"),
        "vae": write_vae_file(random_vae_state_dict(seed=6), root / "flux2-vae.safetensors"),
        "t5": write_t5_file(make_tiny_t5(seed=2), root / "t5xxl_fp16.safetensors"),
    }


def _argv(files, out, model="dev", encoder="mistral", *extra):
    return ["generate", "--model", str(files[model]), "--text-encoder", str(files[encoder]),
            "--vae", str(files["vae"]), "--prompt", PROMPT, "--width", "80", "--height", "64",
            "--steps", str(STEPS), "--seed", str(SEED), "--output", str(out), *extra]  # fmt: skip


def _pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def test_dev_runs_with_embedded_guidance_as_the_core_does(files, tmp_path):
    out = tmp_path / "dev.png"
    assert main(_argv(files, out)) == 0
    model = load_transformer(files["dev"])
    assert model.variant.name == "dev"
    conditioning = load_text_encoder(files["mistral"]).encode([PROMPT])
    latents = sample(SampleRequest(model, conditioning, SampleSettings(80, 64, STEPS, GUIDANCE, SEED)))
    pixels = load_vae(files["vae"]).decode(latents)
    expected = ((pixels[0].clamp(-1, 1) + 1) * 127.5).round().permute(1, 2, 0).numpy().astype(int)
    assert np.array_equal(_pixels(out), expected)  # dev's defaults: guidance 4 embedded
    other = tmp_path / "other_guidance.png"
    assert main([*_argv(files, other), "--guidance", "2.5"]) == 0
    assert np.abs(_pixels(other) - _pixels(out)).mean() > 1  # the guidance value reaches the model


@pytest.mark.parametrize(
    "model, encoder, message",
    [
        # tiny widths: named by family (the released widths name the model: test_mistral.py)
        ("dev", "qwen", "needs the Mistral Small 3.x text encoder of width 16"),
        ("klein", "mistral", "needs a Qwen3 text encoder of width 32"),
        ("dev", "t5", "is T5-XXL, a FLUX.1 text encoder"),
    ],
)
def test_wrong_text_encoder_is_named_before_loading(files, tmp_path, caplog, model, encoder, message):
    out = tmp_path / "x.png"
    assert main(_argv(files, out, model, encoder)) == 2
    assert message in caplog.text and not out.exists()


def test_parallel_needs_torchrun_and_refuses_what_it_cannot_split(files, tmp_path, caplog, monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    out = tmp_path / "x.png"
    assert main([*_argv(files, out), "--parallel", "tensor", "--device", "cpu"]) == 2
    assert "run under torchrun" in caplog.text
    caplog.clear()
    assert main([*_argv(files, out), "--parallel", "tensor", "--offload", "stream"]) == 2
    assert "--parallel tensor cannot run with --offload stream" in caplog.text
    assert not out.exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("mode", ["tensor", "sequence"])
def test_torchrun_two_processes_write_the_single_process_image(files, tmp_path, mode):
    single, parallel = tmp_path / "single.png", tmp_path / "parallel.png"
    assert main(_argv(files, single, "dev", "mistral", "--device", "cpu")) == 0
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(_free_port()), "-m", "flux2_core",
               *_argv(files, parallel, "dev", "mistral", "--device", "cpu", "--parallel", mode)]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("saved") + result.stderr.count("saved") == 1  # rank 0 alone writes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["parallel.png", "single.png"]
    # float32 sums in another order (about 1e-6 on the latents): at most one 8-bit level apart
    assert np.abs(_pixels(parallel) - _pixels(single)).max() <= 1


def test_a_dev_lora_from_the_command_line_is_the_core_run_with_it(files, tmp_path, caplog):
    """``--lora FILE:S`` on dev: a fal-trainer file on the guidance embedder, a block and the final layer's
    modulation; the image is the core's sample with the same LoRA, and its report is logged."""
    import torch
    from safetensors.torch import save_file
    from tiny_dit import bfl_state_dict

    from flux2_core.lora import prepare_lora, read_lora

    sd = bfl_state_dict(make_diffusers_dit(seed=7, guidance_embeds=True,
                                           joint_attention_dim=3 * TINY_TEXT["hidden_size"]))  # fmt: skip
    g, tensors = torch.Generator().manual_seed(4), {}
    for layer in ("guidance_in.in_layer", "double_blocks.0.img_attn.qkv", "final_layer.adaLN_modulation.1"):
        out, inp = sd[layer + ".weight"].shape
        tensors[f"base_model.model.{layer}.lora_A.weight"] = torch.randn(4, inp, generator=g) * 0.5
        tensors[f"base_model.model.{layer}.lora_B.weight"] = torch.randn(out, 4, generator=g) * 0.5
    lora_path = tmp_path / "dev_style.safetensors"
    save_file(tensors, str(lora_path))
    out = tmp_path / "lora.png"
    with caplog.at_level(logging.INFO):
        assert main([*_argv(files, out), "--lora", f"{lora_path}:0.8"]) == 0
    assert "fal / PEFT on BFL names (base_model.model.)" in caplog.text and "3 of the file's 3" in caplog.text
    model = load_transformer(files["dev"])
    lora = prepare_lora(read_lora(lora_path), model.transformer, strength=0.8)
    conditioning = load_text_encoder(files["mistral"]).encode([PROMPT])
    settings = SampleSettings(80, 64, STEPS, GUIDANCE, SEED)
    latents = sample(SampleRequest(model.with_lora(lora), conditioning, settings))
    pixels = load_vae(files["vae"]).decode(latents)
    expected = ((pixels[0].clamp(-1, 1) + 1) * 127.5).round().permute(1, 2, 0).numpy().astype(int)
    assert np.array_equal(_pixels(out), expected)
    plain = tmp_path / "plain.png"
    assert main(_argv(files, plain)) == 0
    assert np.abs(_pixels(plain) - _pixels(out)).mean() > 1  # the LoRA reaches the image


TURBO = "1.0, 0.6509, 0.4374, 0.2932, 0.1893, 0.1108, 0.0495, 0.00031"  # fal's Turbo list (model card)


def test_sigmas_run_as_given_as_the_core_does(files, tmp_path, caplog):
    out = tmp_path / "sigmas.png"
    argv = [a for a in _argv(files, out) if a not in ("--steps", str(STEPS))]
    with caplog.at_level(logging.INFO):
        assert main([*argv, "--sigmas", TURBO, "--guidance", "2.5"]) == 0
    model = load_transformer(files["dev"])
    conditioning = load_text_encoder(files["mistral"]).encode([PROMPT])
    settings = SampleSettings(80, 64, 1, 2.5, SEED).with_sigmas([float(v) for v in TURBO.split(",")])
    assert settings.steps == 8 and settings.schedule()[-1] == 0.0
    latents = sample(SampleRequest(model, conditioning, settings))
    pixels = load_vae(files["vae"]).decode(latents)
    expected = ((pixels[0].clamp(-1, 1) + 1) * 127.5).round().permute(1, 2, 0).numpy().astype(int)
    assert np.array_equal(_pixels(out), expected) and "8 steps, guidance 2.5" in caplog.text


@pytest.mark.parametrize(
    "value, extra, message",
    [
        ("1.0", (), "give at least two values"),
        ("1.0, 0.5, 0.7", (), "not decreasing (0.5 then 0.7)"),
        ("1.5, 0.5", (), "1.5 is outside [0, 1]"),
        ("1.0, half", (), "'half' is not a number"),
        ("1.0, 0.5", ("--steps", "4"), "--sigmas sets the steps"),
    ],
)
def test_bad_sigmas_are_refused_before_loading(files, tmp_path, caplog, value, extra, message):
    out = tmp_path / "x.png"
    argv = [a for a in _argv(files, out) if a not in ("--steps", str(STEPS))]
    assert main([*argv, "--sigmas", value, *extra]) == 2
    assert message in caplog.text and not out.exists()


def test_dev_takes_up_to_ten_references(files, tmp_path, caplog):
    image = tmp_path / "ref.png"
    Image.fromarray(np.full((64, 64, 3), 128, dtype=np.uint8)).save(image)
    out = tmp_path / "x.png"
    assert main([*_argv(files, out), *["--reference", str(image)] * 11]) == 2
    assert "11 reference images: the dev model takes up to 10" in caplog.text and not out.exists()


def test_a_flux2_run_takes_one_existing_tokenizer_folder(files, tmp_path, caplog):
    out = tmp_path / "x.png"
    assert main([*_argv(files, out), "--tokenizer", str(tmp_path / "missing")]) == 2
    assert "a FLUX.2 run takes one tokenizer folder" in caplog.text and not out.exists()


def test_a_fill_hub_id_is_told_by_its_name_before_any_download():
    from flux2_core.cli.fill import is_flux1_model

    assert is_flux1_model("black-forest-labs/FLUX.1-Fill-dev")
    assert not is_flux1_model("black-forest-labs/FLUX.2-dev")


@pytest.fixture(scope="module")
def control_files(files, tmp_path_factory):
    from safetensors.torch import save_file
    from tiny_control import control_state_dict

    root = tmp_path_factory.mktemp("cli_control")
    control = root / "FLUX.2-dev-Fun-Controlnet-Union-2602.safetensors"
    save_file(control_state_dict(32, 16, 96, blocks=1, seed=4), str(control))
    g = np.random.default_rng(0)
    pose, picture = root / "pose.png", root / "picture.png"
    Image.fromarray(g.integers(0, 255, (96, 120, 3), dtype=np.uint8)).save(pose)  # another size: resized
    Image.fromarray(g.integers(0, 255, (64, 80, 3), dtype=np.uint8)).save(picture)
    mask = root / "mask.png"
    Image.fromarray(np.where(np.arange(80)[None, :] < 40, 255, 0).repeat(64, 0).astype(np.uint8)).save(mask)
    return {"controlnet": control, "pose": pose, "picture": picture, "mask": mask}


def test_the_fun_controlnet_from_the_command_line(files, control_files, tmp_path):
    c = control_files
    plain, off, steered, inpaint = (tmp_path / f"{n}.png" for n in ("plain", "off", "steered", "inpaint"))
    flags = ["--controlnet", str(c["controlnet"]), "--control", str(c["pose"])]
    assert main(_argv(files, plain)) == 0
    assert main(_argv(files, off, "dev", "mistral", *flags, "--control-strength", "0")) == 0
    assert main(_argv(files, steered, "dev", "mistral", *flags)) == 0
    assert np.array_equal(_pixels(off), _pixels(plain))
    assert np.abs(_pixels(steered) - _pixels(plain)).mean() > 1
    inpaint_flags = [
        "--controlnet",
        str(c["controlnet"]),
        "--control-mask",
        str(c["mask"]),
        "--image",
        str(c["picture"]),
    ]
    assert main(_argv(files, inpaint, "dev", "mistral", *inpaint_flags)) == 0
    assert _pixels(inpaint).shape == (64, 80, 3)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--control", "pose"], "give it with --controlnet FILE"),
        (["--controlnet", "controlnet"], "needs a control map"),
        (["--controlnet", "controlnet", "--control-mask", "mask"], "--control-mask inpaints a picture"),
        (
            ["--controlnet", "controlnet", "--control", "pose", "--control-strength", "5"],
            "--control-strength 5",
        ),
    ],
)
def test_bad_control_flags_are_refused_before_loading(files, control_files, tmp_path, caplog, extra, message):
    extra = [str(control_files.get(a, a)) for a in extra]
    out = tmp_path / "x.png"
    assert main(_argv(files, out, "dev", "mistral", *extra)) == 2
    assert message in caplog.text and not out.exists()


def test_a_control_net_with_klein_is_refused(files, control_files, tmp_path, caplog):
    out = tmp_path / "klein.png"
    flags = ["--controlnet", str(control_files["controlnet"]), "--control", str(control_files["pose"])]
    assert main(_argv(files, out, "klein", "qwen", *flags)) == 2
    assert "only steers FLUX.2 [dev]" in caplog.text and not out.exists()


def test_the_memory_check_counts_the_control_net_and_streaming_streams_it_too(
    files, control_files, tmp_path, monkeypatch
):
    """The control net's weights and hints are in the memory check (on the device; with --offload stream in
    RAM, its blocks in flight on the device), and a streamed controlled run draws the resident one."""
    import torch

    from flux2_core.cli import inputs
    from flux2_core.dit.control import CONTROL_SPEC, hint_bytes
    from flux2_core.weights.loading import weight_bytes

    seen, check = [], inputs.check_memory
    monkeypatch.setattr(inputs, "check_memory", lambda *a: seen.append(a) or check(*a))
    flags = ["--controlnet", str(control_files["controlnet"]), "--control", str(control_files["pose"])]
    plain, resident, streamed = (tmp_path / f"{n}.png" for n in ("plain", "resident", "streamed"))
    assert main(_argv(files, plain)) == 0
    assert main(_argv(files, resident, "dev", "mistral", *flags)) == 0
    assert main(_argv(files, streamed, "dev", "mistral", *flags, "--offload", "stream")) == 0
    assert np.array_equal(_pixels(streamed), _pixels(resident))
    (_, dit, _, act, *_), (_, dit_c, _, act_c, *_), streaming = seen  # check_memory's arguments
    config, control_bytes, _ = weight_bytes(CONTROL_SPEC, control_files["controlnet"], torch.float32)
    assert dit_c - dit == control_bytes > 0
    assert act_c - act == hint_bytes(config, 1, (64 // 16) * (80 // 16), torch.float32)
    # streamed: the DiT and the control net in RAM (one control block: its whole bytes in flight at most)
    assert streaming[-1] == dit + control_bytes and streaming[1] <= dit_c and streaming[3] == act_c


def test_without_a_size_or_references_the_control_map_sets_it(files, control_files, tmp_path):
    """No --width / --height and no reference: the output takes the control map's aspect at about 1 MP
    (the 120 x 96 map enlarged 4x: 480 x 384); in the control's inpaint mode alone, the picture's."""
    argv = _argv(files, tmp_path / "x.png")
    at = argv.index("--width")
    del argv[at : at + 4]  # --width 80 --height 64
    out = tmp_path / "sized.png"
    argv[argv.index("--output") + 1] = str(out)
    flags = ["--controlnet", str(control_files["controlnet"]), "--control", str(control_files["pose"])]
    assert main([*argv, *flags]) == 0
    assert Image.open(out).size == (480, 384)
    inpaint = ["--controlnet", str(control_files["controlnet"]), "--control-mask", str(control_files["mask"]),
               "--image", str(control_files["picture"])]  # fmt: skip
    assert main([*argv, *inpaint]) == 0
    assert Image.open(out).size == (320, 256)  # the 80 x 64 picture, 4x
