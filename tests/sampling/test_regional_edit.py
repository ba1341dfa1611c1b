"""Regional prompts together with reference images (``dit.call.RegionalMask.with_references``, the DiT's
``_regional_bias``): the rule written out by hand, one attention against the formula (plain klein and the
9B-KV model's cached keys), the exact cases against diffusers' plain edits and our own runs, the leak of a
region's prompt outside its mask, and what strengths and step ranges keep meaning. The other paths (KV reuse,
quantised and GGUF files, LoRAs, streaming, the block split, batches, dev, extrapolation) are in
``test_regional_edit_paths.py``; sequence parallelism in ``tests/devices/test_parallel.py``."""

import math
from dataclasses import replace

import pytest
import torch
from parity_helpers import as_diffusers_latents, diffusers_run, random_image
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_vae import make_diffusers_vae, random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.denoiser import Flux2Denoiser
from flux2_core.dit.attention import attention_bias
from flux2_core.dit.block_ops import PLAIN
from flux2_core.dit.call import CallExtras
from flux2_core.dit.files import load_transformer
from flux2_core.dit.kv_cache import RefKVLayer
from flux2_core.dit.layers import BlockCall
from flux2_core.dit.rope import image_ids, reference_ids, rotation_table
from flux2_core.references import encode_references
from flux2_core.sampling import SampleRequest, SampleSettings, get_sigmas, sample
from flux2_core.steering.reference_strength import ReferenceStrength, key_bias
from flux2_core.steering.regions import Region, RegionalPrompt, regional_plan
from flux2_core.vae.autoencoder import load_vae

TOLERANCE = 1e-4  # max abs difference of the final latents against diffusers, float32 on the CPU
INF = -math.inf
T = 512


def _embeds(seed, tokens=T):
    return torch.randn(1, tokens, 24, generator=torch.Generator().manual_seed(seed))


NONE = torch.zeros(1, 0, 24)


def _halves(width, height):
    left = torch.zeros(height, width)
    left[:, : width // 2] = 1
    return left, 1 - left


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    root = tmp_path_factory.mktemp("regional_edit")
    vae_sd = random_vae_state_dict(seed=4)
    return {
        "dit_file": write_bfl_file(make_diffusers_dit(seed=3), root / "flux-2-klein-4b.safetensors"),
        "vae": make_diffusers_vae(vae_sd),
        "ours": load_vae(write_vae_file(vae_sd, root / "flux2-vae.safetensors")),
    }


def _references(weights, sizes, strengths=None):
    refs = encode_references(weights["ours"], [random_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)])
    return refs if strengths is None else replace(refs, strengths=tuple(strengths))


# --- the rule, written out ---------------------------------------------------------------------------------

LOG2, HALF = math.log(2.0), math.log(0.5)


def _two_regions():
    """A 1 x 2 grid (i0 left, i1 right), a global prompt of 2 tokens (g), region A of 1 token over the left
    (a), region B of 1 token over the right at strength 2 (b)."""
    left, right = _halves(32, 16)
    return RegionalPrompt(_embeds(0, 2), (Region(_embeds(1, 1), left), Region(_embeds(2, 1), right, 2.0)))


def _call_bias(weights, variant, regions, ref_bias, ref_grid=(1, 2)):
    """The bias the DiT hands its blocks in a call of ``regions`` (on a 1 x 2 grid) with one reference of
    ``ref_grid`` (the KV model: its cached K/V) at ``ref_bias``."""
    net = load_transformer(weights["dit_file"], variant=variant).transformer
    ctx, mask = regional_plan(regions, (1, 2), torch.float32, "cpu")
    g = torch.Generator().manual_seed(9)
    ref_ids = reference_ids([ref_grid])
    ref = torch.randn(1, ref_ids.shape[0], 128, generator=g)
    if variant == "kv":
        extras = CallExtras(
            kv_cache=net.encode_reference_kv(ref, ref_ids), reference_bias=ref_bias, regions=mask
        )
    else:
        extras = CallExtras(references=(ref, ref_ids), reference_bias=ref_bias, regions=mask)
    calls = []
    hook = net.double_blocks[0].register_forward_pre_hook(lambda m, args: calls.append(args[4]))
    with torch.inference_mode():
        net(torch.randn(1, 2, 128, generator=g), image_ids(1, 2), torch.tensor([0.7]), ctx, extras)
    hook.remove()
    return calls[0].bias


