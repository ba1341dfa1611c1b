"""The native-graph bridge without ComfyUI: the core call native samplers make, and the conditioning
conversions' checks. The real ComfyUI side (native samplers, EasyCache, LoRA refusal) is tested in
integration/test_native_model.py.

``latent_velocity`` is what our native MODEL's diffusion model runs: latents [B, 128, h, w] in native
FLUX.2's layout. It is checked against diffusers' transformer called on the packed tokens, with the ids
written out here from the FLUX.2 conventions (text (0, 0, 0, i); image (0, r, c, 0); reference k at time
10 (k + 1)), so a transposed packing, a wrong reference offset or a sign slip shows.
"""

from __future__ import annotations

import math

import pytest
import torch
from tiny_dit import make_diffusers_dit, write_bfl_file

from flux2_core import latent_velocity, load_transformer


def ids_of(t: int, h: int, w: int) -> torch.Tensor:
    rows, cols = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    return torch.stack([torch.full_like(rows, t), rows, cols, torch.zeros_like(rows)], -1).reshape(-1, 4)


def tokens_of(latent: torch.Tensor) -> torch.Tensor:
    """[B, C, h, w] -> [B, h * w, C], row-major (BFL's and diffusers' packing of FLUX.2 latents)."""
    return latent.flatten(2).transpose(1, 2)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    reference = make_diffusers_dit(seed=3)
    path = write_bfl_file(reference, tmp_path_factory.mktemp("bridge") / "dit.safetensors")
    return reference, load_transformer(path, variant="distilled")


def test_latent_velocity_is_the_transformer_on_packed_latents_with_references(models):
    reference, model = models
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 128, 3, 4, generator=g)
    refs = [torch.randn(1, 128, 2, 3, generator=g), torch.randn(1, 128, 2, 2, generator=g)]
    ctx = torch.randn(2, 7, 24, generator=g)
    sigma = torch.tensor([0.8, 0.8])
    txt_ids = torch.stack([torch.zeros(7), torch.zeros(7), torch.zeros(7), torch.arange(7.0)], -1)
    img_ids = torch.cat([ids_of(0, 3, 4), ids_of(10, 2, 3), ids_of(20, 2, 2)])
    hidden = torch.cat([tokens_of(x), *(tokens_of(r).expand(2, -1, -1) for r in refs)], 1)
    with torch.no_grad():
        want = reference(hidden_states=hidden, encoder_hidden_states=ctx, timestep=sigma, img_ids=img_ids,
                         txt_ids=txt_ids, return_dict=False)[0][:, :12]  # fmt: skip
    got = latent_velocity(model, x, sigma, ctx, refs)
    assert got.shape == x.shape and got.dtype == torch.float32
    torch.testing.assert_close(tokens_of(got), want, atol=1e-5, rtol=0)
    plain = latent_velocity(model, x, sigma, ctx)
    assert (plain - got).abs().mean() > 1e-3  # the references reach the output
    alone = latent_velocity(model, x[:1], sigma[:1], ctx[:1], refs)
    torch.testing.assert_close(alone, got[:1], atol=1e-5, rtol=0)  # batch items are independent


def test_from_native_conditioning_checks_what_it_is_given(fake_pack):
    native, Flux2Error = fake_pack.nodes.native, fake_pack.flux2_core.Flux2Error  # the pack's own copy
    embeds = torch.randn(1, 512, 96)
    ours = native.from_native([[embeds, {"pooled_output": None}]])
    assert torch.equal(ours.embeds, embeds) and ours.width == 96
    assert torch.equal(ours.to_native()[0][0], embeds)  # and back: the same tensor
    with pytest.raises(Flux2Error, match="2 entries"):
        native.from_native([[embeds, {}], [embeds, {}]])
    with pytest.raises(Flux2Error, match="Reference Encode"):
        native.from_native([[embeds, {"reference_latents": [torch.zeros(1, 128, 2, 2)]}]])
    with pytest.raises(Flux2Error, match="batch, tokens, width"):
        native.from_native([[torch.zeros(512, 96), {}]])
    real = native.from_native([[torch.zeros(1, 512, 7680), {}]])
    assert real.encoder_name == "Qwen3-4B"


def test_block_patches_are_refused_by_name(fake_pack):
    refuse, Flux2Error = fake_pack.nodes.native_model.refuse_patches, fake_pack.flux2_core.Flux2Error
    refuse({"patches": {}, "patches_replace": {}})  # nothing to refuse
    with pytest.raises(Flux2Error, match="double_block replacement"):
        refuse({"patches_replace": {"dit": {("double_block", 0): object()}}})
    with pytest.raises(Flux2Error, match="attn1_patch"):
        refuse({"patches": {"attn1_patch": [object()]}})


@pytest.fixture(scope="module")
def fake_pack(tmp_path_factory):
    from comfy_stubs import FakeHost, load_pack, unload_pack

    host = FakeHost(tmp_path_factory.mktemp("models"))
    with host.installed():
        pack = load_pack()
        try:
            yield pack
        finally:
            unload_pack()


