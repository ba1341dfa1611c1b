"""FLUX.1 Fill [dev] from the command line: the same image as diffusers' FluxFillPipeline, the family and the
two text encoders told apart by their tensors, the composite, outpainting, and every wrong pairing refused by
name before a weight is read."""

import numpy as np
import pytest
import torch
from diffusers import FluxFillPipeline
from PIL import Image
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_flux1 import (
    bfl_fill_state_dict,
    fill_scheduler,
    make_diffusers_fill_dit,
    make_diffusers_flux1_vae,
    make_parity_clip,
    make_parity_t5,
    save_tensors,
    write_clip_file,
    write_t5_file,
    write_tokenizer_folders,
)
from tiny_text import make_tiny_qwen3, write_comfy_file
from tiny_vae import random_vae_state_dict
from tiny_vae import write_bfl_file as write_flux2_vae

from flux2_core.cli.main import main
from flux2_core.configs import FLUX1
from flux2_core.flow import make_noise
from flux2_core.flux1 import pack_latent

PROMPT = "a wooden bench in a park"
WIDTH, HEIGHT = 96, 64
SEED, STEPS = 3, 3


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_fill")
    dit, vae = make_diffusers_fill_dit(seed=1), make_diffusers_flux1_vae(seed=2)
    t5, clip = make_parity_t5(seed=3), make_parity_clip(seed=4)
    clip_tok, t5_tok = write_tokenizer_folders(root / "tokenizers")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (HEIGHT, WIDTH, 3), dtype=np.uint8)).save(root / "photo.png")
    mask = np.zeros((HEIGHT, WIDTH), dtype=np.uint8)
    mask[16:48, 32:80] = 255
    Image.fromarray(mask, mode="L").save(root / "mask.png")
    return {
        "model": save_tensors(bfl_fill_state_dict(dit), root / "flux1-fill-dev.safetensors"),
        "t5": write_t5_file(t5, root / "t5xxl_fp16.safetensors"),
        "clip": write_clip_file(clip, root / "clip_l.safetensors"),
        "vae": save_tensors(vae.state_dict(), root / "ae.safetensors"),
        "tokenizers": (clip_tok, t5_tok),
        "image": root / "photo.png",
        "mask": root / "mask.png",
        "modules": (dit, vae, t5, clip),
    }


def _argv(files, out, *extra, encoders=("t5", "clip")):
    argv = ["generate", "--model", str(files["model"]), "--vae", str(files["vae"]), "--prompt", PROMPT,
            "--image", str(files["image"]), "--steps", str(STEPS), "--seed", str(SEED),
            "--output", str(out)]  # fmt: skip
    for name in encoders:
        argv += ["--text-encoder", str(files[name])]
    for folder in files["tokenizers"]:
        argv += ["--tokenizer", str(folder)]
    return [*argv, *extra]


def _pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB")).astype(int)


def _diffusers_image(files) -> np.ndarray:
    """diffusers' FluxFillPipeline on the same modules, tokenizers and noise, as 8-bit pixels."""
    from transformers import CLIPTokenizer, T5TokenizerFast

    dit, vae, t5, clip = files["modules"]
    clip_tok, t5_tok = files["tokenizers"]
    pipe = FluxFillPipeline(
        scheduler=fill_scheduler(),
        vae=vae,
        text_encoder=clip,
        tokenizer=CLIPTokenizer.from_pretrained(str(clip_tok), model_max_length=77),
        text_encoder_2=t5,
        tokenizer_2=T5TokenizerFast.from_pretrained(str(t5_tok)),
        transformer=dit,
    )
    image = torch.from_numpy(_pixels(files["image"])).permute(2, 0, 1)[None].float() / 255
    mask = torch.from_numpy(np.array(Image.open(files["mask"]))).float()[None, None] / 255
    noise = pack_latent(make_noise(1, HEIGHT, WIDTH, SEED, FLUX1))  # the CLI's seed convention
    with torch.no_grad():
        out = pipe(prompt=PROMPT, image=image, mask_image=mask, height=HEIGHT, width=WIDTH, latents=noise,
                   num_inference_steps=STEPS, guidance_scale=30.0, max_sequence_length=512,
                   generator=torch.Generator().manual_seed(0), output_type="pt").images  # fmt: skip
    return (out[0].permute(1, 2, 0).clamp(0, 1) * 255).round().numpy().astype(int)


