"""The command line's high-resolution flags on tiny random files: --dype / --dype-base (position
extrapolation) and --tile-size / --tile-overlap / --upscale (tiled refinement of --image)."""

import numpy as np
import pytest
from PIL import Image
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_text import make_tiny_qwen3, write_comfy_file
from tiny_vae import random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.cli.main import main


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_highres")
    return {
        "model": write_bfl_file(
            make_diffusers_dit(seed=7, joint_attention_dim=96), root / "flux-2-klein-4b.safetensors"
        ),
        "text_encoder": write_comfy_file(make_tiny_qwen3(seed=5), root / "qwen_3_4b.safetensors"),
        "vae": write_vae_file(random_vae_state_dict(seed=6), root / "flux2-vae.safetensors"),
    }


def _run(files, tmp_path, *extra, name="out.png"):
    out = tmp_path / name
    argv = ["generate", "--model", str(files["model"]), "--text-encoder", str(files["text_encoder"])]
    argv += ["--vae", str(files["vae"]), "--prompt", "a lighthouse", "--steps", "2", "--seed", "3"]
    return main([*argv, "--output", str(out), *extra]), out


def _pixels(path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def test_dype_within_its_base_is_the_plain_image_and_past_it_another(files, tmp_path):
    size = ("--width", "320", "--height", "256")
    code, plain = _run(files, tmp_path, *size, name="plain.png")
    assert code == 0
    code, within = _run(files, tmp_path, *size, "--dype", "--dype-base", "512", name="within.png")
    assert code == 0 and np.array_equal(_pixels(plain), _pixels(within))
    code, past = _run(files, tmp_path, *size, "--dype", "--dype-base", "256", name="past.png")
    assert code == 0 and not np.array_equal(_pixels(plain), _pixels(past))


def test_a_bad_dype_base_is_refused_before_loading(files, tmp_path, caplog):
    code, out = _run(files, tmp_path, "--dype", "--dype-base", "100")
    assert code == 2 and not out.exists()
    assert "extrapolation base 100 px is not allowed" in caplog.text


def _picture(tmp_path, width=160, height=128):
    generator = np.random.default_rng(4)
    path = tmp_path / "picture.png"
    Image.fromarray(generator.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
    return str(path)


def test_one_tile_is_the_plain_img2img_with_the_image_as_reference(files, tmp_path):
    picture = _picture(tmp_path)
    code, tiled = _run(files, tmp_path, "--image", picture, "--strength", "0.6", "--tile-size", "256",
                       "--tile-overlap", "64", name="tiled.png")  # fmt: skip
    assert code == 0
    code, plain = _run(files, tmp_path, "--image", picture, "--strength", "0.6", "--reference", picture,
                       name="plain.png")  # fmt: skip
    assert code == 0 and np.array_equal(_pixels(tiled), _pixels(plain))


def test_upscale_enlarges_before_the_tiled_refinement(files, tmp_path):
    picture = _picture(tmp_path, 96, 64)
    code, out = _run(files, tmp_path, "--image", picture, "--upscale", "3", "--tile-size", "256",
                     "--tile-overlap", "64")  # fmt: skip
    assert code == 0 and Image.open(out).size == (288, 192)  # two tiles across


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--tile-size", "1000"], "tile size 1000 px is not allowed: use a multiple of 16"),
        (["--tile-size", "256", "--tile-overlap", "192"], "smaller than twice the tile overlap 192 px"),
        (["--upscale", "2"], "--upscale enlarges the image for a tiled refinement: give --tile-size too"),
    ],
)
def test_bad_tiles_are_refused_before_loading(files, tmp_path, caplog, extra, message):
    code, out = _run(files, tmp_path, "--image", _picture(tmp_path), *extra)
    assert code == 2 and not out.exists() and message in caplog.text
