"""Regional prompts (flux2_core/steering/regions.py): the mask against the rule written out by hand, one
attention call against the formula, the exact cases against diffusers and our own plain runs, CFG's
unmasked negative pass, and the refusals (with references: ``test_regional_edit.py``)."""

import math

import pytest
import torch
from parity_helpers import as_diffusers_latents, diffusers_run
from tiny_dit import make_diffusers_dit, write_bfl_file
from tiny_vae import make_diffusers_vae, random_vae_state_dict
from tiny_vae import write_bfl_file as write_vae_file

from flux2_core.dit.attention import attend, attention_bias, sdpa_kernel
from flux2_core.dit.block_ops import PLAIN
from flux2_core.dit.files import load_transformer
from flux2_core.dit.layers import BlockCall
from flux2_core.dit.rope import rotation_table
from flux2_core.errors import Flux2Error
from flux2_core.sampling import SampleRequest, SampleSettings, sample
from flux2_core.steering.regions import Region, RegionalPrompt, latent_region_mask, regional_plan
from flux2_core.vae.autoencoder import load_vae

TOLERANCE = 1e-4  # against diffusers, as the pipeline parity
INF = -math.inf


def _embeds(seed, tokens=40):
    return torch.randn(1, tokens, 24, generator=torch.Generator().manual_seed(seed))


NONE = torch.zeros(1, 0, 24)


def test_the_mask_is_the_rule_written_out():
    # a 1 x 2 latent grid (image tokens i0 left, i1 right), a global prompt of 2 tokens (g), region A of 1
    # token over the left half (a), region B of 1 token over the right half at strength 2 (b)
    left = torch.tensor([[1.0] * 16 + [0.0] * 16] * 16)
    regions = RegionalPrompt(
        _embeds(0, 2), (Region(_embeds(1, 1), left), Region(_embeds(2, 1), 1 - left, 2.0))
    )
    context, mask = regional_plan(regions, (1, 2), torch.float32, "cpu")
    assert context.shape == (1, 4, 24)
    log2 = math.log(2.0)
    #                 g0   g1   a    b    i0   i1      (keys)
    expected = torch.tensor([
        [0.0, 0.0, INF, INF, 0.0, 0.0],  # g0: the global text and every image token
        [0.0, 0.0, INF, INF, 0.0, 0.0],  # g1
        [INF, INF, 0.0, INF, 0.0, INF],  # a: itself and the image inside its mask
        [INF, INF, INF, 0.0, INF, 0.0],  # b
        [0.0, 0.0, 0.0, INF, 0.0, 0.0],  # i0 (left): global, a, every image token
        [0.0, 0.0, INF, log2, 0.0, 0.0],  # i1 (right): global, b at strength 2, every image token
    ])  # fmt: skip
    assert torch.equal(mask.dense(), expected)
    # the factored form: one group for the global text, one per region's text, one per set of regions
    keys = {tuple(g.queries.tolist()): g.keys.tolist() for g in mask.groups}
    assert keys == {
        (0, 1): [0, 1, 4, 5],
        (2,): [2, 4],
        (3,): [3, 5],
        (4,): [0, 1, 2, 4, 5],
        (5,): [0, 1, 3, 4, 5],
    }
    bias = {tuple(g.queries.tolist()): None if g.bias is None else g.bias.tolist() for g in mask.groups}
    assert bias[(5,)] == pytest.approx([0.0, 0.0, log2, 0.0, 0.0])  # i1 reads b at strength 2
    assert bias[(4,)] is None


def test_latent_masks_count_a_token_when_half_its_pixels_are_white():
    mask = torch.zeros(32, 32)
    mask[:, :8] = 1  # half of each token of the left column: they count
    mask[:16, 16:] = 1  # all of the top right token
    mask[16:, 16:20] = 1  # a quarter of the bottom right token: it does not
    assert latent_region_mask(mask, (2, 2)).tolist() == [True, True, True, False]


def test_one_attention_under_the_mask_is_the_formula():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 16, generator=g) for _ in range(3))
    left = torch.tensor([[1.0] * 16 + [0.0] * 16] * 16)
    regions = RegionalPrompt(_embeds(0, 2), (Region(_embeds(1, 2), left, 0.5),))
    _, mask = regional_plan(regions, (1, 2), torch.float32, "cpu")
    rope = rotation_table(torch.stack([torch.ones(6, 8), torch.zeros(6, 8)], -1))  # the identity rotation
    got = BlockCall(PLAIN, rope, mask, num_txt=4).attention(q, k, v)  # q and k come rotated
    logits = q.double() @ k.double().transpose(-1, -2) / 4.0 + mask.dense().double()
    expected = (logits.softmax(-1) @ v.double()).permute(0, 2, 1, 3).flatten(2)
    torch.testing.assert_close(got, expected.float(), atol=1e-5, rtol=1e-5)