def test_inpaint_equals_diffusers_fill_pipeline_in_either_encoder_order(files, tmp_path):
    raw, swapped = tmp_path / "raw.png", tmp_path / "swapped.png"
    mask = ["--mask", str(files["mask"]), "--no-composite"]
    assert main(_argv(files, raw, *mask)) == 0
    assert main(_argv(files, swapped, *mask, encoders=("clip", "t5"))) == 0
    ours, reference = _pixels(raw), _diffusers_image(files)
    assert np.array_equal(ours, _pixels(swapped))
    assert ours.shape == (HEIGHT, WIDTH, 3)
    assert np.abs(ours - reference).max() <= 1  # 8-bit rounding of the same decode
    assert ours.std() > 5  # a picture, not a flat field


def test_composite_keeps_every_unmasked_pixel(files, tmp_path):
    out = tmp_path / "composed.png"
    assert main(_argv(files, out, "--mask", str(files["mask"]))) == 0
    composed, source = _pixels(out), _pixels(files["image"])
    keep = np.asarray(Image.open(files["mask"])) < 128
    assert np.array_equal(composed[keep], source[keep])
    assert np.abs(composed[~keep] - source[~keep]).mean() > 10  # the masked area was repainted


def test_outpaint_extends_the_image_and_keeps_the_original(files, tmp_path):
    out = tmp_path / "wider.png"
    assert main(_argv(files, out, "--outpaint", "32,0,0,16")) == 0
    wider, source = _pixels(out), _pixels(files["image"])
    assert wider.shape == (HEIGHT + 16, WIDTH + 32, 3)
    # the original (minus the 1 px fade into it at the new edges) is kept exactly
    assert np.array_equal(wider[1:HEIGHT - 1, 33:], source[1:-1, 1:])  # fmt: skip


@pytest.fixture(scope="module")
def other_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_fill_other")
    return {
        "klein": write_bfl_file(
            make_diffusers_dit(seed=7, joint_attention_dim=96), root / "klein.safetensors"
        ),
        "qwen": write_comfy_file(make_tiny_qwen3(seed=5), root / "qwen_3_4b.safetensors"),
        "flux2_vae": write_flux2_vae(random_vae_state_dict(seed=6), root / "flux2-vae.safetensors"),
    }


def test_wrong_files_and_options_are_refused_by_name(files, other_files, tmp_path, caplog):
    out = tmp_path / "x.png"
    mask = ["--mask", str(files["mask"])]
    cases = [
        (_argv(files, out, *mask, encoders=("clip", "clip")), "both --text-encoder files are CLIP"),
        (_argv(files, out, *mask, encoders=("t5",)), "needs two text encoders"),
        (_argv(files, out), "paints into an image: give --image with --mask"),
        (_argv(files, out, *mask, "--dtype", "float16"), "float16"),
        (_argv(files, out, *mask, "--reference", str(files["image"])), "--reference"),
    ]
    swaps = [
        ("vae", "flux2_vae", "FLUX.1 Fill [dev] needs ae.safetensors"),
        ("clip", "qwen", "neither T5-XXL nor CLIP-L"),
        ("model", "klein", "two (T5-XXL, CLIP-L) are FLUX.1 Fill's"),
    ]
    for ours, theirs, message in swaps:  # one file replaced by another family's
        argv = _argv(files, out, *mask)
        argv[argv.index(str(files[ours]))] = str(other_files[theirs])
        cases.append((argv, message))
    for argv, message in cases:
        caplog.clear()
        assert main(argv) == 2, message
        assert message in caplog.text, (message, caplog.text)
    assert not out.exists()
