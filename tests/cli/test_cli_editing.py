"""Editing from the command line: inpaint against diffusers' whole inpaint pipeline, the composite's exact
pixels, outpaint, img2img and several prompts in one run."""

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinInpaintPipeline
from PIL import Image
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_text import make_tiny_qwen3, reference_hf_tokenizer, write_comfy_file
from tiny_vae import make_diffusers_vae, random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.cli.main import main

PROMPT = "a red fox in the snow"


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_edit")
    qwen, vae_sd = make_tiny_qwen3(seed=5), random_vae_state_dict(seed=6)
    rng = np.random.default_rng(0)
    image = root / "photo.png"
    Image.fromarray(rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(image)
    mask = np.zeros((64, 96), dtype=np.uint8)
    mask[16:48, 32:80] = 255
    Image.fromarray(mask, mode="L").save(root / "mask.png")
    return {
        "model": write_bfl_file(
            make_diffusers_dit(seed=7, joint_attention_dim=96), root / "flux-2-klein-4b.safetensors"
        ),
        "text_encoder": write_comfy_file(qwen, root / "qwen_3_4b.safetensors"),
        "vae": write_vae_file(vae_sd, root / "flux2-vae.safetensors"),
        "image": image,
        "mask": root / "mask.png",
        "qwen": qwen,
        "diffusers_vae": make_diffusers_vae(vae_sd),
    }


def _run(files, out, *extra, prompts=(PROMPT,)):
    argv = ["generate", "--model", str(files["model"]), "--text-encoder", str(files["text_encoder"]),
            "--vae", str(files["vae"]), "--output", str(out), "--steps", "3", "--seed", "4"]  # fmt: skip
    for prompt in prompts:
        argv += ["--prompt", prompt]
    return main([*argv, *extra])


def _pixels(path):
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def test_inpaint_matches_diffusers_inpaint_pipeline_and_composites_exactly(files, tmp_path):
    raw, composed = tmp_path / "raw.png", tmp_path / "composed.png"
    edit = ["--image", str(files["image"]), "--mask", str(files["mask"]), "--strength", "0.7"]
    assert _run(files, raw, *edit, "--no-composite") == 0
    assert _run(files, composed, *edit) == 0
    pipe = Flux2KleinInpaintPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential"),
        vae=files["diffusers_vae"],
        text_encoder=files["qwen"],
        tokenizer=reference_hf_tokenizer(),
        transformer=make_diffusers_dit(seed=7, joint_attention_dim=96),
        is_distilled=True,
    )
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        expected = pipe(
            prompt=PROMPT,
            image=Image.open(files["image"]),
            mask_image=Image.open(files["mask"]),
            strength=0.7,
            num_inference_steps=3,
            guidance_scale=1.0,
            generator=torch.Generator("cpu").manual_seed(4),
            output_type="np",
        ).images[0]
    diff = np.abs(_pixels(raw) - (expected * 255).round().astype(int)).max()
    print(f"CLI inpaint vs diffusers: max pixel difference {diff}/255")
    assert diff <= 1
    original, mask = _pixels(files["image"]), np.asarray(Image.open(files["mask"])) > 127
    out = _pixels(composed)
    assert np.array_equal(out[~mask], original[~mask])  # outside the mask: the input's pixels exactly
    assert np.array_equal(out[mask], _pixels(raw)[mask])


def test_outpaint_extends_the_canvas_and_keeps_the_original(files, tmp_path):
    out = tmp_path / "wide.png"
    assert _run(files, out, "--image", str(files["image"]), "--outpaint", "0,16,32,0") == 0
    result = _pixels(out)
    assert result.shape == (80, 128, 3)
    original = _pixels(files["image"])
    assert np.array_equal(result[17:, :95], original[1:, :95])  # all but the 1 px fade into the new area
    assert not np.array_equal(result[16, :95], original[0, :95])