def _three_overlapping_regions():
    """A 3 x 4 grid under a global prompt of 3 tokens and three overlapping regions (one at strength 0.7)."""
    masks = [torch.zeros(48, 64) for _ in range(3)]
    masks[0][:, :32] = 1
    masks[1][16:, 16:48] = 1
    masks[2][:32, 32:] = 1
    strengths = (1.0, 0.7, 1.0)
    regions = tuple(Region(_embeds(5 + i, 2 + i), m, s) for i, (m, s) in enumerate(zip(masks, strengths)))
    return RegionalPrompt(_embeds(4, 3), regions)


def test_the_grouped_mask_attends_as_its_dense_form():
    # 12 image tokens held by every combination of three overlapping regions: each query over the same keys
    # as under the dense [L, L] mask, with the same logits
    _, mask = regional_plan(_three_overlapping_regions(), (3, 4), torch.float32, "cpu")
    length = mask.length
    assert length == 3 + 2 + 3 + 4 + 12 and len(mask.groups) > 5
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, length, 16, generator=g) for _ in range(3))
    got = mask.attend(q, k, v, sdpa_kernel)
    expected = attend(q, k, v, attention_bias(mask.dense()))
    torch.testing.assert_close(attend(q, k, v, mask), got, atol=0, rtol=0)  # attended group by group
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    assert sorted(torch.cat([grp.queries for grp in mask.groups]).tolist()) == list(range(length))


def test_the_grouped_mask_follows_its_tokens_when_they_are_reordered():
    # sequence parallelism hands attention the tokens in another order (``arranged``)
    _, mask = regional_plan(_three_overlapping_regions(), (3, 4), torch.float32, "cpu")
    order = torch.randperm(mask.length, generator=torch.Generator().manual_seed(3))
    dense = mask.dense()
    assert torch.equal(mask.arranged(order).dense(), dense[order][:, order])
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, mask.length, 8, generator=g) for _ in range(3))
    got = mask.arranged(order).attend(q[:, :, order], k[:, :, order], v[:, :, order], sdpa_kernel)
    torch.testing.assert_close(got, mask.attend(q, k, v, sdpa_kernel)[:, :, order], atol=1e-6, rtol=1e-6)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    root = tmp_path_factory.mktemp("regions")
    path = write_bfl_file(make_diffusers_dit(seed=3), root / "flux-2-klein-4b.safetensors")
    vae_sd = random_vae_state_dict(seed=4)
    vae = load_vae(write_vae_file(vae_sd, root / "flux2-vae.safetensors"))
    return {"path": path, "vae": make_diffusers_vae(vae_sd), "ours": vae}


SETTINGS = SampleSettings(64, 96, 4, 1.0, 5)
FULL, EMPTY = torch.ones(96, 64), torch.zeros(96, 64)
LEFT = torch.cat([torch.ones(96, 32), torch.zeros(96, 32)], dim=1)


def _run(model, positive, regions=None, variant="distilled", settings=SETTINGS, negative=None):
    dit = load_transformer(model["path"], variant=variant)
    return sample(SampleRequest(dit, positive, settings, negative=negative, regions=regions))


def _diffusers(model, positive, settings=SETTINGS):
    return diffusers_run(make_diffusers_dit(seed=3), model["vae"], "distilled", settings, positive)


def _ours_as_diffusers(model, latents):
    return as_diffusers_latents(latents, model["ours"])


def test_one_region_over_the_whole_image_is_the_plain_run_of_its_prompt(model):
    a = _embeds(10)
    got = _run(model, NONE, RegionalPrompt(NONE, (Region(a, FULL),)))
    assert torch.equal(got, _run(model, a))
    expected = _diffusers(model, a)
    assert (_ours_as_diffusers(model, got) - expected).abs().max().item() <= TOLERANCE


def test_a_global_prompt_with_an_empty_region_is_the_plain_run_of_the_global_prompt(model):
    glob, a = _embeds(11), _embeds(12)
    got = _run(model, glob, RegionalPrompt(glob, (Region(a, EMPTY),)))
    assert torch.equal(got, _run(model, glob))
    assert (_ours_as_diffusers(model, got) - _diffusers(model, glob)).abs().max().item() <= TOLERANCE


def test_a_region_at_strength_zero_is_left_out(model):
    glob, a, b = _embeds(13), _embeds(14), _embeds(15)
    with_b = RegionalPrompt(glob, (Region(a, LEFT), Region(b, 1 - LEFT, 0.0)))
    assert torch.equal(_run(model, glob, with_b), _run(model, glob, RegionalPrompt(glob, (Region(a, LEFT),))))


def test_the_masked_whole_image_region_equals_the_plain_run_within_rounding(model):
    # strength just under 1 takes the mask path: the mask itself is then checked against the plain run
    a = _embeds(16)
    got = _run(model, NONE, RegionalPrompt(NONE, (Region(a, FULL, 1 - 1e-7),)))
    torch.testing.assert_close(got, _run(model, a), atol=1e-4, rtol=0)


