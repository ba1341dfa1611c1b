"""The FLUX.2 VAE against diffusers' AutoencoderKLFlux2 and Flux2KleinPipeline latent handling, any layout."""

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLFlux2
from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline
from tiny_vae import (
    TINY_SMALL_DECODER_VAE,
    TINY_VAE,
    bare_decoder,
    comfy_layout,
    full_size_vae_state_dict,
    make_diffusers_vae,
    random_vae_state_dict,
    write_bfl_file,
    write_diffusers_folder,
)

from flux2_core.errors import Flux2Error
from flux2_core.vae.autoencoder import (
    FLUX2_SMALL_DECODER_VAE,
    FLUX2_VAE,
    AutoEncoder,
    denormalize,
    load_vae,
    normalize,
    patchify,
    unpatchify,
    vae_config,
    vae_from_state_dict,
    vae_shapes,
)

TOL = 1e-4  # float32 CPU; the measured difference is a few 1e-6


@pytest.fixture(scope="module")
def weights():
    return random_vae_state_dict(TINY_VAE, seed=1)


@pytest.fixture(scope="module")
def files(weights, tmp_path_factory):
    root = tmp_path_factory.mktemp("vae")
    full_checkpoint = {f"first_stage_model.{k}": v for k, v in weights.items()}
    full_checkpoint["model.diffusion_model.img_in.weight"] = torch.zeros(4, 4)  # a DiT beside it is ignored
    repo = write_diffusers_folder(weights, root / "repo")
    return {
        "bfl": write_bfl_file(weights, root / "flux2-vae.safetensors"),
        "vae_prefix": write_bfl_file(weights, root / "merged.safetensors", prefix="vae."),
        "first_stage_model": write_bfl_file(full_checkpoint, root / "checkpoint.safetensors"),
        "comfy": write_bfl_file(comfy_layout(weights), root / "comfy-flux2-vae.safetensors"),
        "diffusers_repo": repo,
        "diffusers_vae_folder": repo / "vae",
        "diffusers_file": repo / "vae" / "diffusion_pytorch_model.safetensors",
    }


@pytest.fixture(scope="module")
def ours(files):
    return load_vae(files["bfl"])


@pytest.fixture(scope="module")
def reference(files):
    return AutoencoderKLFlux2.from_pretrained(files["diffusers_vae_folder"]).eval()


@pytest.fixture
def pixels():
    g = torch.Generator().manual_seed(3)
    return torch.rand(2, 3, 64, 96, generator=g) * 2 - 1  # non-square, so a swapped H/W shows


def diffusers_encode(vae, pixels):
    """Flux2KleinPipeline._encode_vae_image itself: mode() -> _patchify_latents -> BN with vae.bn stats."""
    pipe = SimpleNamespace(vae=vae, _patchify_latents=Flux2KleinPipeline._patchify_latents)
    with torch.no_grad():
        return Flux2KleinPipeline._encode_vae_image(pipe, pixels, generator=None)


def diffusers_decode(vae, latents):
    """The tail of Flux2KleinPipeline.__call__: de-normalize, _unpatchify_latents, vae.decode."""
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    with torch.no_grad():
        latents = Flux2KleinPipeline._unpatchify_latents(latents * std + mean)
        return vae.decode(latents, return_dict=False)[0]


def test_encode_matches_diffusers(ours, reference, pixels):
    latent = ours.encode(pixels)
    assert latent.shape == (2, 128, 4, 6) and latent.dtype == torch.float32
    diff = (latent - diffusers_encode(reference, pixels)).abs().max().item()
    assert diff <= TOL, diff


def test_decode_matches_diffusers(ours, reference):
    latent = torch.randn(2, 128, 4, 6, generator=torch.Generator().manual_seed(4))
    image = ours.decode(latent)
    assert image.shape == (2, 3, 64, 96) and image.dtype == torch.float32
    diff = (image - diffusers_decode(reference, latent)).abs().max().item()
    assert diff <= TOL, diff


def test_encode_decode_under_inference_mode(ours, pixels):
    with torch.inference_mode():
        image = ours.decode(ours.encode(pixels))
    assert image.shape == pixels.shape and torch.isfinite(image).all()


