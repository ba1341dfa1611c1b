"""Hostile and careless input: every class gets a clear error before any work is lost, or is handled as the
field's trusted tools handle it. Each test names the class it covers."""

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from tiny_dit import bfl_state_dict, make_diffusers_dit, write_bfl_file
from tiny_text import make_tiny_qwen3, model_tensors, write_comfy_file
from tiny_vae import random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.cli import inputs as cli_inputs
from flux2_core.cli.main import main
from flux2_core.dit.files import load_transformer
from flux2_core.errors import Flux2Error
from flux2_core.limits import check_fits, check_request
from flux2_core.sampling import SampleRequest, SampleSettings, sample
from flux2_core.text.encoder import load_text_encoder, text_encoder_from_state_dict
from flux2_core.vae.autoencoder import load_vae

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    return {
        "model": write_bfl_file(
            make_diffusers_dit(seed=7, joint_attention_dim=96), root / "flux-2-klein-4b.safetensors"
        ),
        "base": write_bfl_file(
            make_diffusers_dit(seed=7, joint_attention_dim=96), root / "flux-2-klein-base-4b.safetensors"
        ),
        "text_encoder": write_comfy_file(make_tiny_qwen3(seed=5), root / "qwen_3_4b.safetensors"),
        "vae": write_vae_file(random_vae_state_dict(seed=6), root / "flux2-vae.safetensors"),
        "root": root,
    }


def _argv(files, out, *extra, model="model"):
    # a --text-encoder in ``extra`` replaces the default one (two would be FLUX.1 Fill's T5 + CLIP pair)
    encoder = [] if "--text-encoder" in extra else ["--text-encoder", str(files["text_encoder"])]
    return [
        "generate",
        "--model", str(files[model]),
        *encoder,
        "--vae", str(files["vae"]),
        "--prompt", "a fox",
        "--output", str(out),
        "--width", "64", "--height", "64",
        *extra,
    ]  # fmt: skip


# -- decoding memory grows linearly with pixels --------------------------------------------------------------

PEAK_SCRIPT = """
import resource, sys, torch
sys.path.insert(0, {root!r})
from flux2_core.vae.autoencoder import AutoEncoder
from flux2_core.vae.blocks import VAEConfig
torch.manual_seed(0)
config = VAEConfig(ch=32, ch_mult=(1, 1, 1, 1), num_res_blocks=1, decoder_ch=32, decoder_ch_mult=(1, 1, 1, 1))
vae = AutoEncoder(config).eval()
for p in vae.parameters():
    torch.nn.init.normal_(p, std=0.05)
vae.bn.running_var.fill_(1.0)
vae.bn.running_mean.zero_()
latent = torch.randn(1, 128, 128, 128)  # a 2048 x 2048 image
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
pixels = vae.decode(latent)
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024, vae.decode_memory(2048, 2048))
"""


