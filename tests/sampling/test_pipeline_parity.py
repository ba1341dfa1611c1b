"""Whole runs against diffusers' Flux2KleinPipeline / Flux2KleinKVPipeline on the same tiny random weights.

Both sides load the same files (diffusers from its own folder layout, ours through the real loaders), get the
same text conditioning and the same seed (CPU float32 noise), and must end on the same latents.
"""

import pytest
import torch
from parity_helpers import as_diffusers_latents, diffusers_run, random_image
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_vae import make_diffusers_vae, random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.dit.files import load_transformer
from flux2_core.references import encode_references
from flux2_core.sampling import SampleRequest, SampleSettings, sample
from flux2_core.vae.autoencoder import load_vae

TOLERANCE = 1e-4  # max abs difference on the final latents, float32 on the CPU
T = 512


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    root = tmp_path_factory.mktemp("parity")
    dit = make_diffusers_dit(seed=3)
    vae_sd = random_vae_state_dict(seed=4)
    return {
        "dit": dit,
        "vae": make_diffusers_vae(vae_sd),
        "dit_file": write_bfl_file(dit, root / "flux-2-klein-4b.safetensors"),
        "vae_file": write_vae_file(vae_sd, root / "flux2-vae.safetensors"),
    }


@pytest.fixture(scope="module")
def ours(weights):
    return load_vae(weights["vae_file"])


def _embeds(seed, batch=1):
    return torch.randn(batch, T, 24, generator=torch.Generator().manual_seed(seed))


def _diffusers_run(weights, variant, settings, positive, negative=None, images=None):
    return diffusers_run(
        make_diffusers_dit(seed=3), weights["vae"], variant, settings, positive, negative, images
    )


CASES = {
    "text_to_image": dict(variant="distilled", settings=SampleSettings(64, 64, 4, 1.0, 11)),
    "non_square_batch_2": dict(
        variant="distilled", settings=SampleSettings(96, 64, 4, 1.0, 12, batch_size=2)
    ),
    "base_with_cfg": dict(variant="base", settings=SampleSettings(64, 80, 6, 4.0, 13), negative=True),
    "one_reference": dict(variant="distilled", settings=SampleSettings(64, 64, 4, 1.0, 14), refs=[(96, 64)]),
    "two_references_of_different_sizes": dict(
        variant="distilled", settings=SampleSettings(80, 64, 4, 1.0, 15), refs=[(64, 96), (112, 64)]
    ),
    "base_cfg_with_reference": dict(
        variant="base", settings=SampleSettings(64, 64, 3, 3.5, 16), negative=True, refs=[(64, 64)]
    ),
    "kv_two_references": dict(
        variant="kv", settings=SampleSettings(64, 64, 4, 1.0, 17), refs=[(96, 64), (64, 80)]
    ),
    "kv_batch_2": dict(
        variant="kv", settings=SampleSettings(64, 64, 3, 1.0, 18, batch_size=2), refs=[(64, 64)]
    ),
    "kv_without_references": dict(variant="kv", settings=SampleSettings(64, 64, 4, 1.0, 19)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_full_run_matches_diffusers(weights, ours, case):
    spec = CASES[case]
    settings = spec["settings"]
    positive = _embeds(100)
    negative = _embeds(101) if spec.get("negative") else None
    images = [random_image(w, h, seed=i) for i, (w, h) in enumerate(spec.get("refs", []))] or None
    expected = _diffusers_run(weights, spec["variant"], settings, positive, negative, images)

    model = load_transformer(weights["dit_file"], variant=spec["variant"])
    references = encode_references(ours, images) if images else None
    latents = sample(SampleRequest(model, positive, settings, negative=negative, references=references))
    assert latents.shape == (settings.batch_size, 128, settings.height // 16, settings.width // 16)
    got = as_diffusers_latents(latents, ours)
    assert got.shape == expected.shape
    diff = (got - expected).abs().max().item()
    print(f"{case}: max abs difference vs diffusers {diff:.1e}")
    assert diff <= TOLERANCE, f"{case}: max abs difference {diff:.2e}"
