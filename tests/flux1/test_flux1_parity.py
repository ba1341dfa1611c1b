"""FLUX.1 Fill [dev] against Hugging Face diffusers' FluxFillPipeline on the same tiny random weights.

The references are diffusers' ``FluxTransformer2DModel`` / ``AutoencoderKL`` / ``FluxFillPipeline`` and
transformers' ``T5EncoderModel`` / ``CLIPTextModel`` (``tiny_flux1``). Their weights are written in the file
layouts users have (diffusers names and folders, BFL names bare and under ``model.diffusion_model.``,
ComfyUI's ``clip_l`` / ``t5xxl`` single files, HF folders) and read back through the product's loaders.
Whole runs get the same prompts (through the same tokenizer folders on both sides: generated ones with the
real vocabulary sizes and special ids, and ComfyUI's own when ``COMFYUI_PATH`` is set), the same image and
mask, and the same noise: ComfyUI's seed convention, drawn here and handed to diffusers as
``latents=``. Everything runs in float32 on the CPU; the tiny VAE's posterior is deterministic.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKL, FluxFillPipeline
from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
from loader_contract import LoaderContract
from tiny_dit import make_diffusers_dit
from tiny_dit import write_bfl_file as write_klein_dit
from tiny_flux1 import (
    PARITY_VAE,
    bfl_fill_state_dict,
    fill_scheduler,
    make_diffusers_fill_dit,
    make_diffusers_flux1_vae,
    make_parity_clip,
    make_parity_t5,
    save_tensors,
    write_tokenizer_folders,
)
from transformers import CLIPTokenizer, T5TokenizerFast

from flux2_core.dit.call import CallExtras
from flux2_core.dit.step_cache import StepCache
from flux2_core.editing import outpaint_canvas
from flux2_core.flux1 import (
    FillSettings,
    fill_inputs,
    load_fill_text_encoder,
    load_fill_transformer,
    load_flux1_vae,
    pack_latent,
    sample_fill,
    unpack_latent,
)
from flux2_core.flux1.text import load_clip, load_t5
from flux2_core.flux1.tokenizers import tokenize
from flux2_core.flux1.transformer import image_ids, text_ids

TOLERANCE = 1e-4  # max abs difference on the final latents (the bound asked of parity), float32 on the CPU
SCALE, SHIFT = 0.3611, 0.1159  # the FLUX.1 VAE's latent normalisation (BFL, diffusers)
PROMPTS = ["A painting of a squirrel eating a burger", "a red fox in the snow, oil on canvas"]
FBC_STEPS = 12
# the first block's residual changes by about 0.45-0.8 of its size per step on these random weights (real
# models: 0.05-0.3), so these thresholds skip 1, 6 and 10 of the 12 steps
FBC_THRESHOLDS = (0.5, 0.6, 0.7)


@pytest.fixture(scope="module")
def refs():
    return {
        "dit": make_diffusers_fill_dit(seed=1),
        "vae": make_diffusers_flux1_vae(seed=2),
        "t5": make_parity_t5(seed=3),
        "clip": make_parity_clip(seed=4),
    }


@pytest.fixture(scope="module")
def files(refs, tmp_path_factory):
    root = tmp_path_factory.mktemp("flux1")
    t5_sd = {k: v for k, v in refs["t5"].state_dict().items() if k != "encoder.embed_tokens.weight"}
    clip_sd = refs["clip"].state_dict()
    assert not any(k.startswith("text_model.") for k in clip_sd)  # transformers 5: flat names
    clip_dir, t5_dir = write_tokenizer_folders(root / "comfy")
    return {
        "dit": save_tensors(refs["dit"].state_dict(), root / "transformer" / "flux1-fill-dev.safetensors"),
        "vae": save_tensors(refs["vae"].state_dict(), root / "vae" / "diffusion_pytorch_model.safetensors"),
        "t5": save_tensors(t5_sd, root / "text_encoders" / "t5xxl_fp16.safetensors"),
        "clip": save_tensors(clip_sd, root / "text_encoders" / "clip_l.safetensors", prefix="text_model."),
        "tokenizers": [clip_dir, t5_dir],
    }


@pytest.fixture(scope="module")
def ours(files):
    return {
        "dit": load_fill_transformer(files["dit"]),
        "vae": load_flux1_vae(files["vae"]),
        "text": load_fill_text_encoder(files["t5"], files["clip"], tokenizers=files["tokenizers"]),
    }


@pytest.fixture(scope="module")
def pipe(refs, files):
    clip_dir, t5_dir = files["tokenizers"]
    pipe = FluxFillPipeline(
        scheduler=fill_scheduler(),
        vae=refs["vae"],
        text_encoder=refs["clip"],
        # the folder says 8192 (as ComfyUI's); the pipeline pads CLIP to it unless overridden
        tokenizer=CLIPTokenizer.from_pretrained(str(clip_dir), model_max_length=77),
        text_encoder_2=refs["t5"],
        tokenizer_2=T5TokenizerFast.from_pretrained(str(t5_dir)),
        transformer=refs["dit"],
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _dit_inputs(batch=2, rows=4, cols=6, length=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, rows * cols, 384, generator=g)
    ctx = torch.randn(batch, length, 32, generator=g)
    pooled = torch.randn(batch, 128, generator=g)
    t = torch.tensor([0.7, 0.3][:batch])
    guidance = torch.tensor([30.0, 3.5][:batch])
    return x, ctx, pooled, t, guidance, image_ids(rows, cols), text_ids(length)


def _diffusers_dit(dit, inputs):
    x, ctx, pooled, t, guidance, x_ids, ctx_ids = inputs
    with torch.no_grad():
        return dit(
            hidden_states=x,
            encoder_hidden_states=ctx,
            pooled_projections=pooled,
            timestep=t,
            img_ids=x_ids.float(),
            txt_ids=ctx_ids.float(),
            guidance=guidance,
        ).sample


def _our_dit(model, inputs):
    x, ctx, pooled, t, guidance, x_ids, ctx_ids = inputs
    with torch.no_grad():
        return model.transformer(x, x_ids, t, ctx, CallExtras(pooled=pooled, guidance=guidance))


# ---- the DiT ---------------------------------------------------------------------------------------------


def test_our_dit_weights_are_bfls_key_table(refs, ours):
    # our loaded model's state dict: its names and values are BFL's (BFL's key table, diffusers' map inverted)
    sd = ours["dit"].transformer.state_dict()
    reference = bfl_fill_state_dict(refs["dit"])
    assert len(sd) == 20 + 24 * 2 + 8 * 2  # BFL: top level + per double block + per single block
    assert set(sd) == set(reference)
    assert all(torch.equal(sd[k], reference[k]) for k in reference)


class TestFillLoader(LoaderContract):
    """The FLUX.1 Fill loader on diffusers' file and folder and BFL's file (plain and ComfyUI-prefixed)."""

    LAYOUTS = ("diffusers file", "diffusers folder", "BFL", "BFL prefixed")
    FOREIGN = {
        "klein DiT": r"flux-2-klein-4b.* is a FLUX.2 model.*choose flux1-fill-dev",
        "FLUX.1 dev": r"FLUX.1 \[dev\] / \[schnell\] / Kontext, not FLUX.1 Fill \[dev\].*choose flux1-fill",
    }
    MISSING = "single_blocks.1.linear2.weight"
    FILE_NAME = "flux1-fill-dev.safetensors"
    ATOL = 2e-5  # measured 1.9e-6 on outputs of mean size ~1

    def make_reference(self):
        return make_diffusers_fill_dit(seed=1)

    def write(self, layout, reference, folder):
        if layout == "diffusers file":
            return save_tensors(reference.state_dict(), folder / "transformer" / self.FILE_NAME)
        if layout == "diffusers folder":
            reference.save_pretrained(folder / "repo" / "transformer", max_shard_size="1MB")
            return folder / "repo"
        prefix = "model.diffusion_model." if layout == "BFL prefixed" else ""
        return save_tensors(bfl_fill_state_dict(reference), folder / self.FILE_NAME, prefix)

    def write_foreign(self, name, folder):
        if name == "klein DiT":
            return write_klein_dit(make_diffusers_dit(seed=3), folder / "flux-2-klein-4b.safetensors")
        dev = bfl_fill_state_dict(make_diffusers_fill_dit(in_channels=64))
        return save_tensors(dev, folder / "flux1-dev.safetensors")

    def load(self, path):
        return load_fill_transformer(path)

    def make_inputs(self):
        return _dit_inputs()

    def run(self, model, inputs):
        assert model.config.in_channels == 384 and model.config.num_heads == 2
        return _our_dit(model, inputs)

    def run_reference(self, reference, inputs):
        return _diffusers_dit(reference, inputs)

    def state_dict(self, reference):
        return bfl_fill_state_dict(reference)


def test_dit_reads_every_input(refs, ours):
    # The parity above would hold trivially for an input both sides ignored: each must move the output.
    base = _dit_inputs()
    out = _our_dit(ours["dit"], base)
    x, ctx, pooled, t, guidance, x_ids, ctx_ids = base
    flipped_mask = torch.cat([x[..., :128], 1 - x[..., 128:]], -1)
    negated_image = torch.cat([x[..., :64], -x[..., 64:128], x[..., 128:]], -1)
    changed = {
        "guidance": (x, ctx, pooled, t, guidance * 0 + 10.0, x_ids, ctx_ids),
        "pooled": (x, ctx, pooled + 1, t, guidance, x_ids, ctx_ids),
        "text": (x, ctx + 1, pooled, t, guidance, x_ids, ctx_ids),
        "mask channels": (flipped_mask, ctx, pooled, t, guidance, x_ids, ctx_ids),
        "masked image": (negated_image, ctx, pooled, t, guidance, x_ids, ctx_ids),
    }
    for what, inputs in changed.items():
        moved = (_our_dit(ours["dit"], inputs) - out).abs().max().item()
        assert moved > 1e-2, what
        assert (_diffusers_dit(refs["dit"], inputs) - _our_dit(ours["dit"], inputs)).abs().max() < 2e-5, what


# ---- text encoders ---------------------------------------------------------------------------------------


def _ids(seed=0):
    """Ids shaped as the tokenizers give them: T5 ending in </s> (1), then <pad> (0); CLIP from BOS to EOS,
    padded with EOS."""
    g = torch.Generator().manual_seed(seed)
    t5 = torch.randint(3, 32100, (2, 512), generator=g)
    t5[0, 9], t5[0, 10:], t5[1, 40], t5[1, 41:] = 1, 0, 1, 0
    clip = torch.randint(0, 49406, (2, 77), generator=g)
    clip[:, 0], clip[0, 10:], clip[1, 30:] = 49406, 49407, 49407
    return t5, clip


@pytest.mark.parametrize("layout", ["ComfyUI files", "HF folders"])
def test_text_encoders_match_transformers(refs, files, tmp_path, layout):
    if layout == "ComfyUI files":
        t5_path, clip_path = files["t5"], files["clip"]
    else:
        refs["t5"].save_pretrained(tmp_path / "text_encoder_2")
        refs["clip"].save_pretrained(tmp_path / "text_encoder")
        t5_path, clip_path = tmp_path / "text_encoder_2", tmp_path / "text_encoder"
    t5, clip = load_t5(t5_path), load_clip(clip_path)
    assert (t5.shape.d_kv, t5.shape.num_heads, clip.shape.num_heads) == (16, 4, 2)
    t5_ids, clip_ids = _ids()
    with torch.no_grad():
        want_t5 = refs["t5"](input_ids=t5_ids).last_hidden_state
        got_t5 = t5.model(input_ids=t5_ids).last_hidden_state
        want_pooled = refs["clip"](input_ids=clip_ids).pooler_output
        got_pooled = clip.model(input_ids=clip_ids).pooler_output
    assert got_t5.shape == (2, 512, 32) and got_pooled.shape == (2, 128)
    assert (got_t5 - want_t5).abs().max().item() < 1e-5  # measured 0.0
    assert (got_pooled - want_pooled).abs().max().item() < 1e-5  # measured 0.0


def test_prompt_encoding_matches_the_pipeline(ours, pipe):
    cond = ours["text"].encode(PROMPTS)
    with torch.no_grad():  # as the pipeline's __call__ (autograd picks other kernels: 4e-5 apart in T5)
        t5, pooled, _ = pipe.encode_prompt(PROMPTS, prompt_2=None, max_sequence_length=512)
    assert cond.t5.shape == (2, 512, 32) and cond.pooled.shape == (2, 128)
    assert (cond.t5 - t5).abs().max().item() < 1e-5
    assert (cond.pooled - pooled).abs().max().item() < 1e-5
    assert (cond.t5[0] - cond.t5[1]).abs().max() > 1e-2  # the two prompts differ


# ---- the VAE ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["diffusers file", "diffusers folder", "BFL"])
def test_vae_encode_and_decode_match_diffusers(refs, ours, tmp_path, layout):
    vae = refs["vae"]
    if layout == "diffusers file":
        model = ours["vae"]
    elif layout == "diffusers folder":
        vae.save_pretrained(tmp_path / "repo" / "vae")
        model = load_flux1_vae(tmp_path / "repo")
    else:
        sd = ours["vae"].state_dict()
        assert len(sd) == 244  # the real ae.safetensors' tensor count: same structure
        # diffusers' own LDM/BFL -> diffusers converter takes our names strictly: they are BFL's
        fresh = AutoencoderKL(**PARITY_VAE)
        fresh.load_state_dict(convert_ldm_vae_checkpoint(sd, fresh.config), strict=True)
        assert all(torch.equal(v, vae.state_dict()[k]) for k, v in fresh.state_dict().items())
        model = load_flux1_vae(save_tensors(sd, tmp_path / "ae.safetensors"))
    g = torch.Generator().manual_seed(0)
    pixels = torch.rand(2, 3, 64, 96, generator=g) * 2 - 1
    latent = torch.randn(2, 16, 8, 12, generator=g)
    with torch.no_grad():
        mean = vae.encode(pixels).latent_dist.mean
        got = model.encode(pixels)
        want_pixels = vae.decode(latent).sample
        got_pixels = model.decode(latent)
    assert got.shape == (2, 16, 8, 12)  # the raw posterior mean: ComfyUI's FLUX.1 LATENT
    # measured 2.5e-6 / 8.7e-6 with one thread (0.0 with two): summation order only
    assert (got - mean).abs().max().item() < 5e-5
    assert (got_pixels - want_pixels).abs().max().item() < 5e-5


# ---- the Fill conditioning -------------------------------------------------------------------------------


def _soft_mask(batch, height, width, seed):
    """A rectangle to paint with soft values on both sides of 0.5 (both sides binarise them at 0.5), a
    0.996 "white" patch from an 8-bit PNG, and a 0.3 patch that stays unpainted."""
    mask = torch.zeros(batch, height, width)
    for b in range(batch):
        top, left = 8 + 8 * b + seed % 8, 16 + 4 * b
        mask[b, top : top + height // 2, left : left + width // 2] = 0.7
        mask[b, top : top + 5, left : left + 9] = 254 / 255
        mask[b, -6:, :7] = 0.3
    return mask


def _image(batch, height, width, seed):
    return torch.rand(batch, 3, height, width, generator=torch.Generator().manual_seed(seed))


def test_fill_conditioning_matches_prepare_mask_latents(ours, pipe):
    height, width = 64, 96
    image, mask = _image(2, height, width, 7), _soft_mask(2, height, width, 3)
    fill = fill_inputs(ours["vae"], image * 2 - 1, mask)
    # diffusers' own preprocessing and conditioning, as its __call__ does them
    init = pipe.image_processor.preprocess(image, height=height, width=width)
    binary = pipe.mask_processor.preprocess(mask[:, None], height=height, width=width)
    want_mask, want_latent = pipe.prepare_mask_latents(
        binary, init * (1 - binary), 2, 16, 1, height, width, torch.float32, "cpu",
        torch.Generator().manual_seed(0),
    )  # fmt: skip
    want = torch.cat([want_latent, want_mask], dim=-1)
    assert fill.tokens.shape == want.shape == (2, 24, 320) and fill.grid == (4, 6)
    assert torch.equal(fill.tokens[..., 64:], want[..., 64:])  # the mask channels, exactly
    # posterior std 3e-7 on diffusers' side; measured 8.3e-7
    assert (fill.tokens[..., :64] - want[..., :64]).abs().max().item() < 1e-5


def test_pack_latent_is_diffusers_packing():
    latent = torch.randn(2, 16, 8, 12)
    packed = FluxFillPipeline._pack_latents(latent, 2, 16, 8, 12)
    assert torch.equal(pack_latent(latent), packed)
    assert torch.equal(unpack_latent(packed, (4, 6)), FluxFillPipeline._unpack_latents(packed, 64, 96, 8))


# ---- whole runs ------------------------------------------------------------------------------------------


def _comfy_noise(batch, height, width, seed):
    """ComfyUI's noise (comfy/sample.py, prepare_noise): one float32 randn([B, 16, H/8, W/8]) from the CPU
    generator seeded with the seed; given to diffusers as its latents."""
    shape = [batch, 16, height // 8, width // 8]
    return torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed))


def _diffusers_run(pipe, prompts, image, mask, steps, guidance, seed):
    batch, _, height, width = image.shape
    noise = _comfy_noise(batch, height, width, seed)
    out = pipe(
        prompt=prompts,
        image=image,
        mask_image=mask[:, None],
        height=height,
        width=width,
        num_inference_steps=steps,
        guidance_scale=guidance,
        generator=torch.Generator().manual_seed(0),
        latents=FluxFillPipeline._pack_latents(noise, batch, 16, height // 8, width // 8),
        output_type="latent",
        max_sequence_length=512,
    )
    return out.images


def _outpaint_case(seed):
    """A 48x64 image on a 64x96 canvas (16 px left and right, 16 below), the new area masked, feathered."""
    source = _image(1, 48, 64, seed)[0].permute(1, 2, 0)
    canvas, mask = outpaint_canvas(source, left=16, top=0, right=16, bottom=16, feather=8)
    return canvas.permute(2, 0, 1)[None], mask[None]


RUNS = {
    # name: (batch, height, width, steps, guidance, seed)
    "inpaint-64x96": (1, 64, 96, 3, 30.0, 5),
    "inpaint-128x80": (1, 128, 80, 2, 3.5, 11),
    "outpaint-64x96": (1, 64, 96, 3, 30.0, 17),
    "batch2-64x96": (2, 64, 96, 2, 30.0, 23),
}


@pytest.mark.parametrize("case", list(RUNS))
def test_whole_run_matches_flux_fill_pipeline(ours, pipe, case):
    batch, height, width, steps, guidance, seed = RUNS[case]
    if case.startswith("outpaint"):
        image, mask = _outpaint_case(seed)
        assert mask[0, :, :16].min() == 1 and mask[0, 16:40, 24:40].max() == 0  # padding painted, centre kept
    else:
        image, mask = _image(batch, height, width, seed), _soft_mask(batch, height, width, seed)
    prompts = PROMPTS[:batch]
    want = _diffusers_run(pipe, prompts, image, mask, steps, guidance, seed)
    fill = fill_inputs(ours["vae"], image * 2 - 1, mask)
    settings = FillSettings(seed=seed, steps=steps, guidance=guidance, batch_size=batch)
    raw = sample_fill(ours["dit"], ours["text"].encode(prompts), fill, settings)
    assert raw.shape == (batch, 16, height // 8, width // 8)  # ComfyUI's raw FLUX.1 LATENT
    got = pack_latent((raw - SHIFT) * SCALE)
    diff = (got - want).abs().max().item()
    assert diff < TOLERANCE, f"{case}: {diff}"  # measured 1.5e-6 .. 1.6e-5 on latents of mean size 1.2
    assert want.abs().mean() > 0.1  # a real latent, not a collapsed one
    if batch == 2:
        assert (got[0] - got[1]).abs().max() > 1e-2


def test_the_seed_is_the_noise(ours, pipe):
    # Another seed is another image (on both sides), so the match above is the seed's noise, not luck.
    image, mask = _image(1, 64, 96, 5), _soft_mask(1, 64, 96, 5)
    fill = fill_inputs(ours["vae"], image * 2 - 1, mask)
    cond = ours["text"].encode(PROMPTS[:1])
    a = sample_fill(ours["dit"], cond, fill, FillSettings(seed=5, steps=1))
    b = sample_fill(ours["dit"], cond, fill, FillSettings(seed=6, steps=1))
    assert (a - b).abs().max() > 1e-1
    want = _diffusers_run(pipe, PROMPTS[:1], image, mask, 1, 30.0, 6)
    assert (pack_latent((b - SHIFT) * SCALE) - want).abs().max().item() < TOLERANCE


# ---- the real tokenizers (a ComfyUI checkout) ------------------------------------------------------------

# The ids of PROMPTS[0] (the prompt of diffusers' tests/pipelines/flux/test_pipeline_flux_fill.py) from
# ComfyUI's own tokenizer files, read by transformers: comfy/sd1_tokenizer through
# CLIPTokenizer(model_max_length=77), comfy/text_encoders/t5_tokenizer through T5TokenizerFast.
CLIP_IDS = [49406, 320, 3086, 539, 320, 14004, 4371, 320, 6548, 49407]
T5_IDS = [71, 3924, 13, 3, 9, 26364, 3182, 3, 9, 3, 9079, 1]


def _comfy_tokenizers() -> tuple[Path, Path]:
    root = os.environ.get("COMFYUI_PATH")
    if not root:
        pytest.skip("COMFYUI_PATH is not set: the real CLIP and T5 tokenizer files come from a ComfyUI tree")
    clip, t5 = Path(root) / "comfy" / "sd1_tokenizer", Path(root) / "comfy" / "text_encoders" / "t5_tokenizer"
    for folder in (clip, t5):
        if not folder.is_dir():
            pytest.skip(f"COMFYUI_PATH has no {folder}")
    return clip, t5


@pytest.mark.comfyui
def test_real_tokenizers_end_to_end(refs, files):
    clip_dir, t5_dir = _comfy_tokenizers()
    encoder = load_fill_text_encoder(files["t5"], files["clip"], tokenizers=[t5_dir, clip_dir])
    prompt = PROMPTS[0]
    clip_ids = tokenize(encoder.clip_tokenizer, [prompt], 77, "CLIP")[0].tolist()
    t5_ids = tokenize(encoder.t5_tokenizer, [prompt], 512, "T5")[0].tolist()
    assert clip_ids == CLIP_IDS + [49407] * (77 - len(CLIP_IDS))
    assert t5_ids == T5_IDS + [0] * (512 - len(T5_IDS))
    real = FluxFillPipeline(
        scheduler=fill_scheduler(),
        vae=refs["vae"],
        text_encoder=refs["clip"],
        tokenizer=CLIPTokenizer.from_pretrained(str(clip_dir), model_max_length=77),
        text_encoder_2=refs["t5"],
        tokenizer_2=T5TokenizerFast.from_pretrained(str(t5_dir)),
        transformer=refs["dit"],
    )
    real.set_progress_bar_config(disable=True)
    image, mask = _image(1, 64, 96, 5), _soft_mask(1, 64, 96, 5)
    want = _diffusers_run(real, [prompt], image, mask, 3, 30.0, 5)
    fill = fill_inputs(load_flux1_vae(files["vae"]), image * 2 - 1, mask)
    raw = sample_fill(load_fill_transformer(files["dit"]), encoder.encode(prompt), fill, FillSettings(5, 3))
    assert (pack_latent((raw - SHIFT) * SCALE) - want).abs().max().item() < TOLERANCE


# ---- the First-Block Cache against diffusers' own ------------------------------------------------------


@pytest.mark.parametrize("threshold", FBC_THRESHOLDS)
def test_the_step_cache_is_diffusers_first_block_cache(ours, pipe, threshold):
    # diffusers' rule on its own FLUX.1 transformer (FirstBlockCacheConfig through enable_cache, the pipeline
    # call inside one cache_context), ours through sample_fill's step_cache, same weights, seed, schedule
    from diffusers.hooks import FirstBlockCacheConfig

    batch, height, width, steps, guidance, seed = 1, 64, 96, FBC_STEPS, 30.0, 5
    image, mask = _image(batch, height, width, seed), _soft_mask(batch, height, width, seed)
    pipe.transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    try:
        pipe.transformer._reset_stateful_cache()
        with pipe.transformer.cache_context("cond"):
            want = _diffusers_run(pipe, PROMPTS[:1], image, mask, steps, guidance, seed)
    finally:
        pipe.transformer.disable_cache()
    fill = fill_inputs(ours["vae"], image * 2 - 1, mask)
    cache = StepCache(threshold)
    settings = FillSettings(seed=seed, steps=steps, guidance=guidance, batch_size=batch)
    raw = sample_fill(ours["dit"], ours["text"].encode(PROMPTS[:1]), fill, settings, step_cache=cache)
    got = pack_latent((raw - SHIFT) * SCALE)
    assert (got - want).abs().max().item() < TOLERANCE
    assert 1 < cache.passes[0].full_steps < steps  # the threshold skips steps here, not all of them


def test_a_step_cache_of_zero_is_no_cache(ours):
    image, mask = _image(1, 64, 96, 5), _soft_mask(1, 64, 96, 5)
    fill = fill_inputs(ours["vae"], image * 2 - 1, mask)
    cond, settings = ours["text"].encode(PROMPTS[:1]), FillSettings(seed=5, steps=3)
    cache = StepCache(0.0)
    plain = sample_fill(ours["dit"], cond, fill, settings)
    assert torch.equal(sample_fill(ours["dit"], cond, fill, settings, step_cache=cache), plain)
    assert cache.passes == []