def test_a_2048_decode_needs_memory_linear_in_pixels():
    """The mid-block attention sees 65536 positions at 2048^2: with strided q/k/v SDPA falls back to its math
    kernel and builds a 17 GB score matrix; the decoder's own maps are 0.5 GB each."""
    code = PEAK_SCRIPT.format(root=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    peak, estimate = map(int, result.stdout.split())
    one_map = 2048 * 2048 * 32 * 4
    print(f"2048^2 decode: peak +{peak / 2**30:.2f} GB ({peak / one_map:.1f} full-resolution maps)")
    assert peak < 8 * one_map  # the core's estimate, which the Decode node reserves
    assert estimate == 8 * one_map


# -- a tiny hostile file cannot make the loader build a million blocks ---------------------------------------


def test_a_million_block_index_fails_at_once(files, tmp_path):
    sd = load_file(files["model"])
    sd["double_blocks.1000000.img_attn.qkv.weight"] = torch.zeros(1)
    save_file(sd, tmp_path / "flux-2-klein-4b.safetensors")
    start = time.monotonic()
    with pytest.raises(Flux2Error, match=r"double blocks up to number 1000000, more than any model"):
        load_transformer(tmp_path / "flux-2-klein-4b.safetensors")
    assert time.monotonic() - start < 1.0


def test_a_gap_in_the_blocks_is_named(files, tmp_path):
    sd = {k: v for k, v in load_file(files["model"]).items() if not k.startswith("single_blocks.0.")}
    save_file(sd, tmp_path / "cut.safetensors")
    with pytest.raises(Flux2Error, match=r"lacks single blocks 0 of 0..1: the file is incomplete"):
        load_transformer(tmp_path / "cut.safetensors")


def test_hostile_layer_indices_in_the_text_encoder_and_the_vae(tmp_path):
    tensors = model_tensors(make_tiny_qwen3(seed=0))
    tensors["model.layers.999999.mlp.up_proj.weight"] = torch.zeros(1)
    with pytest.raises(Flux2Error, match="decoder layers up to number 999999"):
        text_encoder_from_state_dict(tensors)
    sd = random_vae_state_dict(seed=1)
    sd["decoder.up.99999.block.0.conv2.weight"] = torch.zeros(1)
    save_file(sd, tmp_path / "vae.safetensors")
    with pytest.raises(Flux2Error, match="VAE blocks up to number 99999"):
        load_vae(tmp_path / "vae.safetensors")


# -- limits up front -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(width=8208), "width 8208 is not allowed: .* at most 8192"),
        (dict(height=48), "height 48 is not allowed"),
        (dict(steps=0), "steps is 0: use 1 to 200"),
        (dict(steps=201), "steps is 201: use 1 to 200"),
        (dict(batch_size=65), "batch size is 65: use 1 to 64"),
        (dict(guidance=float("nan")), "guidance is nan: use a number from 0 to 30"),
        (dict(guidance=float("inf")), "guidance is inf"),
        (dict(guidance=-1.0), "guidance is -1.0"),
        (dict(seed=-1), "seed -1 is out of range: use a whole number from 0 to 18446744073709551615"),
        (dict(seed=2**64), "seed 18446744073709551616 is out of range"),
    ],
)
def test_request_limits_name_the_limit(change, message):
    request = dict(width=64, height=64, steps=4, guidance=1.0, seed=0, batch_size=1) | change
    with pytest.raises(Flux2Error, match=message):
        check_request(**request)


def test_the_core_checks_limits_for_linked_node_values(files):
    # Linked values skip ComfyUI's widget validation; the core sees them anyway.
    model = load_transformer(files["model"])
    with pytest.raises(Flux2Error, match="steps is 500"):
        sample(SampleRequest(model, torch.zeros(1, 7, 96), SampleSettings(64, 64, 500, 1.0, 0)))


def test_a_request_that_cannot_fit_is_refused_with_the_numbers():
    with pytest.raises(
        Flux2Error, match=r"sampling x needs about 4.0 GB but CPU memory has 1.0 GB free: lower"
    ):
        check_fits(4 * 2**30, torch.device("cpu"), "sampling x", "lower the size", free=2**30)
    check_fits(2**30, torch.device("cpu"), "sampling x", "lower the size", free=2**31)  # fits: no error


def test_the_cli_refuses_an_impossible_request_before_loading_anything(files, tmp_path, caplog, monkeypatch):
    loaded = []
    monkeypatch.setattr("flux2_core.dit.files.load_component", lambda *a, **k: loaded.append(a))
    argv = _argv(files, tmp_path / "out.png", "--width", "8192", "--height", "8192", "--batch-size", "64")
    assert main(argv) == 2
    assert (
        "needs about" in caplog.text and "GB free" in caplog.text and "lower --width/--height" in caplog.text
    )
    assert not loaded and not list(tmp_path.iterdir())


# -- nothing half-written ------------------------------------------------------------------------------------


def test_an_interrupt_while_saving_leaves_no_file(files, tmp_path, monkeypatch, caplog):
    original = Image.Image.save

    def interrupted(self, fp, *args, **kwargs):
        original(self, fp, *args, **kwargs)
        Path(fp).write_bytes(Path(fp).read_bytes()[:20])  # half of the file is on disk...
        raise KeyboardInterrupt  # ...when the user presses Ctrl+C

    monkeypatch.setattr(Image.Image, "save", interrupted)
    assert main(_argv(files, tmp_path / "out.png", "--steps", "1", "--batch-size", "2")) == 130
    assert "interrupted" in caplog.text
    assert list(tmp_path.iterdir()) == []


def test_a_finished_run_leaves_only_its_images(files, tmp_path):
    assert main(_argv(files, tmp_path / "out.webp", "--steps", "1", "--batch-size", "2")) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out_1.webp", "out_2.webp"]
    assert Image.open(tmp_path / "out_1.webp").format == "WEBP"


