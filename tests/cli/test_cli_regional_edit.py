"""``--region`` with ``--reference`` on the command line: the exact cases against diffusers' whole plain edit
pipelines (tokenizer, Qwen3, DiT, VAE; klein distilled, base with CFG, 9B-KV) given the same prompts, images
and seed, a live case that moves the picture, and inpainting with regions."""

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinKVPipeline, Flux2KleinPipeline
from PIL import Image
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_text import make_tiny_qwen3, reference_hf_tokenizer, write_comfy_file
from tiny_vae import make_diffusers_vae, random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.cli.main import main

GLOBAL, REGION = "keep the room from image 1", "a person in a red coat"
SIZE = ["--width", "96", "--height", "64", "--seed", "4"]
MAX_DIFF = 3  # of 255, per pixel, against diffusers (both round to 8 bits)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_regional")
    qwen = make_tiny_qwen3(seed=5)  # 32 wide -> 96-wide conditioning
    vae_sd = random_vae_state_dict(seed=6)
    dit = make_diffusers_dit(seed=7, joint_attention_dim=96)
    paths = {
        "model": write_bfl_file(dit, root / "flux-2-klein-4b.safetensors"),
        "text_encoder": write_comfy_file(qwen, root / "qwen_3_4b.safetensors"),
        "vae": write_vae_file(vae_sd, root / "flux2-vae.safetensors"),
    }
    rng = np.random.default_rng(1)
    images = []
    for k, (w, h) in enumerate(((64, 64), (64, 80))):
        images.append(root / f"ref{k}.png")
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(images[-1])
    masks = {}
    for name, left in (("empty", 0), ("whole", 96), ("half", 48)):
        pixels = np.zeros((64, 96), dtype=np.uint8)
        pixels[:, :left] = 255
        masks[name] = root / f"{name}.png"
        Image.fromarray(pixels).save(masks[name])
    return {"paths": paths, "qwen": qwen, "vae": make_diffusers_vae(vae_sd), "images": images, "masks": masks}


def _models(files) -> list[str]:
    p = files["paths"]
    return [
        "generate",
        "--model",
        str(p["model"]),
        "--text-encoder",
        str(p["text_encoder"]),
        "--vae",
        str(p["vae"]),
    ]


def _run(files, out, *extra, prompt=GLOBAL):
    argv = _models(files)
    argv += ["--prompt", prompt] if prompt is not None else []
    for image in files["images"]:
        argv += ["--reference", str(image)]
    code = main([*argv, "--output", str(out), *SIZE, *extra])
    assert code == 0
    return np.asarray(Image.open(out)).astype(int)


VARIANTS = {  # --variant and its flags -> diffusers' pipeline of the plain edit
    "distilled": (["--variant", "distilled"], dict(is_distilled=True), dict(guidance_scale=1.0, steps=4)),
    "base_cfg": (
        ["--variant", "base", "--guidance", "3.5", "--steps", "3"],
        dict(is_distilled=False),
        dict(guidance_scale=3.5, steps=3),
    ),
    "kv": (["--variant", "kv"], None, dict(steps=4)),
}


def _diffusers(files, variant, prompt):
    _, kwargs, call = VARIANTS[variant]
    cls = Flux2KleinKVPipeline if kwargs is None else Flux2KleinPipeline
    pipe = cls(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential"),
        vae=files["vae"],
        text_encoder=files["qwen"],
        tokenizer=reference_hf_tokenizer(),
        transformer=make_diffusers_dit(seed=7, joint_attention_dim=96),
        **(kwargs or {}),
    )
    pipe.set_progress_bar_config(disable=True)
    extra = {} if "guidance_scale" not in call else {"guidance_scale": call["guidance_scale"]}
    with torch.no_grad():
        image = pipe(
            prompt=prompt,
            image=[Image.open(p).convert("RGB") for p in files["images"]],
            width=96,
            height=64,
            num_inference_steps=call["steps"],
            generator=torch.Generator("cpu").manual_seed(4),
            output_type="np",
            **extra,
        ).images[0]
    return (image * 255).round().astype(int)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_exact_cases_are_diffusers_plain_edits(files, tmp_path, variant):
    flags = VARIANTS[variant][0]
    masks = files["masks"]
    plain = _run(files, tmp_path / "plain.png", *flags)
    # a global prompt, the references and a region whose mask is empty: the plain edit of the global prompt
    empty = _run(files, tmp_path / "empty.png", *flags, "--region", REGION, str(masks["empty"]))
    assert np.array_equal(empty, plain)
    assert np.abs(empty - _diffusers(files, variant, GLOBAL)).max() <= MAX_DIFF
    # one region over the whole picture, no global prompt: the plain edit of the region's prompt
    whole = _run(files, tmp_path / "whole.png", *flags, "--region", REGION, str(masks["whole"]), prompt=None)
    assert np.abs(whole - _diffusers(files, variant, REGION)).max() <= MAX_DIFF
    # every reference at 0: the regional run without the references
    half = ["--region", REGION, str(masks["half"])]
    off = _run(files, tmp_path / "off.png", *flags, *half, "--reference-strength", "0")
    argv = _models(files)
    assert main([*argv, "--prompt", GLOBAL, *half, *flags, *SIZE, "--output", str(tmp_path / "t2i.png")]) == 0
    assert np.array_equal(off, np.asarray(Image.open(tmp_path / "t2i.png")).astype(int))
    # and a half-image region with the references moves the picture away from the plain edit
    moved = _run(files, tmp_path / "half.png", *flags, *half)
    assert np.abs(moved - plain).mean() > 1.0


