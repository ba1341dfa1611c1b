"""FLUX.1 Fill [dev] in a real ComfyUI, against native ComfyUI on the same random weights and seed.

The module writes, into the running server's model folders (ComfyUI rereads a folder whose mtime changed):

- ``flux1-fill-tiny.safetensors``: a tiny Fill DiT in BFL format that native ComfyUI detects as FluxInpaint
  (hidden 256 = 2 heads of 128, 1 double + 2 single blocks, img_in 384 wide, 4096-wide text, 768-wide
  pooled vector, guidance embedder), with the attention sharpened as the klein rig does so the text matters;
- ``flux1-ae-random.safetensors``: a random FLUX.1 VAE (the layout of ``ae.safetensors``) with the real
  shapes (native ComfyUI builds the encoder at full width whatever the file holds), stored in bfloat16,
  which both sides load into float32 on the CPU.

Native ComfyUI's CLIP-L and T5-XXL are fixed full-size models, so the text conditioning is the test pack's
probe: one seeded random T5 [1, 512, 4096] / pooled [1, 768] pair, given to native as CONDITIONING and to
our sampler as our Fill conditioning (the same tensors).

Native graph (ComfyUI's own Fill nodes, set to BFL's sampling: ModelSamplingFlux's max / base shift 1.15 /
0.5 with scheduler simple is BFL's get_schedule, noise_mask off samples the whole latent as BFL's cli_fill
does): UNETLoader -> ModelSamplingFlux(1.15, 0.5, width, height); LoadImage of an RGBA picture whose
transparent box is the MASK; InpaintModelConditioning(noise_mask off) -> FluxGuidance(30); KSampler(euler,
simple, cfg 1, denoise 1) -> VAEDecode. Ours: Fill model / VAE loaders -> Fill sampler -> Fill decode. The
two PNGs must agree within 2/255, and native VAEDecode of our sampler's LATENT must give our decode.
Controls show the comparison can fail (another seed, another text, guidance 3.5). It is also sensitive to the
numeric conventions where BFL / diffusers and ComfyUI part (BFL's denoise in black-forest-labs/flux
src/flux/sampling.py builds the timestep and guidance vectors in the latent dtype, bfloat16, and diffusers'
FluxTransformer2DModel.forward scales both by 1000 in the model dtype; ComfyUI keeps them float32), measured
in-process on these weights with ``sample_fill`` against itself: the guidance formed as bfloat16 29952
instead of float32 30000 moves the image by a mean 30/255, timesteps rounded to bfloat16 by up to 53/255,
256 T5 tokens instead of 512 by a mean 19/255. Wrong files in the loaders fail the prompt with our message.
"""

from __future__ import annotations

import numpy as np
import pytest
from comfy_server import ATTENTION_BOOST, NOT_A_DIT, masked_png
from PIL import Image
from test_server import _flux2_error_message, small_text_to_image

# Not the official names: the bundled Fill workflows need a DiT paired with tiny text encoders, this one reads
# the real T5 / CLIP widths (the probe's)
FILL_DIT, FILL_VAE = "flux1-fill-tiny.safetensors", "flux1-ae-random.safetensors"
KLEIN_DIT, KLEIN_VAE = "flux-2-klein-4b.safetensors", "flux2-vae.safetensors"  # written by conftest
WIDTH, HEIGHT = 128, 96  # multiples of 16, non-square: a swapped width/height shows
SEED, STEPS, GUIDANCE = 7, 4, 30.0
TEXT_SEED, TEXT_TOKENS = 11, 512
TOLERANCE = 2  # of 255, per pixel and channel: PNG rounding of float images that agree to ~1e-5


def node(class_type: str, **inputs) -> dict:
    return {"class_type": class_type, "inputs": inputs}


def fill_dit_state_dict(seed: int) -> dict:
    """Random tiny Fill DiT weights under BFL names, with sharpened attention: q/k norm scales and the
    attention output projections times ``ATTENTION_BOOST`` (as ``conftest.sharpen_attention``). Measured in
    float32 on one step's velocity: a new T5 input moves it by 5% of its size with plain random weights, by
    90% sharpened; the pooled vector and the masked-image latent move it by 60-100% either way."""
    from tiny_flux1 import fill_state_dict

    from flux2_core.flux1 import Flux1Config

    config = Flux1Config(hidden_size=256, num_heads=2, depth=1, depth_single_blocks=2)
    sd = fill_state_dict(config, seed)
    sharpened = ("norm.query_norm.scale", "norm.key_norm.scale", "_attn.proj.")
    return {k: v * ATTENTION_BOOST if any(s in k for s in sharpened) else v for k, v in sd.items()}