# -- no silent wrong output ----------------------------------------------------------------------------------


def test_nan_weights_stop_the_run_with_the_likely_causes(files, tmp_path):
    sd = load_file(files["model"])
    sd["single_blocks.1.linear2.weight"][0, 0] = float("nan")
    save_file(sd, tmp_path / "nan.safetensors")
    model = load_transformer(tmp_path / "nan.safetensors")
    with pytest.raises(Flux2Error, match="NaN or infinite values.*corrupt or badly converted file"):
        sample(SampleRequest(model, torch.randn(1, 7, 96), SampleSettings(64, 64, 2, 1.0, 0)))


def test_a_vae_that_overflows_stops_the_decode(tmp_path):
    sd = random_vae_state_dict(seed=6)
    sd["decoder.conv_out.bias"][0] = float("inf")
    vae = load_vae(write_vae_file(sd, tmp_path / "flux2-vae.safetensors"))
    with pytest.raises(Flux2Error, match="decoding produced NaN or infinite pixels: the VAE overflowed"):
        vae.decode(torch.zeros(1, 128, 4, 4))


def test_base_model_with_guidance_one_says_cfg_is_off(files, caplog):
    caplog.set_level(logging.INFO)
    sample(
        SampleRequest(
            load_transformer(files["base"]), torch.randn(1, 7, 96), SampleSettings(64, 64, 1, 1.0, 0)
        )
    )
    assert "CFG is off" in caplog.text


def _png(path, array, **kw):
    Image.fromarray(array).save(path, **kw)
    return path


def test_images_load_as_a_viewer_shows_them(tmp_path):
    # 16-bit grey at 40000/65535 must not clip to white
    grey16 = cli_inputs.open_image(str(_png(tmp_path / "g16.png", np.full((70, 80), 40000, dtype=np.uint16))))
    assert isinstance(grey16, torch.Tensor) and grey16.shape == (70, 80, 3)
    assert grey16.max().item() == pytest.approx(40000 / 65535)
    # EXIF orientation 6 (rotate 90 degrees clockwise to view): a 100x70 file is shown 70x100
    exif = Image.Exif()
    exif[0x0112] = 6
    rotated = tmp_path / "rot.jpg"
    Image.fromarray(np.zeros((70, 100, 3), dtype=np.uint8)).save(rotated, exif=exif)
    assert cli_inputs.open_image(str(rotated)).size == (70, 100)
    # palette with transparency: colours kept, alpha dropped
    palette = Image.new("P", (64, 64), 1)
    palette.putpalette([0, 0, 0, 200, 30, 10] + [0] * 762)
    palette.info["transparency"] = 0
    palette.save(tmp_path / "pal.png")
    assert cli_inputs.open_image(str(tmp_path / "pal.png")).getpixel((5, 5)) == (200, 30, 10)


def test_a_decompression_bomb_is_refused(tmp_path, monkeypatch, caplog):
    path = _png(tmp_path / "bomb.png", np.zeros((100, 100, 3), dtype=np.uint8))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)  # PIL refuses over twice its limit
    with pytest.raises(Flux2Error, match="refused as a possible decompression bomb"):
        cli_inputs.open_image(str(path))


# -- clear errors only ---------------------------------------------------------------------------------------


def test_shard_indexes_and_model_index_files_are_checked(files, tmp_path):
    folder = tmp_path / "transformer"
    folder.mkdir()
    save_file(load_file(files["model"]), folder / "shard.safetensors")
    index = folder / "diffusion_pytorch_model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"img_in.weight": "../../elsewhere.safetensors"}}))
    with pytest.raises(Flux2Error, match="may only name .safetensors files in its own folder"):
        load_transformer(folder)
    index.write_text(json.dumps({"metadata": {}}))
    with pytest.raises(Flux2Error, match="has no valid weight_map"):
        load_transformer(folder)
    index.unlink()
    (tmp_path / "model_index.json").write_text("[1, 2]")
    with pytest.raises(Flux2Error, match="holds a JSON list, not an object"):
        load_transformer(folder)


