"""Regional prompts with reference images on every model path: the 9B-KV model's cache (independent of the
regions: reused across runs), quantised and GGUF files, LoRAs, the block split, streaming, batches, FLUX.2
[dev], position extrapolation, and the memory estimate (the rule and the exact cases against diffusers:
``test_regional_edit.py``)."""

from dataclasses import replace

import pytest
import torch
from parity_helpers import random_image
from quant_files import write_gguf, write_quantised
from safetensors.torch import save_file
from tiny_dit import bfl_state_dict, make_diffusers_dit, write_bfl_file
from tiny_vae import random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.devices.placement import place_blocks, remove_placement
from flux2_core.devices.streaming import disable_streaming, enable_streaming
from flux2_core.dit.call import call_extras
from flux2_core.dit.extrapolation import PositionExtrapolation
from flux2_core.dit.files import load_transformer
from flux2_core.dit.rope import image_ids
from flux2_core.kv_store import RefKVStore
from flux2_core.lora import prepare_lora, read_lora
from flux2_core.references import encode_references
from flux2_core.sampling import SampleRequest, SampleSettings, encode_reference_kv, estimate_memory, sample
from flux2_core.steering.reference_strength import ReferenceStrength, key_bias
from flux2_core.steering.regions import Region, RegionalPrompt, regional_plan
from flux2_core.vae.autoencoder import load_vae

SETTINGS = SampleSettings(64, 64, 3, 1.0, 12)


def _embeds(seed, tokens=512, width=24):
    return torch.randn(1, tokens, width, generator=torch.Generator().manual_seed(seed))


def _left(width, height):
    left = torch.zeros(height, width)
    left[:, : width // 2] = 1
    return left


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("regional_paths")
    dit = make_diffusers_dit(seed=3)
    sd = bfl_state_dict(dit)
    out = {"float": write_bfl_file(dit, root / "flux-2-klein-4b.safetensors")}
    out["fp8"] = root / "fp8.safetensors"
    write_quantised(sd, out["fp8"], "float8_e4m3fn")
    out["gguf"] = root / "klein-Q8_0.gguf"
    write_gguf(
        sd, out["gguf"], "flux", {k: "Q8_0" for k in sd if sd[k].ndim == 2 and sd[k].shape[1] % 32 == 0}
    )
    g = torch.Generator().manual_seed(4)
    out["lora"] = root / "lora.safetensors"
    layer = "double_blocks.0.img_attn.qkv"
    rows, cols = sd[layer + ".weight"].shape
    save_file({f"diffusion_model.{layer}.lora_A.weight": torch.randn(2, cols, generator=g),
               f"diffusion_model.{layer}.lora_B.weight": torch.randn(rows, 2, generator=g)},
              str(out["lora"]))  # fmt: skip
    out["dev"] = write_bfl_file(make_diffusers_dit(seed=5, guidance_embeds=True), root / "dev.safetensors")
    out["vae"] = load_vae(write_vae_file(random_vae_state_dict(seed=4), root / "flux2-vae.safetensors"))
    return out


def _references(files, sizes, strengths=None):
    refs = encode_references(files["vae"], [random_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)])
    return refs if strengths is None else replace(refs, strengths=tuple(strengths))


def _exact_cases_hold(model, files, settings=SETTINGS, **extra):
    """On ``model``: a global prompt with an empty region and references is the plain edit; every reference
    at 0 is the regional run without references; a half-image region moves the edit. Returns that run."""
    glob, sizes = _embeds(1), [(64, 64), (64, 80)]
    refs, off = _references(files, sizes), _references(files, sizes, [ReferenceStrength(0.0)] * 2)
    empty = torch.zeros(settings.height, settings.width)
    half = RegionalPrompt(glob, (Region(_embeds(2), _left(settings.width, settings.height)),))

    def run(references, regions=None):
        return sample(SampleRequest(model, glob, settings, references=references, regions=regions, **extra))

    plain = run(refs)
    assert torch.equal(run(refs, RegionalPrompt(glob, (Region(_embeds(2), empty),))), plain)
    assert torch.equal(run(off, half), run(None, half))
    regional = run(refs, half)
    assert (regional - plain).abs().mean() > 1e-3 and torch.isfinite(regional).all()
    return regional, run, refs, half


# --- the 9B-KV model ------------------------------------------------------------------------------------


def test_the_kv_cache_does_not_depend_on_the_regions_and_the_store_still_hits(files):
    model = load_transformer(files["float"], variant="kv")
    store, computed = RefKVStore(), []
    refs, glob = _references(files, [(64, 64)]), _embeds(1)

    def compute():
        computed.append(1)
        return encode_reference_kv(model, refs)

    outputs = []
    for k, region in enumerate((_embeds(2), _embeds(3))):  # two runs, other regions each time
        cache, hit = store.get(model, refs, compute)
        assert hit == (k > 0)
        regions = RegionalPrompt(glob, (Region(region, _left(64, 64)),))
        given = sample(SampleRequest(model, glob, SETTINGS, references=refs, regions=regions, kv_cache=cache))
        assert torch.equal(
            given, sample(SampleRequest(model, glob, SETTINGS, references=refs, regions=regions))
        )
        outputs.append(given)
    assert len(computed) == 1 and (outputs[0] - outputs[1]).abs().mean() > 1e-4