@pytest.fixture(scope="module")
def fill(comfy) -> dict:
    """Writes the Fill files into the server's folders and uploads the masked picture: {"image": its name
    on the server, "path": the local file}."""
    import torch
    from safetensors.torch import save_file
    from tiny_vae import random_vae_state_dict

    from flux2_core.flux1.vae import FLUX1_VAE

    models = comfy.base / "models"
    save_file(fill_dit_state_dict(601), str(models / "diffusion_models" / FILL_DIT))
    vae = random_vae_state_dict(FLUX1_VAE, seed=602, bn=False)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in vae.items()}, str(models / "vae" / FILL_VAE))
    picture = comfy.base / "references" / f"fill_masked_{WIDTH}x{HEIGHT}.png"
    picture.write_bytes(masked_png(WIDTH, HEIGHT))
    return {"image": comfy.kc.upload_image(comfy.url, picture), "path": picture}


def our_graph(image: str) -> dict:
    """Our Fill graph on the probe's conditioning and a LoadImage (IMAGE and its alpha's MASK)."""
    return {
        "100": node("Flux1FillTestProbeConditioning", seed=TEXT_SEED, tokens=TEXT_TOKENS),
        "104": node("LoadImage", image=image),
        "1": node("Flux1FillModelLoader", model_name=FILL_DIT),
        "2": node("Flux1FillVAELoader", vae_name=FILL_VAE),
        "3": node(
            "Flux1FillSampler",
            model=["1", 0],
            positive=["100", 1],
            vae=["2", 0],
            image=["104", 0],
            mask=["104", 1],
            seed=SEED,
            steps=STEPS,
            guidance=GUIDANCE,
        ),
        "4": node("Flux1FillDecode", vae=["2", 0], latent=["3", 0]),
        "5": node("SaveImage", images=["4", 0], filename_prefix="fill/ours"),
    }


def graph(image: str) -> dict:
    """Ours and native in one API prompt, sharing the probe's text conditioning and the LoadImage, plus
    the interoperability outputs and the controls."""
    g = {
        **our_graph(image),
        "105": node("SaveImage", images=["104", 0], filename_prefix="fill/passthrough"),
        "6": node("Flux2KleinComposite", image=["4", 0], stitch=["3", 1], feather=0),
        "7": node("SaveImage", images=["6", 0], filename_prefix="fill/ours_composite"),
        # native
        "11": node("UNETLoader", unet_name=FILL_DIT, weight_dtype="default"),
        "12": node(
            "ModelSamplingFlux", model=["11", 0], max_shift=1.15, base_shift=0.5, width=WIDTH, height=HEIGHT
        ),
        "13": node("VAELoader", vae_name=FILL_VAE),
        "14": node("ConditioningZeroOut", conditioning=["100", 0]),
        "15": node(
            "InpaintModelConditioning",
            positive=["100", 0],
            negative=["14", 0],
            vae=["13", 0],
            pixels=["104", 0],
            mask=["104", 1],
            noise_mask=False,
        ),
        "16": node("FluxGuidance", conditioning=["15", 0], guidance=GUIDANCE),
        "17": node(
            "KSampler",
            model=["12", 0],
            positive=["16", 0],
            negative=["15", 1],
            latent_image=["15", 2],
            seed=SEED,
            steps=STEPS,
            cfg=1.0,
            sampler_name="euler",
            scheduler="simple",
            denoise=1.0,
        ),
        "18": node("VAEDecode", samples=["17", 0], vae=["13", 0]),
        "19": node("SaveImage", images=["18", 0], filename_prefix="fill/native"),
        # native VAEDecode of our sampler's LATENT
        "20": node("VAEDecode", samples=["3", 0], vae=["13", 0]),
        "21": node("SaveImage", images=["20", 0], filename_prefix="fill/native_decode_of_ours"),
    }
    # controls, each one change away from a compared graph: native with another seed, ours with another
    # text conditioning, ours with ComfyUI's fallback guidance 3.5
    g["30"] = {"class_type": "KSampler", "inputs": {**g["17"]["inputs"], "seed": SEED + 1}}
    g["31"] = node("VAEDecode", samples=["30", 0], vae=["13", 0])
    g["32"] = node("SaveImage", images=["31", 0], filename_prefix="fill/native_other_seed")
    g["40"] = node("Flux1FillTestProbeConditioning", seed=TEXT_SEED + 1, tokens=TEXT_TOKENS)
    g["41"] = {"class_type": "Flux1FillSampler", "inputs": {**g["3"]["inputs"], "positive": ["40", 1]}}
    g["42"] = node("Flux1FillDecode", vae=["2", 0], latent=["41", 0])
    g["43"] = node("SaveImage", images=["42", 0], filename_prefix="fill/ours_other_text")
    g["50"] = {"class_type": "Flux1FillSampler", "inputs": {**g["3"]["inputs"], "guidance": 3.5}}
    g["51"] = node("Flux1FillDecode", vae=["2", 0], latent=["50", 0])
    g["52"] = node("SaveImage", images=["51", 0], filename_prefix="fill/ours_guidance_3.5")
    return g