def test_a_regional_prompt_survives_the_round_trip_through_native_conditioning(fake_pack):
    types, core = fake_pack.nodes.types, fake_pack.flux2_core
    glob, region = torch.randn(1, 512, 96), torch.randn(1, 512, 96)
    regions = core.RegionalPrompt(glob, (core.Region(region, torch.ones(8, 8)),))
    ours = types.KleinConditioning(glob, "Qwen3-4B", 96, regions=regions)
    native_cond = ours.to_native()
    assert native_cond[0][1][types.REGIONAL_PROMPT] is regions
    back = fake_pack.nodes.native.from_native(native_cond)
    assert back.regions is regions and back.embeds is glob
    refs = core.ReferenceLatents.from_latents([torch.zeros(1, 128, 2, 2)])
    refs = refs.with_strength(core.ReferenceStrength(0.5))
    both = ours.to_native(refs)[0][1]  # regions and references travel together
    assert both[types.REGIONAL_PROMPT] is regions and len(both["reference_latents"]) == 1
    assert both[types.REFERENCE_STRENGTHS] == refs.strengths


@pytest.mark.parametrize("variant", ["distilled", "kv"])
def test_our_native_model_runs_regions_with_references_as_our_sampler_calls_the_dit(
    fake_pack, tmp_path, variant
):
    # the call native samplers make (native_model.NativeDiT) against the DiT called with the record our
    # sampler's denoiser builds: the joined prompts under the regional mask, the references at their strength
    core, native_model, types = fake_pack.flux2_core, fake_pack.nodes.native_model, fake_pack.nodes.types
    path = write_bfl_file(make_diffusers_dit(seed=3), tmp_path / "dit.safetensors")
    model = core.load_transformer(path, variant=variant)
    g = torch.Generator().manual_seed(1)
    glob, region = torch.randn(1, 9, 24, generator=g), torch.randn(1, 5, 24, generator=g)
    left = torch.zeros(48, 64)
    left[:, :32] = 1
    regions = core.RegionalPrompt(glob, (core.Region(region, left, 2.0),))
    latents = [torch.randn(1, 128, 2, 3, generator=g)]
    strengths = (core.ReferenceStrength(0.5),)
    x, sigma = torch.randn(2, 128, 3, 4, generator=g), torch.tensor([0.8, 0.8])
    dit = native_model.NativeDiT(types.KleinModel(model, None), fake_pack.nodes.kv_store.KV_STORE)
    options = {types.REGIONAL_PROMPT: regions, types.REFERENCE_STRENGTHS: strengths}
    with torch.inference_mode():
        got = dit._forward(x, sigma, glob.expand(2, -1, -1), ref_latents=latents, transformer_options={},
                           **options)  # fmt: skip
    context, mask = core.regional_plan(regions, (3, 4), torch.float32, "cpu")
    refs = core.ReferenceLatents.from_latents(latents)
    kv = model.transformer.encode_reference_kv(refs.tokens, refs.ids) if variant == "kv" else None
    bias = torch.full((refs.num_tokens,), math.log(0.5))
    want = core.latent_velocity(
        model, x, sigma, context.expand(2, -1, -1), latents, kv_cache=kv, ref_bias=bias, attn_mask=mask
    )
    torch.testing.assert_close(got, want, atol=0, rtol=0)
    plain = core.latent_velocity(model, x, sigma, glob.expand(2, -1, -1), latents, kv_cache=kv, ref_bias=bias)
    alone = core.latent_velocity(model, x, sigma, context.expand(2, -1, -1), attn_mask=mask)
    assert (got - plain).abs().mean() > 1e-3 and (got - alone).abs().mean() > 1e-3


def test_a_regional_conditioning_changed_by_native_nodes_is_not_replaced_by_its_regions(fake_pack):
    # native nodes copy an entry's options and change its text: ConditioningZeroOut's zeros (a negative made
    # from the regional prompt) run without the regions; any other text is refused, never overridden
    types, core = fake_pack.nodes.types, fake_pack.flux2_core
    glob = torch.randn(1, 512, 96)
    regions = core.RegionalPrompt(glob, (core.Region(torch.randn(1, 512, 96), torch.ones(8, 8)),))
    options = types.KleinConditioning(glob, "Qwen3-4B", 96, regions=regions).to_native()[0][1]
    assert types.carried_regions(glob, options) is regions
    assert types.carried_regions(torch.zeros_like(glob), dict(options)) is None
    back = fake_pack.nodes.native.from_native([[torch.zeros_like(glob), dict(options)]])
    assert back.regions is None and not back.embeds.any()
    with pytest.raises(core.Flux2Error, match="changed by a native node"):
        types.carried_regions(glob.clone() * 0.5, dict(options))
    with pytest.raises(core.Flux2Error, match="changed by a native node"):
        fake_pack.nodes.native.from_native([[glob + 1, dict(options)]])
    no_global = core.RegionalPrompt(glob.new_zeros(1, 0, 96), regions.regions)
    empty = types.KleinConditioning(no_global.global_embeds, "Qwen3-4B", 96, regions=no_global).to_native()
    assert types.carried_regions(empty[0][0], empty[0][1]) is no_global
    assert types.carried_regions(torch.zeros_like(empty[0][0]), empty[0][1]) is None
