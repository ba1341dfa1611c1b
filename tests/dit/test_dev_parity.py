"""FLUX.2 [dev] against diffusers' Flux2Pipeline on the same tiny random weights.

A dev-like DiT (embedded guidance, 48-wide text = 3 x the tiny Mistral's 16) is written in diffusers' folder
layout and loaded by ``load_transformer``; the tiny Mistral3 text encoder in its HF folder layout is loaded by
``load_text_encoder``. diffusers runs the whole pipeline from the prompt (its own Mistral3, transformers'
Tekken tokenizer, its chat template); ours encodes the prompt, samples and must end on the same latents.
"""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, Flux2Pipeline
from loader_contract import LoaderContract
from parity_helpers import random_image
from safetensors.torch import save_file
from tiny_dit import bfl_state_dict, make_diffusers_dit, write_bfl_file
from tiny_mistral import (
    TINY_TEXT,
    make_tiny_mistral3,
    reference_hf_tokenizer,
    without_logits,
    write_hf_folder,
)
from tiny_vae import make_diffusers_vae, random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.dit.call import CallExtras
from flux2_core.dit.files import load_transformer
from flux2_core.dit.rope import image_ids, reference_ids, text_ids
from flux2_core.references import encode_references
from flux2_core.sampling import SampleRequest, SampleSettings, sample
from flux2_core.text.encoder import load_text_encoder
from flux2_core.vae.autoencoder import load_vae

TOLERANCE = 1e-4  # max abs difference on the final latents, float32 on the CPU
CONTEXT = 3 * TINY_TEXT["hidden_size"]  # [h10 | h20 | h30]


def _dev_dit():
    return make_diffusers_dit(seed=7, guidance_embeds=True, joint_attention_dim=CONTEXT)


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    root = tmp_path_factory.mktemp("dev") / "FLUX.2-dev-tiny"
    text_encoder = make_tiny_mistral3(seed=5)
    write_hf_folder(text_encoder, root / "text_encoder")
    _dev_dit().save_pretrained(root / "transformer", safe_serialization=True)
    (root / "model_index.json").write_text(json.dumps({"_class_name": "Flux2Pipeline"}))
    vae_sd = random_vae_state_dict(seed=4)
    return {
        "root": root,
        "text_encoder": text_encoder,
        "vae": make_diffusers_vae(vae_sd),
        "vae_file": write_vae_file(vae_sd, root.parent / "flux2-vae.safetensors"),
    }


@pytest.fixture(scope="module")
def model(weights):
    return load_transformer(weights["root"])  # the repository root: its transformer/ folder


@pytest.fixture(scope="module")
def encoder(weights):
    return load_text_encoder(weights["root"] / "text_encoder")


def test_the_repository_is_dev(model):
    assert model.variant.name == "dev" and model.config.guidance_embed


def _dev_inputs():
    g = torch.Generator().manual_seed(5)
    x, ref = torch.randn(2, 12, 128, generator=g), torch.randn(2, 14, 128, generator=g)
    ctx = torch.randn(2, 9, CONTEXT, generator=g)
    return x, ref, ctx, torch.tensor([0.73, 0.73]), torch.tensor([4.0, 2.5])


X_IDS, REF_IDS = image_ids(3, 4), reference_ids([(2, 3), (4, 2)])


class TestDevLoader(LoaderContract):
    """The FLUX.2 loader on dev files (BFL's, ComfyUI's prefixed, diffusers' repository), compared with
    diffusers on a forward with embedded guidance and two references."""

    LAYOUTS = ("bfl", "comfy", "diffusers")
    FOREIGN = {"VAE": "is a VAE, not a FLUX.2"}
    MISSING = "single_blocks.1.linear2.weight"
    FILE_NAME = "flux2-dev.safetensors"

    def make_reference(self):
        return _dev_dit()

    def write(self, layout, reference, folder):
        if layout == "diffusers":
            root = folder / "FLUX.2-dev-tiny"
            reference.save_pretrained(root / "transformer", safe_serialization=True)
            (root / "model_index.json").write_text(json.dumps({"_class_name": "Flux2Pipeline"}))
            return root
        prefix = "model.diffusion_model." if layout == "comfy" else ""
        return write_bfl_file(reference, folder / self.FILE_NAME, prefix=prefix)

    def write_foreign(self, name, folder):
        save_file({"encoder.conv_in.weight": torch.zeros(4, 3, 3, 3)}, folder / "flux2-vae.safetensors")
        return folder / "flux2-vae.safetensors"

    def load(self, path):
        model = load_transformer(path)
        assert model.variant.name == "dev"  # found by its guidance embedder, whatever the layout
        return model

    def make_inputs(self):
        return _dev_inputs()

    def run(self, model, inputs):
        x, ref, ctx, t, guidance = inputs
        return model.transformer(x, X_IDS, t, ctx, CallExtras(references=(ref, REF_IDS), guidance=guidance))

    def run_reference(self, reference, inputs):
        x, ref, ctx, t, guidance = inputs
        out = reference(
            hidden_states=torch.cat([x, ref], 1),
            encoder_hidden_states=ctx,
            timestep=t,
            img_ids=torch.cat([X_IDS, REF_IDS]),
            txt_ids=text_ids(9),
            guidance=guidance,
            return_dict=False,
        )
        return out[0][:, : x.shape[1]]

    def state_dict(self, reference):
        return bfl_state_dict(reference)