def pixels(image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def test_fill_matches_native_comfyui(comfy, fill, record_property):
    entry = comfy.run(graph(fill["image"]), timeout=300)
    images = {node_id: pixels(image) for node_id, image in comfy.images(entry).items()}
    ours, native, native_decode = images["5"], images["19"], images["21"]
    original, composite = images["105"], images["7"]
    mask = np.asarray(Image.open(fill["path"]))[..., 3] == 0  # Load Image's MASK: 1 where transparent

    assert ours.shape == native.shape == (HEIGHT, WIDTH, 3)
    # the image carries content (a flat or saturated image would make the comparison meaningless)
    assert ours.std() > 20 and ((ours == 0) | (ours == 255)).mean() < 0.5, (ours.std(), ours.mean())
    sampled, mean = int(np.abs(ours - native).max()), float(np.abs(ours - native).mean())
    decoded = int(np.abs(ours - native_decode).max())
    controls = {  # mean |change| of one image when one input changes
        "native, seed + 1": np.abs(native - images["32"]).mean(),
        "ours, another text conditioning": np.abs(ours - images["43"]).mean(),
        "ours, guidance 3.5": np.abs(ours - images["52"]).mean(),
    }
    print(  # noqa: T201
        f"\n[fill] {WIDTH}x{HEIGHT}, {STEPS} steps, seed {SEED}, guidance {GUIDANCE:g}: "
        f"max |ours - native| = {sampled}/255 (mean {mean:.4f}), "
        f"max |our Decode - native VAEDecode of our latent| = {decoded}/255; "
        + ", ".join(f"mean change with {k}: {v:.1f}/255" for k, v in controls.items())
    )
    record_property("fill_max_pixel_diff_vs_native", sampled)
    record_property("fill_mean_pixel_diff_vs_native", mean)
    record_property("fill_max_pixel_diff_native_decode", decoded)
    assert sampled <= TOLERANCE, f"ours and native differ by up to {sampled}/255 (mean {mean:.3f})"
    assert decoded <= TOLERANCE, f"native VAEDecode of our latent differs from our Decode by {decoded}/255"
    for what, effect in controls.items():
        assert effect > 3, f"{what} gives nearly the same image ({effect:.2f}/255): the comparison is blind"
    # the composite is the original outside the mask and our decode inside it
    assert np.array_equal(composite[~mask], original[~mask])
    assert np.array_equal(composite[mask], ours[mask])
    assert np.abs(ours[mask] - original[mask]).mean() > 5  # the box was repainted


@pytest.mark.parametrize(
    ("loader", "field", "chosen", "expected"),
    [
        ("Flux1FillVAELoader", "vae_name", KLEIN_VAE, ("the FLUX.2 VAE", "ae.safetensors")),
        ("Flux1FillModelLoader", "model_name", KLEIN_DIT, ("FLUX.2 model", "flux1-fill-dev.safetensors")),
        ("Flux1FillModelLoader", "model_name", NOT_A_DIT, ("is a VAE", "flux1-fill-dev.safetensors")),
    ],
)
def test_fill_loaders_refuse_the_wrong_file_by_name(comfy, fill, loader, field, chosen, expected):
    """A wrong pairing is a failed prompt with our message naming the file given and the file to choose."""
    wf = our_graph(fill["image"])
    (node_id,) = [k for k, v in wf.items() if v["class_type"] == loader]
    wf[node_id]["inputs"][field] = chosen
    message = _flux2_error_message(comfy, wf, loader)
    assert chosen in message, message
    for part in expected:
        assert part in message, message


@pytest.mark.parametrize(
    ("loader", "field", "chosen", "expected"),
    [
        (
            "Flux2KleinModelLoader",
            "model_name",
            FILL_DIT,
            ("is FLUX.1 Fill [dev]", "FLUX.1 Fill [dev] Model Loader"),
        ),
        ("Flux2KleinVAELoader", "vae_name", FILL_VAE, ("a FLUX.1", "flux2-vae.safetensors")),
    ],
)
def test_klein_loaders_refuse_the_fill_files_by_name(comfy, fill, loader, field, chosen, expected):
    """The other way round: the Fill files in the klein loaders."""
    wf = small_text_to_image(comfy)
    (node_id,) = comfy.kc.nodes_of_type(wf, loader)
    wf[node_id]["inputs"][field] = chosen
    message = _flux2_error_message(comfy, wf, loader)
    assert chosen in message, message
    for part in expected:
        assert part in message, message
