"""A strength per reference (flux2_core/reference_strength.py): the rule block by block against attention
written out here, its exact cases against diffusers' pipelines and against our own plain runs, the step
range, every model path (KV, CFG, batches, streaming, LoRA, quantised), and the refusals."""

from dataclasses import replace

import pytest
import torch
from parity_helpers import as_diffusers_latents, diffusers_run, random_image
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_vae import make_diffusers_vae, random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.denoiser import Flux2Denoiser
from flux2_core.devices.streaming import disable_streaming, enable_streaming
from flux2_core.dit.attention import attention_bias
from flux2_core.dit.block_ops import PLAIN
from flux2_core.dit.call import CallExtras
from flux2_core.dit.files import load_transformer
from flux2_core.dit.kv_cache import RefKVLayer
from flux2_core.dit.layers import BlockCall
from flux2_core.dit.rope import image_ids, reference_ids, rotation_table
from flux2_core.errors import Flux2Error
from flux2_core.kv_store import RefKVStore
from flux2_core.references import ReferenceLatents, encode_references
from flux2_core.sampling import (
    SampleRequest,
    SampleSettings,
    encode_reference_kv,
    get_sigmas,
    sample,
)
from flux2_core.steering.reference_strength import ReferenceStrength, key_bias
from flux2_core.vae.autoencoder import load_vae

TOLERANCE = 1e-4  # max abs difference on the final latents against diffusers, float32 on the CPU (as parity)
T = 512


def _embeds(seed, batch=1):
    return torch.randn(batch, T, 24, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    root = tmp_path_factory.mktemp("strength")
    vae_sd = random_vae_state_dict(seed=4)
    return {
        "dit_file": write_bfl_file(make_diffusers_dit(seed=3), root / "flux-2-klein-4b.safetensors"),
        "vae": make_diffusers_vae(vae_sd),
        "ours": load_vae(write_vae_file(vae_sd, root / "flux2-vae.safetensors")),
    }


def _references(weights, sizes, strengths=None):
    refs = encode_references(weights["ours"], [random_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)])
    return refs if strengths is None else replace(refs, strengths=tuple(strengths))


# --- the rule, one attention call against the formula ----------------------------------------------------


def _by_hand(q, k, v, bias):
    """softmax(q k^T / sqrt(d) + bias) v, written out in float64."""
    q, k, v = q.double(), k.double(), v.double()
    logits = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + bias.double()
    return logits.softmax(-1) @ v


def _qkv(batch=1, heads=2, length=10, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, heads, length, dim, generator=g) for _ in range(3)]