@pytest.mark.parametrize(
    "layout",
    ["vae_prefix", "first_stage_model", "comfy", "diffusers_repo", "diffusers_vae_folder", "diffusers_file"],
)
def test_every_layout_loads_the_same_module(files, ours, layout):
    other = load_vae(files[layout])
    assert other.config == ours.config == TINY_VAE
    expected, got = ours.state_dict(), other.state_dict()
    assert set(got) == set(expected)
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), key


def test_patchify_channel_order_and_roundtrip():
    z = torch.randn(2, 3, 4, 6)
    x = patchify(z)
    assert x.shape == (2, 12, 2, 3)
    for c, pi, pj in [(0, 0, 0), (1, 0, 1), (2, 1, 0), (2, 1, 1)]:
        assert torch.equal(x[:, c * 4 + pi * 2 + pj], z[:, c, pi::2, pj::2])
    assert torch.equal(x, Flux2KleinPipeline._patchify_latents(z))
    assert torch.equal(unpatchify(x), z)
    assert torch.equal(unpatchify(x), Flux2KleinPipeline._unpatchify_latents(x))


def test_bn_normalize_roundtrip_and_matches_batch_norm(weights):
    mean, var = weights["bn.running_mean"], weights["bn.running_var"]
    x = torch.randn(2, 128, 3, 5)
    y = normalize(x, mean, var)
    assert torch.allclose(y, F.batch_norm(x, mean, var, training=False, eps=1e-4), atol=1e-6)
    assert torch.allclose(denormalize(y, mean, var), x, atol=1e-5)
    assert normalize(x.bfloat16(), mean, var).dtype == torch.float32


def test_bf16_model_keeps_fp32_latents_and_stats(files, ours, pixels):
    half = load_vae(files["bfl"], dtype=torch.bfloat16)
    assert half.decoder.conv_in.weight.dtype == torch.bfloat16 and half.bn.running_var.dtype == torch.float32
    latent = half.encode(pixels)
    assert latent.dtype == torch.float32
    expected = ours.encode(pixels)
    assert (latent - expected).abs().max() < 0.1 * expected.abs().max()
    image = half.decode(expected)
    assert image.dtype == torch.float32 and image.shape == pixels.shape


def test_small_decoder_widths_are_read_from_the_weights(tmp_path):
    sd = random_vae_state_dict(TINY_SMALL_DECODER_VAE, seed=2)
    ours = load_vae(write_bfl_file(sd, tmp_path / "full_encoder_small_decoder.safetensors"))
    assert ours.config == TINY_SMALL_DECODER_VAE
    assert ours.decoder.conv_in.weight.shape[0] == 96 and ours.encoder.conv_out.weight.shape[1] == 128
    latent = torch.randn(1, 128, 3, 2)
    diff = (
        ours.decode(latent) - diffusers_decode(make_diffusers_vae(sd, TINY_SMALL_DECODER_VAE), latent)
    ).abs()
    assert diff.max() <= TOL, diff.max().item()


def test_decoder_only_file_decodes_but_cannot_encode(tmp_path, weights, ours, pixels):
    decoder = load_vae(write_bfl_file(bare_decoder(weights), tmp_path / "small_decoder.safetensors"))
    assert not decoder.config.has_encoder and not hasattr(decoder, "encoder")
    latent = ours.encode(pixels)
    assert torch.equal(decoder.decode(latent), ours.decode(latent))
    with pytest.raises(Flux2Error, match="no encoder.*full_encoder_small_decoder.safetensors"):
        decoder.encode(pixels)


def test_decoder_only_file_without_latent_stats_is_refused(tmp_path, weights):
    path = write_bfl_file(bare_decoder(weights, bn=False), tmp_path / "small_decoder.safetensors")
    with pytest.raises(Flux2Error, match="decoder weights only.*BatchNorm.*full_encoder_small_decoder"):
        load_vae(path)


def test_size_not_a_multiple_of_16(ours):
    assert ours.downscale == 16 and ours.latent_channels == 128
    with pytest.raises(Flux2Error, match=r"image size 72x64 is not a multiple of 16.*e\.g\. 64x64"):
        ours.encode(torch.zeros(1, 3, 64, 72))


