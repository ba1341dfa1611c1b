"""FLUX.2 Text Encode and Reference Encode."""

from __future__ import annotations

import pytest
import torch
from klein_nodes import TEXT_WIDTH, image, run_sampler


def test_text_encode_gives_cpu_conditioning_and_frees_the_encoder(nodes, loaded, host):
    (cond,) = nodes["Flux2KleinTextEncode"].execute(loaded["encoder"], "a cat")
    assert cond.embeds.shape == (1, 512, TEXT_WIDTH) and cond.embeds.dtype == torch.float32
    assert cond.embeds.device.type == "cpu" and cond.width == TEXT_WIDTH and cond.encoder_name
    patcher = loaded["encoder"].patcher
    assert host.loads == [(patcher, True)] and host.unloads == [patcher]
    native = cond.to_native()
    assert native[0][0] is cond.embeds and native[0][1] == {"pooled_output": None}


def test_reference_batch_and_chain_keep_order(nodes, loaded):
    encode = nodes["Flux2KleinReferenceEncode"].execute
    (first,) = encode(loaded["vae"], image(64, 128, batch=2))
    assert first.grid_sizes == [(4, 8), (4, 8)]
    (chained,) = encode(loaded["vae"], image(80, 64), references=first)
    assert chained.grid_sizes == [(4, 8), (4, 8), (5, 4)]
    torch.testing.assert_close(chained.tokens[:, : first.num_tokens], first.tokens)


def test_reference_pixel_cap(nodes, loaded):
    encode = nodes["Flux2KleinReferenceEncode"].execute
    (small,) = encode(loaded["vae"], image(200, 120), max_megapixels=0.0625)  # 0.0625 MP = 256 x 256 px
    assert small.pixel_size(0) == (112, 192)  # under the cap: only centre-cropped to multiples of 16
    (large,) = encode(loaded["vae"], image(512, 256), max_megapixels=0.0625)
    assert large.pixel_size(0) == (176, 352)  # 256 x 512 scaled by sqrt(1/2) to 181 x 362, cropped to /16


def test_reference_strength_applies_to_the_references_the_node_adds(nodes, loaded):
    encode = nodes["Flux2KleinReferenceEncode"]
    (first,) = encode.execute(loaded["vae"], image(64, 64, batch=2))
    (chained,) = encode.execute(
        loaded["vae"], image(80, 64), references=first, strength=0.5, start=0.0, end=0.5
    )
    assert first.plain and [s.strength for s in chained.strengths] == [1.0, 1.0, 0.5]
    assert chained.strengths[2].end == 0.5
    assert encode.validate_inputs(start=0.75, end=0.25).startswith("start 0.75 is not before end 0.25")
    assert encode.validate_inputs(start=0.5, end=0.5).endswith("would count at no step; set start < end")
    assert encode.validate_inputs(start=0.0, end=1.0) is True


def test_references_at_strength_zero_sample_the_text_to_image_result(nodes, loaded):
    (off,) = nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], image(64, 64), strength=0.0)
    (on,) = nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], image(64, 64))
    t2i = run_sampler(nodes, loaded)
    assert torch.equal(run_sampler(nodes, loaded, references=off), t2i)
    assert not torch.equal(run_sampler(nodes, loaded, references=on), t2i)


def test_a_bad_reference_strength_is_refused_by_name(nodes, loaded, Flux2Error):
    with pytest.raises(Flux2Error, match="reference strength -1"):
        nodes["Flux2KleinReferenceEncode"].execute(loaded["vae"], image(64, 64), strength=-1.0)


def test_regional_prompts_chain_and_sample(nodes, loaded, Flux2Error):
    regional, encode = nodes["Flux2KleinRegionalPrompt"], nodes["Flux2KleinTextEncode"]
    (cat,) = encode.execute(loaded["encoder"], "a cat")
    (dog,) = encode.execute(loaded["encoder"], "a dog")
    left = torch.zeros(1, 64, 64)
    left[:, :, :32] = 1
    (one,) = regional.execute(cat, left, conditioning=loaded["positive"])
    (two,) = regional.execute(dog, 1 - left, conditioning=one, strength=0.5)
    assert two.regions.global_embeds is loaded["positive"].embeds and len(two.regions.regions) == 2
    assert two.regions.regions[1].strength == 0.5
    # one region over the whole picture and no global prompt: the plain run of its prompt
    (whole,) = regional.execute(cat, torch.ones(1, 64, 64))
    assert whole.embeds.shape[1] == 0
    assert torch.equal(run_sampler(nodes, loaded, positive=whole), run_sampler(nodes, loaded, positive=cat))
    assert not torch.equal(run_sampler(nodes, loaded, positive=two), run_sampler(nodes, loaded))
    with pytest.raises(Flux2Error, match="not a regional conditioning"):
        regional.execute(two, left)
    with pytest.raises(Flux2Error, match="the negative prompt cannot be regional"):
        run_sampler(nodes, loaded, negative=two, guidance=4.0)


def test_regional_prompts_and_references_wired_into_one_sampler(nodes, loaded):
    regional, encode = nodes["Flux2KleinRegionalPrompt"], nodes["Flux2KleinTextEncode"]
    references = nodes["Flux2KleinReferenceEncode"].execute
    (cat,) = encode.execute(loaded["encoder"], "a cat")
    left = torch.zeros(1, 64, 64)
    left[:, :, :32] = 1
    (half,) = regional.execute(cat, left, conditioning=loaded["positive"])
    (refs,) = references(loaded["vae"], image(64, 64, seed=3))
    (off,) = references(loaded["vae"], image(64, 64, seed=3), strength=0.0)
    edit = run_sampler(nodes, loaded, references=refs)
    regional_edit = run_sampler(nodes, loaded, positive=half, references=refs)
    assert torch.isfinite(regional_edit).all() and not torch.equal(regional_edit, edit)
    # the exact cases: every reference at 0 is the regional run; an empty region is the plain edit
    assert torch.equal(
        run_sampler(nodes, loaded, positive=half, references=off), run_sampler(nodes, loaded, positive=half)
    )
    (empty,) = regional.execute(cat, torch.zeros(1, 64, 64), conditioning=loaded["positive"])
    assert torch.equal(run_sampler(nodes, loaded, positive=empty, references=refs), edit)
    # base CFG (the negative pass plain, with the references, as in an edit) and the 9B-KV model
    (base,) = nodes["Flux2KleinModelLoader"].execute("klein_tiny_base.safetensors", "auto")
    (kv,) = nodes["Flux2KleinModelLoader"].execute("klein_tiny.safetensors", "kv")
    for model, extra in ((base, dict(negative=loaded["negative"], guidance=3.0)), (kv, {})):
        plain = run_sampler(nodes, loaded, model=model, references=refs, **extra)
        got = run_sampler(nodes, loaded, model=model, positive=half, references=refs, **extra)
        assert torch.isfinite(got).all() and not torch.equal(got, plain)
        assert torch.equal(
            run_sampler(nodes, loaded, model=model, positive=empty, references=refs, **extra), plain
        )