def _no_rope(length, dim=16):
    """The identity rotation table (cos 1, sin 0): the call's q and k come rotated already (the blocks rotate
    them), so the formula needs no RoPE of its own."""
    return rotation_table(torch.stack([torch.ones(length, dim // 2), torch.zeros(length, dim // 2)], -1))


def _call_bias(weights, variant, ref_bias, num_txt, num_img, ref_grids):
    """The bias the DiT hands its blocks (their ``BlockCall``) in a call of ``num_txt`` text and ``num_img``
    image tokens with references on ``ref_grids`` (the KV model: their cached K/V) at ``ref_bias``."""
    net = load_transformer(weights["dit_file"], variant=variant).transformer
    g = torch.Generator().manual_seed(9)
    ref_ids = reference_ids(ref_grids)
    ref = torch.randn(1, ref_ids.shape[0], 128, generator=g)
    x, ctx = torch.randn(1, num_img, 128, generator=g), torch.randn(1, num_txt, 24, generator=g)
    if variant == "kv":
        extras = CallExtras(kv_cache=net.encode_reference_kv(ref, ref_ids), reference_bias=ref_bias)
    else:
        extras = CallExtras(references=(ref, ref_ids), reference_bias=ref_bias)
    calls = []
    hook = net.double_blocks[0].register_forward_pre_hook(lambda m, args: calls.append(args[4]))
    with torch.inference_mode():
        net(x, image_ids(1, num_img), torch.tensor([0.7]), ctx, extras)
    hook.remove()
    return calls[0].bias


def test_one_attention_with_reference_strengths_is_the_formula(weights):
    # keys: 3 text, 4 image, then references of 2 and 1 tokens at strengths 0.5 and 3
    q, k, v = _qkv(length=10)
    ref_bias = key_bias([0.5, 3.0], [2, 1], torch.float32, "cpu")
    own = torch.cat([torch.zeros(7), ref_bias])
    bias = _call_bias(weights, "distilled", ref_bias, 3, 4, [(1, 2), (1, 1)])
    assert torch.equal(bias, attention_bias(own))  # the references' keys, after the text and image keys
    got = BlockCall(PLAIN, _no_rope(10), bias, num_txt=3).attention(q, k, v)
    expected = _by_hand(q, k, v, own)
    torch.testing.assert_close(got, expected.permute(0, 2, 1, 3).flatten(2).float(), atol=1e-5, rtol=1e-5)


def test_the_kv_model_biases_the_cached_keys_spliced_after_the_text(weights):
    q, k, v = _qkv(length=6, seed=1)  # 2 text + 4 image tokens
    k_ref, v_ref = _qkv(length=3, seed=2)[1:]
    layer = RefKVLayer()
    layer.store(k_ref, v_ref)
    ref_bias = key_bias([0.25], [3], torch.float32, "cpu")
    call_bias = _call_bias(weights, "kv", ref_bias, 2, 4, [(1, 3)])
    got = BlockCall(PLAIN, _no_rope(6), call_bias, num_txt=2).attention(q, k, v, kv=layer)
    keys = torch.cat([k[:, :, :2], k_ref, k[:, :, 2:]], dim=2)
    values = torch.cat([v[:, :, :2], v_ref, v[:, :, 2:]], dim=2)
    bias = torch.cat([torch.zeros(2), ref_bias, torch.zeros(4)])
    assert torch.equal(call_bias, attention_bias(bias))  # the cached keys' bias, spliced in after the text
    expected = _by_hand(q, keys, values, bias)
    torch.testing.assert_close(got, expected.permute(0, 2, 1, 3).flatten(2).float(), atol=1e-5, rtol=1e-5)


def test_the_share_of_attention_a_reference_gets_grows_with_its_strength():
    q, k, _ = _qkv(length=8, seed=3)  # 6 text and image keys, then a reference of 2
    shares = []
    for s in (0.0, 0.1, 0.5, 1.0, 2.0, 8.0):
        ref = key_bias([s], [2], torch.float32, "cpu")  # None at 1: no bias
        bias = torch.cat([torch.zeros(6), torch.zeros(2) if ref is None else ref])
        weights = (q @ k.transpose(-1, -2) / 4.0 + bias).softmax(-1)
        shares.append(weights[..., 6:].sum(-1))
    assert torch.all(shares[0] == 0)
    for low, high in zip(shares, shares[1:]):
        assert torch.all(high > low)


# --- exact cases of whole runs ---------------------------------------------------------------------------

STRENGTH_CASES = {  # variant, settings, reference sizes, negative prompt
    "distilled_two_references": (
        "distilled",
        SampleSettings(80, 64, 4, 1.0, 15),
        [(64, 96), (112, 64)],
        False,
    ),
    "base_cfg": ("base", SampleSettings(64, 64, 3, 3.5, 16), [(64, 64)], True),
    "kv_two_references": ("kv", SampleSettings(64, 64, 4, 1.0, 17), [(96, 64), (64, 80)], False),
    "kv_batch_2": ("kv", SampleSettings(64, 64, 3, 1.0, 18, batch_size=2), [(64, 64)], False),
}


def _run(weights, variant, settings, references, negative):
    model = load_transformer(weights["dit_file"], variant=variant)
    request = SampleRequest(model, _embeds(100), settings, negative=_embeds(101) if negative else None,
                            references=references)  # fmt: skip
    return sample(request)


@pytest.mark.parametrize("case", list(STRENGTH_CASES))
def test_strength_zero_for_every_reference_is_diffusers_text_to_image(weights, case):
    variant, settings, sizes, negative = STRENGTH_CASES[case]
    off = _references(weights, sizes, [ReferenceStrength(0.0)] * len(sizes))
    got = as_diffusers_latents(_run(weights, variant, settings, off, negative), weights["ours"])
    neg = _embeds(101) if negative else None
    expected = diffusers_run(make_diffusers_dit(seed=3), weights["vae"], variant, settings, _embeds(100), neg)
    assert (got - expected).abs().max().item() <= TOLERANCE
    # and our own text-to-image run, bit for bit (the call is the one without references)
    assert torch.equal(
        _run(weights, variant, settings, off, negative), _run(weights, variant, settings, None, negative)
    )


@pytest.mark.parametrize("case", list(STRENGTH_CASES))
def test_strength_one_for_every_reference_is_today_and_diffusers_edit(weights, case):
    variant, settings, sizes, negative = STRENGTH_CASES[case]
    plain = _references(weights, sizes)
    ones = _references(weights, sizes, [ReferenceStrength(1.0)] * len(sizes))
    got = _run(weights, variant, settings, ones, negative)
    assert torch.equal(got, _run(weights, variant, settings, plain, negative))
    images = [random_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    neg = _embeds(101) if negative else None
    dit = make_diffusers_dit(seed=3)
    expected = diffusers_run(dit, weights["vae"], variant, settings, _embeds(100), neg, images)
    assert (as_diffusers_latents(got, weights["ours"]) - expected).abs().max().item() <= TOLERANCE


@pytest.mark.parametrize("variant", ["distilled", "kv"])
def test_the_effect_grows_with_the_strength(weights, variant):
    settings, sizes = SampleSettings(64, 64, 4, 1.0, 21), [(64, 64)]
    t2i = _run(weights, variant, settings, None, False)
    distances = [
        (_run(weights, variant, settings, _references(weights, sizes, [ReferenceStrength(s)]), False) - t2i)
        .abs()
        .mean()
        .item()
        for s in (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
    ]
    assert distances[0] == 0.0
    assert all(b > a for a, b in zip(distances, distances[1:])), distances


def test_a_reference_at_zero_reaches_no_other_token(weights):
    # Two references, the first at 0: one DiT call equals the call with the second alone (at its own ids).
    model = load_transformer(weights["dit_file"], variant="distilled")
    net, refs = model.transformer, _references(weights, [(64, 96), (64, 64)])
    g = torch.Generator().manual_seed(5)
    x, ctx = torch.randn(1, 16, 128, generator=g), _embeds(7)[:, :20]
    first = refs.token_counts[0]
    with torch.inference_mode():
        args = (x, image_ids(4, 4), torch.tensor([0.7]), ctx)
        masked = net(
            *args,
            CallExtras(
                references=(refs.tokens, refs.ids),
                reference_bias=key_bias([0.0, 1.0], refs.token_counts, torch.float32, "cpu"),
            ),
        )
        alone = net(*args, CallExtras(references=(refs.tokens[:, first:], refs.ids[first:])))
    torch.testing.assert_close(masked, alone, atol=1e-5, rtol=1e-5)


# --- the step range ---------------------------------------------------------------------------------------


def test_outside_its_step_range_a_reference_counts_as_zero(weights):
    model = load_transformer(weights["dit_file"], variant="distilled")
    settings = SampleSettings(64, 64, 4, 1.0, 3)
    refs = _references(weights, [(64, 64), (64, 64)])
    refs = replace(refs, strengths=(ReferenceStrength(2.0, 0.0, 0.5), ReferenceStrength(1.0, 0.25, 1.0)))
    request = SampleRequest(model, _embeds(1), settings, references=refs)
    schedule = get_sigmas(4, 16).tolist()
    denoiser = Flux2Denoiser(request, schedule)
    seen = []
    for sigma in schedule[:-1]:
        extras = denoiser.extras(sigma, 0, "cpu")
        bias = extras.reference_bias
        seen.append(None if bias is None else sorted(set(bias.exp().tolist())))
        assert extras.references is not None
    # steps 0..3 of 4: the first reference at 2 on steps 0-1, the second at 1 on steps 1-3
    assert seen == [[0.0, 2.0], [1.0, 2.0], [0.0, 1.0], [0.0, 1.0]]


def test_the_step_range_is_compared_as_written():
    # start <= i / n < end, not start * n <= i < end * n: 0.28 * 25 is 7.000000000000001 in floats
    assert ReferenceStrength(2.0, 0.28, 1.0).at(7, 25) == 2.0
    assert ReferenceStrength(2.0, 0.0, 0.56).at(14, 25) == 0.0
    assert ReferenceStrength(2.0, 0.0, 0.56).at(13, 25) == 2.0


def test_a_call_between_two_sigmas_belongs_to_the_step_that_runs_from_the_one_above():
    from flux2_core.steering.reference_strength import step_of

    schedule = [1.0, 0.8, 0.5, 0.2, 0.0]
    assert [step_of(schedule, s) for s in schedule[:-1]] == [0, 1, 2, 3]
    assert step_of(schedule, float(torch.tensor(0.8, dtype=torch.float32))) == 1  # the model's float32 copy
    # a midpoint sampler's call between 0.8 and 0.5 (nearer 0.5) is step 1's, not step 2's
    assert step_of(schedule, 0.55) == 1 and step_of(schedule, 0.79) == 1 and step_of(schedule, 0.05) == 3


@pytest.mark.parametrize(
    "strength, steps, denoise, message",
    [
        (ReferenceStrength(1.0, 0.5, 0.5), 4, 1.0, "reference 1 counts at none of the 4 steps: step i"),
        (ReferenceStrength(2.0, 0.3, 0.45), 2, 1.0, "start 0.3, end 0.45 holds none of the steps that run"),
        (ReferenceStrength(2.0, 0.0, 0.5), 4, 0.5, "none of the 4 steps, the first 2 skipped by denoise"),
    ],
)
def test_a_step_range_that_holds_no_step_that_runs_is_refused(weights, strength, steps, denoise, message):
    # the reference would count nowhere: the run would be the one without it, which is never what was asked
    model = load_transformer(weights["dit_file"], variant="distilled")
    refs = _references(weights, [(64, 64)], [strength])
    start = torch.zeros(1, 128, 4, 4) if denoise < 1 else None
    with pytest.raises(Flux2Error, match=message):
        SampleRequest(model, _embeds(1), SampleSettings(64, 64, steps, 1.0, 22), references=refs, start=start,
                      strength=denoise)  # fmt: skip
    off = _references(weights, [(64, 64)], [replace(strength, strength=0.0)])  # at 0 it is meant to be off
    SampleRequest(model, _embeds(1), SampleSettings(64, 64, steps, 1.0, 22), references=off, start=start,
                  strength=denoise)  # fmt: skip


# --- every path --------------------------------------------------------------------------------------------


def test_one_kv_cache_serves_every_strength_and_the_store_still_hits(weights):
    model = load_transformer(weights["dit_file"], variant="kv")
    store, calls = RefKVStore(), []
    refs = _references(weights, [(64, 64)])

    def compute(r):
        calls.append(1)
        return encode_reference_kv(model, r)

    first, hit = store.get(model, refs, lambda: compute(refs))
    assert not hit
    weaker = refs.with_strength(ReferenceStrength(0.3, 0.0, 0.5))
    again, hit = store.get(model, weaker, lambda: compute(weaker))
    assert hit and again is first and len(calls) == 1
    settings = SampleSettings(64, 64, 3, 1.0, 8)
    given = sample(SampleRequest(model, _embeds(2), settings, references=weaker, kv_cache=first))
    computed = sample(SampleRequest(model, _embeds(2), settings, references=weaker))
    assert torch.equal(given, computed)


def test_streamed_blocks_compute_the_same_biased_run(weights):
    model = load_transformer(weights["dit_file"], variant="distilled")
    settings = SampleSettings(64, 64, 3, 1.0, 9)
    refs = _references(weights, [(64, 64), (64, 80)], [ReferenceStrength(0.5), ReferenceStrength(2.0)])
    resident = sample(SampleRequest(model, _embeds(3), settings, references=refs))
    enable_streaming(model.transformer, "cpu", resident_bytes=0)
    try:
        streamed = sample(SampleRequest(model, _embeds(3), settings, references=refs))
    finally:
        disable_streaming(model.transformer)
    assert torch.equal(resident, streamed)


def test_strengths_survive_chaining_references():
    lat = [torch.randn(1, 128, 2, 3), torch.randn(1, 128, 3, 3), torch.randn(1, 128, 2, 2)]
    a = ReferenceLatents.from_latents(lat[:2]).with_strength(ReferenceStrength(0.5))
    b = ReferenceLatents.from_latents(lat[2:]).with_strength(ReferenceStrength(2.0, 0.0, 0.5))
    joined = a + b
    assert joined.strengths == (ReferenceStrength(0.5),) * 2 + (ReferenceStrength(2.0, 0.0, 0.5),)
    assert (
        joined.token_counts == [6, 9, 4] and not joined.plain and (a + b).latents()[2].shape == (1, 128, 2, 2)
    )


@pytest.mark.parametrize(
    "kwargs, names",
    [
        (dict(strength=-0.5), "reference strength -0.5"),
        (dict(strength=float("nan")), "reference strength nan"),
        (dict(strength=11.0), "reference strength 11.0"),
        (dict(start=0.6, end=0.4), "start 0.6, end 0.4"),
        (dict(end=1.5), "end 1.5"),
    ],
)
def test_bad_strengths_are_refused_by_name(kwargs, names):
    with pytest.raises(Flux2Error, match="not allowed") as e:
        ReferenceStrength(**kwargs)
    assert names in str(e.value)


def test_a_strength_count_that_does_not_match_the_references_is_refused():
    refs = ReferenceLatents.from_latents([torch.randn(1, 128, 2, 2)])
    with pytest.raises(Flux2Error, match="2 reference strengths for 1 references"):
        replace(refs, strengths=(ReferenceStrength(), ReferenceStrength()))


def test_quantised_split_and_lora_paths_keep_the_exact_cases(weights, tmp_path):
    from quant_files import write_quantised
    from safetensors.torch import save_file
    from tiny_dit import bfl_state_dict

    from flux2_core.devices.placement import place_blocks, remove_placement
    from flux2_core.lora import prepare_lora, read_lora

    sd = bfl_state_dict(make_diffusers_dit(seed=3))
    write_quantised(sd, tmp_path / "fp8.safetensors", "float8_e4m3fn")
    g = torch.Generator().manual_seed(4)
    lora_file = tmp_path / "lora.safetensors"
    layer = "double_blocks.0.img_attn.qkv"
    out, inp = sd[layer + ".weight"].shape
    down, up = torch.randn(2, inp, generator=g), torch.randn(out, 2, generator=g)
    save_file({f"diffusion_model.{layer}.lora_A.weight": down, f"diffusion_model.{layer}.lora_B.weight": up},
              str(lora_file))  # fmt: skip
    model = load_transformer(tmp_path / "fp8.safetensors", variant="distilled")
    model = model.with_lora(prepare_lora(read_lora(lora_file), model.transformer))
    settings, sizes = SampleSettings(64, 64, 3, 1.0, 12), [(64, 64), (64, 80)]

    def run(refs):
        return sample(SampleRequest(model, _embeds(4), settings, references=refs))

    t2i, plain = run(None), run(_references(weights, sizes))
    off = _references(weights, sizes, [ReferenceStrength(0.0)] * 2)
    mixed = _references(weights, sizes, [ReferenceStrength(0.5), ReferenceStrength(2.0, 0.0, 0.5)])
    assert torch.equal(run(off), t2i) and torch.equal(
        run(_references(weights, sizes, [ReferenceStrength()] * 2)), plain
    )
    whole = run(mixed)
    place_blocks(model.transformer, ["cpu", "cpu"])  # the block split: the bias follows each block's device
    try:
        assert torch.equal(run(mixed), whole)
    finally:
        remove_placement(model.transformer)