def test_the_guidance_value_reaches_the_output(model):
    x, ref, ctx, t, guidance = _dev_inputs()
    with torch.no_grad():
        got = model.transformer(x, X_IDS, t, ctx, CallExtras(references=(ref, REF_IDS), guidance=guidance))
        no_guidance_change = model.transformer(
            x, X_IDS, t, ctx, CallExtras(references=(ref, REF_IDS), guidance=guidance * 0 + 1)
        )
    assert not torch.allclose(got, no_guidance_change, atol=1e-3)


def _diffusers_run(weights, prompts, settings, images):
    pipe = Flux2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential"),
        vae=weights["vae"],
        text_encoder=weights["text_encoder"],
        tokenizer=reference_hf_tokenizer(),
        transformer=_dev_dit(),
    )
    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad(), without_logits(weights["text_encoder"]):
        return pipe(
            prompt=prompts,
            image=images,
            height=settings.height,
            width=settings.width,
            num_inference_steps=settings.steps,
            guidance_scale=settings.guidance,
            num_images_per_prompt=settings.batch_size,
            generator=torch.Generator("cpu").manual_seed(settings.seed),
            output_type="latent",
            return_dict=False,
        )[0]


CASES = {
    "text_to_image": dict(prompt="a red fox in the snow", settings=SampleSettings(64, 64, 4, 4.0, 21)),
    "two_references": dict(
        prompt="the fox from image 1 [IMG] in the room of image 2",
        settings=SampleSettings(80, 64, 3, 3.5, 22),
        refs=[(64, 96), (112, 64)],
    ),
    "batch_2": dict(prompt="数字 12345 🦊", settings=SampleSettings(64, 80, 3, 2.5, 23, batch_size=2)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_full_run_matches_diffusers(weights, model, encoder, case):
    spec = CASES[case]
    settings = spec["settings"]
    images = [random_image(w, h, seed=i) for i, (w, h) in enumerate(spec.get("refs", []))] or None
    expected = _diffusers_run(weights, [spec["prompt"]], settings, images)

    vae = load_vae(weights["vae_file"])
    references = encode_references(vae, images) if images else None
    latents = sample(SampleRequest(model, encoder.encode([spec["prompt"]]), settings, references=references))
    # Flux2Pipeline hands back its packed latent tokens for output_type="latent": [B, h * w, 128], row-major
    got = latents.flatten(2).transpose(1, 2)
    assert got.shape == expected.shape == (settings.batch_size, settings.height * settings.width // 256, 128)
    diff = (got - expected).abs().max().item()
    print(f"{case}: max abs difference vs diffusers {diff:.1e}")
    assert diff <= TOLERANCE, f"{case}: max abs difference {diff:.2e}"


@pytest.mark.parametrize(
    ("guidance", "embedded"), [(2.5, 2496.0), (3.5, 3504.0), (4.0, 4000.0), (5.0, 4992.0)]
)
def test_guidance_is_embedded_as_1000_g_formed_in_the_compute_dtype(weights, guidance, embedded):
    # BFL and diffusers form 1000 * g in the latent dtype: bf16(bf16(g) * 1000), e.g. 2.5 -> 2496
    from flux2_core.dit.layers import timestep_embedding

    net = load_transformer(weights["root"], dtype=torch.bfloat16).transformer
    seen = []
    handle = net.guidance_in.in_layer.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    x = torch.zeros(1, 4, net.config.in_channels, dtype=torch.bfloat16)
    ctx = torch.zeros(1, 3, net.config.context_in_dim, dtype=torch.bfloat16)
    with torch.no_grad():
        net(x, image_ids(2, 2), torch.tensor([0.5]), ctx, CallExtras(guidance=torch.tensor([guidance])))
    handle.remove()
    expected = timestep_embedding(torch.tensor([embedded]), factor=1.0).to(torch.bfloat16)
    assert torch.equal(seen[0], expected)