# --- weights: quantised, GGUF, LoRA; where the blocks run ---------------------------------------------------


@pytest.mark.parametrize("kind", ["fp8", "gguf"])
def test_quantised_files_with_a_lora_keep_the_exact_cases_on_the_block_split_and_streamed(files, kind):
    model = load_transformer(files[kind], variant="distilled")
    model = model.with_lora(prepare_lora(read_lora(files["lora"]), model.transformer))
    regional, run, refs, half = _exact_cases_hold(model, files)
    place_blocks(model.transformer, ["cpu", "cpu"])  # the mask follows each block's device
    try:
        assert torch.equal(run(refs, half), regional)
    finally:
        remove_placement(model.transformer)
    enable_streaming(model.transformer, "cpu", resident_bytes=0)
    try:
        assert torch.equal(run(refs, half), regional)
    finally:
        disable_streaming(model.transformer)


def test_the_lora_changes_the_regional_edit(files):
    plain = load_transformer(files["float"], variant="distilled")
    with_lora = plain.with_lora(prepare_lora(read_lora(files["lora"]), plain.transformer))
    runs = [_exact_cases_hold(m, files)[0] for m in (plain, with_lora)]
    assert (runs[0] - runs[1]).abs().mean() > 1e-3


# --- batches, dev, position extrapolation ---------------------------------------------------------------


@pytest.mark.parametrize("variant", ["distilled", "kv"])
def test_a_batch_is_each_item_alone(files, variant):
    net = load_transformer(files["float"], variant=variant).transformer
    refs, glob = _references(files, [(64, 64)]), _embeds(1, 40)
    ctx, mask = regional_plan(RegionalPrompt(glob, (Region(_embeds(2, 30), _left(64, 64)),)), (4, 4),
                              torch.float32, "cpu")  # fmt: skip
    tokens = (refs.tokens, refs.ids)
    kv = net.encode_reference_kv(*tokens) if variant == "kv" else None
    extras = call_extras(references=tokens, kv_cache=kv, reference_bias=key_bias([0.5], [16], torch.float32,
                         "cpu"), regions=mask)  # fmt: skip
    g = torch.Generator().manual_seed(5)
    x, t = torch.randn(2, 16, 128, generator=g), torch.tensor([0.7, 0.4])
    with torch.inference_mode():
        both = net(x, image_ids(4, 4), t, ctx.expand(2, -1, -1), extras)
        alone = [net(x[i : i + 1], image_ids(4, 4), t[i : i + 1], ctx, extras) for i in range(2)]
    torch.testing.assert_close(both, torch.cat(alone), atol=1e-5, rtol=1e-5)


def test_dev_keeps_the_exact_cases(files):
    model = load_transformer(files["dev"])
    assert model.variant.name == "dev"
    _exact_cases_hold(model, files, SampleSettings(64, 64, 3, 4.0, 12))


def test_position_extrapolation_keeps_the_exact_cases(files):
    model = load_transformer(files["float"], variant="distilled")
    settings = SampleSettings(256, 320, 2, 1.0, 6)  # 16 x 20 tokens past a base of 256 px
    regional, *_ = _exact_cases_hold(model, files, settings, extrapolation=PositionExtrapolation(256))
    _, run, refs, half = _exact_cases_hold(model, files, settings)
    assert (run(refs, half) - regional).abs().mean() > 1e-4  # the extrapolation acts


# --- memory ------------------------------------------------------------------------------------------------


def test_the_memory_estimate_counts_the_references_in_the_larger_mask(files):
    from flux2_core.steering.regions import regional_cost

    model = load_transformer(files["float"], variant="distilled")
    refs, glob = _references(files, [(64, 64), (64, 80)]), _embeds(1)
    regions = RegionalPrompt(glob, (Region(_embeds(2), _left(64, 64)),))
    hidden = model.config.hidden_size
    with_refs = estimate_memory(model, SETTINGS, refs, regions)
    assert with_refs - estimate_memory(model, SETTINGS, refs) > regional_cost([512], (4, 4), hidden, 4)[1]
    # one group's keys and values: every text, image and reference token; its queries: the references' 36
    _, gathered = regional_cost([512, 512], (4, 4), hidden, 4, ref_tokens=refs.num_tokens)
    assert gathered == (2 * (1024 + 16 + 36) + 2 * 36) * hidden * 4
    assert estimate_memory(model, SETTINGS, refs.num_tokens, [512, 512]) == with_refs