def test_a_text_encoder_too_small_for_the_tokenizer_is_named():
    tensors = model_tensors(make_tiny_qwen3(seed=0, vocab_size=1000))
    with pytest.raises(Flux2Error, match="1000 token embeddings, fewer than the 151669 ids"):
        text_encoder_from_state_dict(tensors)


def test_a_weight_of_a_dtype_the_loader_does_not_take_is_named(files, tmp_path):
    sd = bfl_state_dict(make_diffusers_dit(seed=7, joint_attention_dim=96))
    sd["img_in.weight"] = sd["img_in.weight"].to(torch.int32)
    save_file(sd, tmp_path / "ints.safetensors")
    with pytest.raises(Flux2Error, match="stores img_in.weight as torch.int32, not a weight dtype"):
        load_transformer(tmp_path / "ints.safetensors")


def test_load_text_encoder_of_a_missing_file(tmp_path):
    with pytest.raises(Flux2Error, match="does not exist"):
        load_text_encoder(tmp_path / "nothing.safetensors")


def _bad_cli_cases(files, tmp_path):
    bomb_dir = tmp_path / "as_file"
    bomb_dir.write_text("a file, not a folder")
    return [
        (["--steps", "0"], "steps is 0: use 1 to 200"),
        (["--reference-max-pixels", "0"], "--reference-max-pixels 0 is too small"),
        (["--seed", "-1"], "seed -1 is out of range"),
        (["--seed", str(2**64)], "is out of range"),
        (["--guidance", "nan"], "guidance is nan"),
        (["--device", "cuda"] if not torch.cuda.is_available() else ["--device", "cuda:99"], "--device cuda"),
        (["--device", "toaster"], "--device toaster is not a device name"),
        (["--width", "8208"], "at most 8192"),
        (["--height", "0"], "--height 0 is not a size"),
        (["--batch-size", "0"], "batch size is 0"),
        (["--output", str(tmp_path)], "is a folder: give a file name"),
        (["--output", str(tmp_path / "out.txt")], "has no image extension"),
        (["--output", str(bomb_dir / "out.png")], "cannot create the output folder"),
        (["--reference", str(tmp_path / "missing.png")], "could not read the reference image"),
        (["--variant", "kv", "--text-encoder", str(files["vae"])], "not a language-model text encoder"),
    ]