def test_regions_inpaint_with_the_picture_as_reference_one(files, tmp_path):
    # --mask makes the picture to repaint reference 1: the regions now go with it; outside the mask the
    # picture is kept
    masks, argv = files["masks"], _models(files)
    picture = tmp_path / "picture.png"
    Image.fromarray(np.random.default_rng(2).integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(picture)
    out = tmp_path / "inpainted.png"
    code = main([*argv, "--prompt", GLOBAL, "--image", str(picture), "--mask", str(masks["half"]),
                 "--region", REGION, str(masks["half"]), "--seed", "4", "--output", str(out)])  # fmt: skip
    assert code == 0
    got, kept = np.asarray(Image.open(out)).astype(int), np.asarray(Image.open(picture)).astype(int)
    assert np.array_equal(got[:, 64:], kept[:, 64:])  # right of the mask (and its feather): the original


def test_regions_outpaint_with_the_picture_as_reference_one(files, tmp_path):
    # --outpaint: the region's mask (the right half, any size) is stretched to the larger canvas, and its
    # prompt paints the new area; the original area is kept
    argv, right = _models(files), tmp_path / "right.png"
    Image.fromarray(np.repeat(np.array([[0, 255]], dtype=np.uint8), 8, axis=0)).save(right)
    picture = tmp_path / "picture.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (64, 96, 3), dtype=np.uint8)).save(picture)
    out, plain = tmp_path / "outpainted.png", tmp_path / "plain.png"
    common = [*argv, "--prompt", GLOBAL, "--image", str(picture), "--outpaint", "0,0,32,0", "--seed", "4"]
    assert main([*common, "--region", REGION, str(right), "--output", str(out)]) == 0
    assert main([*common, "--output", str(plain)]) == 0
    got, kept = np.asarray(Image.open(out)).astype(int), np.asarray(Image.open(picture)).astype(int)
    assert got.shape == (64, 128, 3) and np.array_equal(got[:, :64], kept[:, :64])
    assert np.abs(got[:, 96:] - np.asarray(Image.open(plain)).astype(int)[:, 96:]).mean() > 1.0


def test_the_memory_check_counts_the_references_in_the_regional_mask(files, monkeypatch):
    # the activations the command line checks before loading: with regions, the grouped attention gathers
    # the references' keys too (and the references' own queries)
    import flux2_core.cli.run as run
    from flux2_core.dit.files import load_transformer
    from flux2_core.errors import Flux2Error
    from flux2_core.steering.regions import regional_cost

    seen = []

    def stop(device, dit_bytes, te_bytes, activations, *rest):
        seen.append(activations)
        raise Flux2Error("stopped after the memory check")

    monkeypatch.setattr(run.inputs, "check_memory", stop)
    region = ["--region", REGION, str(files["masks"]["half"])]
    p = files["paths"]
    for extra, refs in (([], True), (region, True), ([], False), (region, False)):
        argv = _models(files) + ["--prompt", GLOBAL, *SIZE, "--output", "unused.png", *extra]
        for image in files["images"] if refs else ():
            argv += ["--reference", str(image)]
        assert main(argv) == 2
    edit, regional_edit, plain, regional = seen
    hidden = load_transformer(p["model"]).config.hidden_size
    ref_tokens = (64 * 64 + 64 * 80) // 256
    gathered = [regional_cost([512, 512], (4, 6), hidden, 4, 1, n)[1] for n in (ref_tokens, 0)]
    assert gathered[0] > gathered[1]
    # the rest grows by the same rows per token with or without regions
    assert (regional_edit - edit) - (regional - plain) == gathered[0] - gathered[1]