# [g0 g1 a b i0 i1 r0 r1]: the reference (2 tokens) at strength 0.5
RULE = torch.tensor([
    #  g0   g1   a    b    i0   i1   r0    r1
    [0.0, 0.0, INF, INF, 0.0, 0.0, HALF, HALF],  # g0: the global text, every image token, the references
    [0.0, 0.0, INF, INF, 0.0, 0.0, HALF, HALF],  # g1
    [INF, INF, 0.0, INF, 0.0, INF, HALF, HALF],  # a: itself, the image inside its mask, the references
    [INF, INF, INF, 0.0, INF, 0.0, HALF, HALF],  # b
    [0.0, 0.0, 0.0, INF, 0.0, 0.0, HALF, HALF],  # i0 (left): global, a, every image token, the references
    [0.0, 0.0, INF, LOG2, 0.0, 0.0, HALF, HALF],  # i1 (right): b at its strength 2
    [0.0, 0.0, INF, INF, 0.0, 0.0, HALF, HALF],  # r0: as an image token outside every region: no region text
    [0.0, 0.0, INF, INF, 0.0, 0.0, HALF, HALF],  # r1
])  # fmt: skip


def test_the_mask_with_references_is_the_rule_written_out(weights):
    ref_bias = key_bias([0.5], [2], torch.float32, "cpu")
    bias = _call_bias(weights, "distilled", _two_regions(), ref_bias)
    torch.testing.assert_close(bias.dense(), RULE, atol=1e-6, rtol=0)
    # without a bias on the references (strength 1) the rule is the same, their logits plain
    plain = _call_bias(weights, "distilled", _two_regions(), None).dense()
    torch.testing.assert_close(plain, torch.where(RULE == HALF, 0.0, RULE), atol=1e-6, rtol=0)


