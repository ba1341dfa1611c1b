"""The command line's VAE progress bars (flux2_core.cli.progress): a decode, an encode and the references each
move a bar on a terminal, from 0 to 100%, beside the sampling's step bar; the bar's count never goes down and
ends at its total, and the images are the ones decoded without a bar."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
import torch
from PIL import Image
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_text import make_tiny_qwen3, write_comfy_file
from tiny_vae import random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.cli import progress
from flux2_core.cli.main import main
from flux2_core.vae.autoencoder import load_vae
from flux2_core.vae.progress import PER_RUN


class Terminal(io.StringIO):
    """What the bars are written to: a terminal, so that tqdm draws them (it leaves them out elsewhere)."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_progress")
    image = root / "image.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 80, 3), dtype=np.uint8)).save(image)
    dit = make_diffusers_dit(seed=7, joint_attention_dim=96)
    return {
        "model": write_bfl_file(dit, root / "flux-2-klein-4b.safetensors"),
        "text_encoder": write_comfy_file(make_tiny_qwen3(seed=5), root / "qwen_3_4b.safetensors"),
        "vae": write_vae_file(random_vae_state_dict(seed=6), root / "flux2-vae.safetensors"),
        "image": image,
    }


def percentages(text: str, bar: str) -> list[int]:
    """Every percentage the bar named ``bar`` was drawn with, in order."""
    return [int(p) for p in re.findall(re.escape(bar) + r":\s+(\d+)%", text)]


def test_a_run_draws_the_decode_encode_and_reference_bars(files, tmp_path, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    argv = ["generate", "--model", str(files["model"]), "--text-encoder", str(files["text_encoder"]),
            "--vae", str(files["vae"]), "--prompt", "a fox", "--steps", "2", "--batch-size", "2",
            "--image", str(files["image"]), "--reference", str(files["image"]),
            "--output", str(tmp_path / "out.png")]  # fmt: skip
    assert main(argv) == 0
    text = terminal.getvalue()
    for bar in ("VAE encode (references)", "VAE encode (image)", "VAE decode"):
        drawn = percentages(text, bar)
        assert drawn and drawn[0] == 0 and drawn[-1] == 100 and drawn == sorted(drawn), (bar, drawn)
    assert text.index("VAE encode (references)") < text.index("VAE encode (image)") < text.index("VAE decode")
    assert (tmp_path / "out_1.png").exists() and (tmp_path / "out_2.png").exists()


class RecordingBar:
    """Stands in for tqdm: keeps the count after every update."""

    made: list[RecordingBar] = []

    def __init__(self, total, **options):
        self.total, self.n, self.counts, self.options = total, 0, [], options
        RecordingBar.made.append(self)

    def update(self, n):
        self.n += n
        self.counts.append((self.n, self.total))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_decode_each_counts_every_image_on_one_bar_and_decodes_the_same(files, monkeypatch):
    monkeypatch.setattr(progress, "tqdm", RecordingBar)
    RecordingBar.made.clear()
    vae = load_vae(files["vae"])
    latents = torch.randn(3, 128, 4, 5, generator=torch.Generator().manual_seed(1))
    tiles = {"tile_size": 0, "tile_overlap": 64}
    pixels = progress.decode_each(vae, latents, torch.device("cpu"), tiles)
    (bar,) = RecordingBar.made
    done = [n for n, _ in bar.counts]
    assert {total for _, total in bar.counts} == {3 * PER_RUN}
    assert done[0] == 0 and done == sorted(done) and done[-1] == 3 * PER_RUN
    assert len(bar.counts) == 3 * (1 + len(vae.decoder.stages(8, 10)))  # each image: 0, then every stage
    with torch.inference_mode():
        expected = torch.cat([vae.decode(item, **tiles) for item in latents.split(1)])
    assert torch.equal(pixels, expected)