def test_regions_place_their_prompts(model):
    glob, a, b = _embeds(17), _embeds(18), _embeds(19)
    plain = _run(model, glob)
    one = _run(model, glob, RegionalPrompt(glob, (Region(a, LEFT),)))
    two = _run(model, glob, RegionalPrompt(glob, (Region(a, LEFT), Region(b, 1 - LEFT))))
    assert (one - plain).abs().mean() > 1e-3 and (two - one).abs().mean() > 1e-3


def test_the_negative_pass_stays_unmasked(model, monkeypatch):
    dit = load_transformer(model["path"], variant="base")
    net, masks = dit.transformer, []
    forward = net.forward

    def recording(x, x_ids, t, ctx, extras):
        masks.append(extras.regions)
        return forward(x, x_ids, t, ctx, extras)

    monkeypatch.setattr(net, "forward", recording)
    glob, a = _embeds(20), _embeds(21)
    settings = SampleSettings(64, 96, 2, 4.0, 6)
    request = SampleRequest(
        dit, glob, settings, negative=_embeds(22), regions=RegionalPrompt(glob, (Region(a, LEFT),))
    )
    sample(request)
    assert [m is not None for m in masks] == [True, False] * 2  # positive (masked), negative: every step


def test_regions_from_another_text_encoder_are_named_as_such(model):
    dit = load_transformer(model["path"], variant="distilled")
    other = torch.zeros(1, 4, 12)  # a text encoder of another width
    no_global = RegionalPrompt(other[:, :0], (Region(other, LEFT),))
    with pytest.raises(Flux2Error, match="this regional prompt's conditioning gives 12"):
        SampleRequest(dit, no_global.global_embeds, SETTINGS, regions=no_global)


def test_no_prompt_left_is_refused(model):
    with pytest.raises(Flux2Error, match="no prompt is left"):
        _run(model, NONE, RegionalPrompt(NONE, (Region(_embeds(1), EMPTY),)))


def test_a_region_left_out_is_said(caplog):
    prompt = RegionalPrompt(_embeds(0), (Region(_embeds(1), LEFT), Region(_embeds(2), EMPTY)))
    with caplog.at_level("WARNING", logger="flux2_core"):
        regional_plan(prompt, (4, 4), torch.float32, "cpu")
    assert "region 2 of 2 covers no 16 x 16 token at 64x64" in caplog.text and "region 1" not in caplog.text


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Region(_embeds(1), LEFT, -1.0), "region strength -1.0"),
        (lambda: Region(torch.zeros(2, 4, 24), LEFT), "encode one prompt per region"),
        (lambda: Region(_embeds(1), torch.zeros(2, 8, 8)), "give one mask"),
        (lambda: Region(_embeds(1), torch.ones(1, 0, 0)), "mask is 0x0 pixels: give a mask with the region"),
        (lambda: RegionalPrompt(NONE, ()).add(Region(torch.zeros(1, 4, 12), LEFT)), "same text encoder"),
    ],
)
def test_bad_regions_are_refused_by_name(make, message):
    with pytest.raises(Flux2Error, match=message):
        make()


def test_regions_at_strength_one_carry_no_bias():
    left = torch.tensor([[1.0] * 16 + [0.0] * 16] * 16)
    regions = RegionalPrompt(_embeds(0, 2), (Region(_embeds(1, 2), left), Region(_embeds(2, 1), 1 - left)))
    _, mask = regional_plan(regions, (1, 2), torch.float32, "cpu")
    assert mask.dense().dtype == torch.bool
    # the image tokens see every key but the other region's text, with no bias
    image_groups = {g.queries.item(): (g.keys.tolist(), g.bias) for g in mask.groups if g.queries.min() >= 5}
    assert image_groups == {
        5: ([0, 1, 2, 3, 5, 6], None),  # the left token: not region B's text
        6: ([0, 1, 4, 5, 6], None),  # the right one: not region A's
    }


def test_the_memory_estimate_counts_the_joined_prompts_and_the_mask(model):
    from flux2_core.sampling import estimate_memory
    from flux2_core.sampling_checks import activation_bytes

    dit = load_transformer(model["path"], variant="distilled")
    settings = SampleSettings(64, 96, 4, 1.0, 5)  # 24 image tokens
    glob, a = _embeds(30, 512), _embeds(31, 512)
    plain = estimate_memory(dit, settings, None)
    regions = RegionalPrompt(glob, (Region(a, LEFT, 0.5),))
    got = estimate_memory(dit, settings, None, regions)
    hidden = dit.config.hidden_size
    longer = activation_bytes(1, 1024 + 24, hidden, torch.float32)
    shorter = activation_bytes(1, 512 + 24, hidden, torch.float32)
    # one group's keys and values (at most all 1024 + 24 tokens), its queries and output (24 image tokens)
    gathered = (2 * (1024 + 24) + 2 * 24) * hidden * 4
    assert got - plain == longer - shorter + gathered
    # native memory planning knows the prompts' token counts only (nodes.native_classes.REGION_TOKENS)
    assert estimate_memory(dit, settings, None, [512, 512]) == got