def test_img2img_at_full_strength_is_text_to_image_at_the_images_size(files, tmp_path):
    assert _run(files, tmp_path / "a.png", "--image", str(files["image"]), "--strength", "1") == 0
    assert _run(files, tmp_path / "b.png", "--width", "96", "--height", "64") == 0
    assert np.array_equal(_pixels(tmp_path / "a.png"), _pixels(tmp_path / "b.png"))
    assert _run(files, tmp_path / "c.png", "--image", str(files["image"]), "--steps", "4") == 0  # 0.75
    assert _run(files, tmp_path / "b4.png", "--width", "96", "--height", "64", "--steps", "4") == 0
    assert not np.array_equal(_pixels(tmp_path / "c.png"), _pixels(tmp_path / "b4.png"))


def test_width_and_height_that_repeat_the_images_size_are_accepted_and_change_nothing(files, tmp_path):
    size = ["--width", "96", "--height", "64"]  # the photo's size
    for name, edit in (
        ("img2img", ["--image", str(files["image"])]),
        ("inpaint", ["--image", str(files["image"]), "--mask", str(files["mask"])]),
    ):
        assert _run(files, tmp_path / f"{name}.png", *edit) == 0
        assert _run(files, tmp_path / f"{name}-sized.png", *edit, *size) == 0
        assert np.array_equal(_pixels(tmp_path / f"{name}.png"), _pixels(tmp_path / f"{name}-sized.png"))


def test_several_prompts_give_one_output_each_equal_to_single_runs(files, tmp_path):
    prompts = (PROMPT, "a blue bird on a branch")
    assert _run(files, tmp_path / "many.png", "--width", "64", "--height", "64", prompts=prompts) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many-1.png", "many-2.png"]
    assert _run(files, tmp_path / "single.png", "--width", "64", "--height", "64", prompts=prompts[1:]) == 0
    assert np.array_equal(_pixels(tmp_path / "many-2.png"), _pixels(tmp_path / "single.png"))


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--mask", "x.png"], "--mask and --outpaint work on an image"),
        (["--strength", "0.5"], "--strength needs an image"),
        (["--image", "IMG", "--outpaint", "1,2"], "give LEFT,TOP,RIGHT,BOTTOM"),
        (["--image", "IMG", "--outpaint", "0,0,10,0"], "outpaint right is 10: use 0 or a multiple of 16"),
        (
            ["--image", "IMG", "--mask", "SMALL"],
            "is 64x64 but the image is 96x64: use a mask of the image's size",
        ),
        (
            ["--image", "IMG", "--mask", "MASK", "--width", "64"],
            "--width 64 differs from the output's width 96",
        ),
        (["--image", "IMG", "--height", "96"], "--height 96 differs from the output's height 64"),
        (["--image", "IMG", "--strength", "1.5"], "strength \\(denoise\\) is 1.5"),
    ],
)
def test_bad_editing_requests_are_clear_errors(files, tmp_path, caplog, extra, message):
    small = tmp_path / "small.png"
    Image.fromarray(np.full((64, 64), 255, dtype=np.uint8), mode="L").save(small)
    named = {"IMG": files["image"], "MASK": files["mask"], "SMALL": small}
    extra = [str(named.get(v, v)) for v in extra]
    assert _run(files, tmp_path / "x.png", *extra) == 2
    assert not (tmp_path / "x.png").exists()
    import re

    assert re.search(message, caplog.text), caplog.text


def test_the_kv_models_reference_pass_runs_once_for_every_prompt(files, tmp_path, monkeypatch):
    from flux2_core.cli import run  # the run's phase 5 calls it once, before the prompts' loop

    calls = []
    real = run.encode_reference_kv
    monkeypatch.setattr(run, "encode_reference_kv", lambda *a: calls.append(1) or real(*a))
    extra = ["--variant", "kv", "--reference", str(files["image"]), "--width", "64", "--height", "64"]
    assert _run(files, tmp_path / "kv.png", *extra, prompts=("one", "two", "three")) == 0
    assert len(calls) == 1 and len(list(tmp_path.glob("kv-*.png"))) == 3