def test_the_kv_models_cached_keys_are_read_as_plain_references_and_read_nothing(weights):
    # queries [g0 g1 a b i0 i1], keys [g0 g1 a b r0 r1 i0 i1]: the cached keys spliced in after the text
    ref_bias = key_bias([0.5], [2], torch.float32, "cpu")
    bias = _call_bias(weights, "kv", _two_regions(), ref_bias)
    keys = [0, 1, 2, 3, 6, 7, 4, 5]
    torch.testing.assert_close(bias.dense()[:6], RULE[:6][:, keys], atol=1e-6, rtol=0)
    # and one attention over them is the formula
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 6, 16, generator=g) for _ in range(3))
    k_ref, v_ref = (torch.randn(1, 2, 2, 16, generator=g) for _ in range(2))
    layer = RefKVLayer()
    layer.store(k_ref, v_ref)
    got = BlockCall(PLAIN, _no_rope(6), bias, num_txt=4).attention(q, k, v, kv=layer)
    all_k = torch.cat([k[:, :, :4], k_ref, k[:, :, 4:]], dim=2)
    all_v = torch.cat([v[:, :, :4], v_ref, v[:, :, 4:]], dim=2)
    expected = _by_hand(q, all_k, all_v, RULE[:6][:, keys])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def _no_rope(length, dim=16):
    return rotation_table(torch.stack([torch.ones(length, dim // 2), torch.zeros(length, dim // 2)], -1))


def _by_hand(q, k, v, bias):
    q, k, v = q.double(), k.double(), v.double()
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias.double()
    return (logits.softmax(-1) @ v).permute(0, 2, 1, 3).flatten(2).float()


def test_one_attention_under_the_mask_with_references_is_the_formula(weights):
    bias = _call_bias(weights, "distilled", _two_regions(), key_bias([0.5], [2], torch.float32, "cpu"))
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 8, 16, generator=g) for _ in range(3))
    got = BlockCall(PLAIN, _no_rope(8), bias, num_txt=4).attention(q, k, v)
    torch.testing.assert_close(got, _by_hand(q, k, v, RULE), atol=1e-5, rtol=1e-5)
    assert torch.equal(attention_bias(bias.dense()).squeeze(), bias.dense())


def test_no_query_is_left_without_a_key_with_references_at_zero(weights):
    # a reference at 0 for a step masks its keys: its own tokens still read the global text and the image
    bias = _call_bias(weights, "distilled", _two_regions(), key_bias([0.0], [2], torch.float32, "cpu"))
    dense = bias.dense()
    assert bool((dense > INF).any(-1).all()) and bool((dense[:, 6:] == INF).all())


# --- exact cases of whole runs ------------------------------------------------------------------------------

CASES = {  # variant, settings, reference sizes, negative prompt
    "distilled": ("distilled", SampleSettings(80, 64, 4, 1.0, 15), [(64, 96), (112, 64)], False),
    "base_cfg": ("base", SampleSettings(64, 64, 3, 3.5, 16), [(64, 64)], True),
    "kv": ("kv", SampleSettings(64, 64, 4, 1.0, 17), [(96, 64), (64, 80)], False),
    "kv_batch_2": ("kv", SampleSettings(64, 64, 3, 1.0, 18, batch_size=2), [(64, 64)], False),
}
GLOBAL, REGION_A, REGION_B, NEGATIVE = 100, 102, 103, 101


def _run(weights, case, positive, regions=None, references=None):
    variant, settings, _, negative = CASES[case]
    model = load_transformer(weights["dit_file"], variant=variant)
    request = SampleRequest(model, positive, settings, negative=_embeds(NEGATIVE) if negative else None,
                            references=references, regions=regions)  # fmt: skip
    return sample(request)


def _diffusers(weights, case, positive, with_images=True):
    variant, settings, sizes, negative = CASES[case]
    images = [random_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)] if with_images else None
    neg = _embeds(NEGATIVE) if negative else None
    return diffusers_run(make_diffusers_dit(seed=3), weights["vae"], variant, settings, positive, neg, images)


def _off_diffusers(weights, latents, expected):
    return (as_diffusers_latents(latents, weights["ours"]) - expected).abs().max().item()


@pytest.mark.parametrize("case", list(CASES))
def test_a_global_prompt_with_references_and_an_empty_region_is_the_plain_edit(weights, case):
    _, settings, sizes, _ = CASES[case]
    refs, glob = _references(weights, sizes), _embeds(GLOBAL)
    empty = RegionalPrompt(glob, (Region(_embeds(REGION_A), torch.zeros(settings.height, settings.width)),))
    got = _run(weights, case, glob, empty, refs)
    assert torch.equal(got, _run(weights, case, glob, None, refs))
    assert _off_diffusers(weights, got, _diffusers(weights, case, glob)) <= TOLERANCE


@pytest.mark.parametrize("case", list(CASES))
def test_one_whole_region_without_a_global_prompt_with_references_is_the_plain_edit_of_its_prompt(
    weights, case
):
    _, settings, sizes, _ = CASES[case]
    refs, a = _references(weights, sizes), _embeds(REGION_A)
    whole = RegionalPrompt(NONE, (Region(a, torch.ones(settings.height, settings.width)),))
    got = _run(weights, case, NONE, whole, refs)
    assert torch.equal(got, _run(weights, case, a, None, refs))
    assert _off_diffusers(weights, got, _diffusers(weights, case, a)) <= TOLERANCE


@pytest.mark.parametrize("case", list(CASES))
def test_every_reference_at_zero_is_todays_regional_run(weights, case):
    _, settings, sizes, _ = CASES[case]
    off = _references(weights, sizes, [ReferenceStrength(0.0)] * len(sizes))
    glob, (left, right) = _embeds(GLOBAL), _halves(settings.width, settings.height)
    regions = RegionalPrompt(glob, (Region(_embeds(REGION_A), left), Region(_embeds(REGION_B), right, 0.5)))
    assert torch.equal(_run(weights, case, glob, regions, off), _run(weights, case, glob, regions))
    # one whole-image region: the text-to-image run of its prompt, as diffusers makes it
    a = _embeds(REGION_A)
    whole = RegionalPrompt(NONE, (Region(a, torch.ones(settings.height, settings.width)),))
    got = _run(weights, case, NONE, whole, off)
    assert _off_diffusers(weights, got, _diffusers(weights, case, a, with_images=False)) <= TOLERANCE


@pytest.mark.parametrize("case", ["distilled", "base_cfg", "kv"])
def test_a_half_image_region_with_a_reference_moves_the_edit(weights, case):
    _, settings, sizes, _ = CASES[case]
    refs, glob = _references(weights, sizes), _embeds(GLOBAL)
    left, _ = _halves(settings.width, settings.height)
    plain = _run(weights, case, glob, None, refs)
    regional = _run(weights, case, glob, RegionalPrompt(glob, (Region(_embeds(REGION_A), left),)), refs)
    without = _run(weights, case, glob, RegionalPrompt(glob, (Region(_embeds(REGION_A), left),)))
    assert (regional - plain).abs().mean() > 1e-3 and (regional - without).abs().mean() > 1e-3
    assert torch.isfinite(regional).all()


# --- the leak of a region's prompt outside its mask ------------------------------------------------------

LEAK = SampleSettings(128, 128, 4, 1.0, 5)  # 8 x 8 tokens: region A is the left 4 columns


def _leak(weights, variant, with_references, seed):
    """(mean |change| outside region A, inside it) of the final latents when A's prompt changes."""
    model = load_transformer(weights["dit_file"], variant=variant)
    refs = _references(weights, [(128, 128), (96, 128)]) if with_references else None
    glob, (left, _) = _embeds(seed), _halves(128, 128)
    out = []
    for a in (seed + 1, seed + 2):
        regions = RegionalPrompt(glob, (Region(_embeds(a), left),))
        out.append(sample(SampleRequest(model, glob, LEAK, references=refs, regions=regions)))
    change = (out[0] - out[1]).abs()
    return change[..., 4:].mean().item(), change[..., :4].mean().item()


@pytest.mark.parametrize("variant", ["distilled", "kv"])
def test_a_regions_prompt_leaks_no_more_outside_its_mask_with_references_than_without(weights, variant):
    # the figures in docs/steering.md (benchmarks/regions_leak.py measures more seeds)
    for seed in (200, 300):
        outside, inside = _leak(weights, variant, False, seed)
        outside_refs, inside_refs = _leak(weights, variant, True, seed)
        assert inside > 5 * outside and inside_refs > 5 * outside_refs  # the prompt acts inside its mask
        assert outside_refs <= outside, (outside_refs, outside)


# --- strengths and step ranges keep their meaning --------------------------------------------------------


def test_the_effect_of_a_reference_grows_with_its_strength_in_a_regional_run(weights):
    glob, (left, _) = _embeds(GLOBAL), _halves(80, 64)
    regions = RegionalPrompt(glob, (Region(_embeds(REGION_A), left),))
    without = _run(weights, "distilled", glob, regions)
    distances = [
        (_run(weights, "distilled", glob, regions, _references(weights, [(64, 64)], [ReferenceStrength(s)]))
         - without).abs().mean().item()
        for s in (0.0, 0.25, 1.0, 4.0)
    ]  # fmt: skip
    assert distances[0] == 0.0 and all(b > a for a, b in zip(distances, distances[1:])), distances


def test_outside_its_step_range_a_reference_leaves_the_regional_call_as_today(weights):
    model = load_transformer(weights["dit_file"], variant="distilled")
    settings = SampleSettings(64, 64, 4, 1.0, 3)
    refs = _references(weights, [(64, 64)], [ReferenceStrength(2.0, 0.0, 0.5)])
    glob, (left, _) = _embeds(1), _halves(64, 64)
    regions = RegionalPrompt(glob, (Region(_embeds(2), left),))
    denoiser = Flux2Denoiser(SampleRequest(model, glob, settings, references=refs, regions=regions),
                             get_sigmas(4, 16).tolist())  # fmt: skip
    seen = []
    for sigma in get_sigmas(4, 16).tolist()[:-1]:
        extras = denoiser.extras(sigma, 0, "cpu")
        assert extras.regions is denoiser.mask
        seen.append(None if extras.references is None else sorted(set(extras.reference_bias.exp().tolist())))
    assert seen == [[2.0], [2.0], None, None]


def test_a_region_at_strength_zero_is_left_out_with_references(weights):
    refs, glob = _references(weights, [(64, 64)]), _embeds(GLOBAL)
    left, right = _halves(80, 64)
    a, b = Region(_embeds(REGION_A), left), Region(_embeds(REGION_B), right, 0.0)
    assert torch.equal(
        _run(weights, "distilled", glob, RegionalPrompt(glob, (a, b)), refs),
        _run(weights, "distilled", glob, RegionalPrompt(glob, (a,)), refs),
    )