def test_decode_rejects_a_non_flux2_latent(ours):
    with pytest.raises(Flux2Error, match=r"FLUX.2 latent \[B, 128, h, w\]"):
        ours.decode(torch.zeros(1, 16, 4, 4))


@pytest.mark.parametrize(
    ("z", "message"),
    [(16, r"FLUX\.1 \(or SD3\) VAE \(16 latent channels\); FLUX\.2 needs flux2-vae"), (4, "SD 1.x/SDXL VAE")],
)
def test_older_vae_is_refused(tmp_path, z, message):
    sd = random_vae_state_dict(replace(TINY_VAE, z_channels=z), bn=False)
    sd = {k: v for k, v in sd.items() if "quant_conv" not in k}  # FLUX.1's ae.safetensors has no quant convs
    with pytest.raises(Flux2Error, match=message):
        load_vae(write_bfl_file(sd, tmp_path / "ae.safetensors"))


def test_dit_given_as_vae_is_refused(tmp_path):
    sd = {"img_in.weight": torch.zeros(8, 128), "double_blocks.0.img_attn.qkv.weight": torch.zeros(24, 8)}
    path = write_bfl_file(sd, tmp_path / "flux-2-klein-4b.safetensors", prefix="model.diffusion_model.")
    with pytest.raises(Flux2Error, match="diffusion model.*not a VAE.*flux2-vae.safetensors"):
        load_vae(path)


def test_truncated_file_is_reported_as_corrupt(tmp_path, weights):
    path = write_bfl_file(weights, tmp_path / "flux2-vae.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(Flux2Error, match="corrupt"):
        load_vae(path)


def test_real_size_parameter_count_and_buffers():
    with torch.device("meta"):
        model = AutoEncoder(FLUX2_VAE)
    # diffusers' AutoencoderKLFlux2 with its default config (the FLUX.2 VAE's), counted on the meta device
    assert sum(p.numel() for p in model.parameters()) == 84_046_115
    buffers = {k: tuple(v.shape) for k, v in model.named_buffers() if k != "bn.num_batches_tracked"}
    assert buffers == {"bn.running_mean": (128,), "bn.running_var": (128,)}
    assert model.downscale == 16 and model.latent_channels == 128


@pytest.mark.parametrize(
    ("decoder_widths", "expected"), [(None, FLUX2_VAE), ((96, 192, 384, 384), FLUX2_SMALL_DECODER_VAE)]
)
def test_real_size_diffusers_names_convert_to_the_bfl_module(decoder_widths, expected):
    with torch.device("meta"):
        diffusers_sd = AutoencoderKLFlux2(decoder_block_out_channels=decoder_widths).state_dict()
        ours = AutoEncoder(expected).state_dict()
    shapes = vae_shapes(diffusers_sd)
    assert vae_config(shapes) == expected
    # The 1x1 attention convs come as Linear [C, C]; the loader adds the unit dims. The BN step counter is
    # optional in files.
    ours = {k: tuple(v.shape) for k, v in ours.items() if k != "bn.num_batches_tracked"}
    shapes = {k: s + (1, 1) if len(s) == 2 and len(ours.get(k, ())) == 4 else s for k, s in shapes.items()}
    assert {k: s for k, s in shapes.items() if k != "bn.num_batches_tracked"} == ours


def test_full_size_random_weights_build_the_real_config():
    model = vae_from_state_dict(full_size_vae_state_dict(seed=0))
    assert model.config == FLUX2_VAE


def test_bf16_model_keeps_the_exact_batchnorm_statistics(tmp_path):
    sd = random_vae_state_dict(seed=9)
    model = load_vae(write_bfl_file(sd, tmp_path / "flux2-vae.safetensors"), dtype=torch.bfloat16)
    assert model.decoder.conv_in.weight.dtype == torch.bfloat16
    torch.testing.assert_close(model.bn.running_mean, sd["bn.running_mean"], atol=0, rtol=0)
    torch.testing.assert_close(model.bn.running_var, sd["bn.running_var"], atol=0, rtol=0)