def test_every_bad_cli_input_exits_with_one_clear_message_and_no_file(files, tmp_path, caplog):
    """main() returns 2 for each: an uncaught exception (a traceback for the user) would fail the test."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    for extra, message in _bad_cli_cases(files, tmp_path):
        caplog.clear()
        assert main(_argv(files, out_dir / "out.png", *extra)) == 2, extra
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and message in errors[0], (extra, errors)
        assert list(out_dir.iterdir()) == [], extra


def test_the_cli_shows_no_traceback_in_a_real_process(files, tmp_path):
    argv = _argv(files, tmp_path / "out.png", "--steps", "0")
    result = subprocess.run(
        [sys.executable, "-m", "flux2_core", *argv], capture_output=True, text=True, cwd=ROOT, timeout=300
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        result.stderr.strip().splitlines()[-1]
        == "error: steps is 0: use 1 to 200 steps (4 for distilled klein models, ~50 for base, dev and "
        "FLUX.1 Fill)"
    )


def test_corrupt_shapes_in_a_header_are_clear_errors(files, tmp_path):
    sd = load_file(files["model"])
    sd["double_blocks.0.img_attn.norm.query_norm.scale"] = torch.zeros(0)
    save_file(sd, tmp_path / "zero.safetensors")
    with pytest.raises(Flux2Error, match="tensor shapes do not form a diffusion model"):
        load_transformer(tmp_path / "zero.safetensors")
    sd = load_file(files["model"])
    sd["img_in.weight"] = sd["img_in.weight"].flatten()
    save_file(sd, tmp_path / "flat.safetensors")
    with pytest.raises(Flux2Error, match="tensor shapes do not form a diffusion model"):
        load_transformer(tmp_path / "flat.safetensors")
    sd = load_file(files["model"])
    sd["double_blocks.\u00b2.img_attn.qkv.weight"] = torch.zeros(1)  # a superscript two is no block number
    save_file(sd, tmp_path / "digit.safetensors")
    with pytest.raises(Flux2Error, match="has no valid block number"):
        load_transformer(tmp_path / "digit.safetensors")


def test_a_tensor_named_twice_and_a_missing_qkv_part_are_named(files, tmp_path):
    sd = load_file(files["model"])
    norm = "double_blocks.0.img_attn.norm.query_norm"
    sd[f"{norm}.weight"] = sd[f"{norm}.scale"].clone()  # ComfyUI's name beside BFL's
    save_file(sd, tmp_path / "twice.safetensors")
    with pytest.raises(
        Flux2Error, match="holds double_blocks.0.img_attn.norm.query_norm.scale more than once"
    ):
        load_transformer(tmp_path / "twice.safetensors")
    from tiny_dit import write_diffusers_folder

    root = write_diffusers_folder(make_diffusers_dit(seed=7), tmp_path / "repo")
    shards = sorted((root / "transformer").glob("*.safetensors"))
    tensors = {}
    for shard in shards:
        tensors.update(load_file(shard))
        shard.unlink()
    for index in (root / "transformer").glob("*.index.json"):
        index.unlink()
    del tensors["transformer_blocks.0.attn.to_k.weight"]
    save_file(tensors, root / "transformer" / "diffusion_pytorch_model.safetensors")
    with pytest.raises(Flux2Error, match="double_blocks.0.img_attn.qkv.weight is missing some of its parts"):
        load_transformer(root)


def test_a_patch_whose_halves_do_not_fit_is_refused(files):
    from flux2_core.ops import LowRankPatch

    layer = load_transformer(files["model"]).transformer.img_in
    with pytest.raises(ValueError, match="does not fit"):
        layer.add_patch("bad", LowRankPatch(torch.zeros(32, 2), torch.zeros(3, 128)))


def test_a_pixel_cap_that_would_shrink_a_reference_under_64_px_is_named():
    from flux2_core.references import scaled_size

    with pytest.raises(Flux2Error, match="would be 181x22, under 64 px a side: raise the pixel cap"):
        scaled_size(512, 64, 4096)


def test_editing_arguments_are_checked_before_anything_is_loaded(files, tmp_path, caplog, monkeypatch):
    loaded = []
    monkeypatch.setattr("flux2_core.dit.files.load_component", lambda *a, **k: loaded.append(a))
    image = _png(tmp_path / "img.png", np.zeros((64, 96, 3), dtype=np.uint8))
    for extra, message in [
        (["--image", str(image), "--strength", "1.5"], "strength (denoise) is 1.5"),
        (["--image", str(image)], "--width 64 differs from the output's width 96"),  # _argv gives 64x64
    ]:
        caplog.clear()
        assert main(_argv(files, tmp_path / "o.png", *extra)) == 2
        assert message in caplog.text, caplog.text
    assert not loaded


def test_a_16_bit_mask_is_scaled_not_clipped(tmp_path):
    path = _png(tmp_path / "m16.png", np.full((64, 80), 1000, dtype=np.uint16))
    mask = cli_inputs.open_mask(str(path), (80, 64))
    assert mask.max().item() == pytest.approx(1000 / 65535)


def test_an_entry_too_big_for_the_kv_store_leaves_the_others():
    from flux2_core.kv_store import RefKVStore

    class Cache:
        def __init__(self, size):
            self.size = size

        def nbytes(self):
            return self.size

    store = RefKVStore(max_bytes=20_000)
    for i in range(2):
        store._put(("m", "f32", "cpu", str(i)), Cache(8_000), torch.device("cpu"))
    store._put(("m", "f32", "cpu", "big"), Cache(40_000), torch.device("cpu"))
    assert len(store) == 2 and store.nbytes == 16_000


def test_the_out_of_memory_type_is_the_installed_torchs():
    """torch 2.4 (allowed by the package) has only torch.cuda.OutOfMemoryError; 2.5+ adds torch's alias."""
    from types import SimpleNamespace

    from flux2_core.errors import OutOfMemory, out_of_memory_type

    class CudaOOM(RuntimeError):
        pass

    old = SimpleNamespace(cuda=SimpleNamespace(OutOfMemoryError=CudaOOM))
    assert out_of_memory_type(old) is CudaOOM
    new = SimpleNamespace(OutOfMemoryError=MemoryError, cuda=old.cuda)
    assert out_of_memory_type(new) is MemoryError
    assert OutOfMemory is torch.cuda.OutOfMemoryError  # one class in this torch (2.5+: an alias)
