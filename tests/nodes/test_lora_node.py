"""FLUX.2 [klein] LoRA Loader, and GGUF files through the model loader."""

from __future__ import annotations

import pytest
import torch
from klein_nodes import run_sampler


def test_lora_loader_applies_on_top_and_leaves_the_base_model_alone(nodes, loaded):
    plain = run_sampler(nodes, loaded)
    out = nodes["Flux2KleinLoraLoader"].execute(loaded["model"], "tiny_lora.safetensors", 0.8)
    model, report, text_encoder = out.args
    assert out.ui["text"] == [report] and text_encoder is None
    # _write_lora's file: ai-toolkit names (diffusion_model. + lora_A/lora_B) on 2 layers of the tiny DiT
    # (hidden 32, 2 double + 2 single blocks, txt_in 96 wide), no .alpha (scale 1, on both: "(2)"), plus 1
    # kohya text-encoder module, not applied without a text encoder
    assert report.splitlines() == [
        "LoRA tiny_lora.safetensors: BFL / ai-toolkit (diffusion_model.), LoRA, for FLUX.2 DiT (32 wide, "
        "2+2 blocks, 96-wide text)",
        "  diffusion model: 2 of the file's 3 modules applied here (2 layers); scale 1 (no alpha) (2)",
        "  text encoder: 1 text encoder keys not applied (no text encoder connected)",
    ]
    with_lora = run_sampler(nodes, {**loaded, "model": model})
    assert (with_lora - plain).abs().max() > 1e-3
    assert torch.equal(run_sampler(nodes, loaded), plain)  # the input model is unchanged
    assert model.core.transformer is loaded["model"].core.transformer  # one copy of the weights
    chained = nodes["Flux2KleinLoraLoader"].execute(model, "tiny_lora.safetensors", -0.8).args[0]
    torch.testing.assert_close(run_sampler(nodes, {**loaded, "model": chained}), plain)


def test_lora_loader_text_encoder_part_and_block_strengths(nodes, loaded, Flux2Error):
    loader = nodes["Flux2KleinLoraLoader"]
    _, _, encoder = loader.execute(loaded["model"], "tiny_lora.safetensors", 1.0, "", loaded["encoder"]).args
    (changed,) = nodes["Flux2KleinTextEncode"].execute(encoder, "a red apple on a table")
    (again,) = nodes["Flux2KleinTextEncode"].execute(loaded["encoder"], "a red apple on a table")
    assert not torch.equal(changed.embeds, loaded["positive"].embeds)
    assert torch.equal(again.embeds, loaded["positive"].embeds)
    off = loader.execute(loaded["model"], "tiny_lora.safetensors", 1.0, "double=0, single=0").args[0]
    assert torch.equal(run_sampler(nodes, {**loaded, "model": off}), run_sampler(nodes, loaded))
    message = loader.validate_inputs(block_strengths="double=lots")
    assert isinstance(message, str) and "double=lots" in message
    with pytest.raises(Flux2Error, match="out of range"):
        loader.execute(loaded["model"], "tiny_lora.safetensors", 11.0)


def test_gguf_files_are_listed_and_load(nodes, loaded):
    choices = nodes["Flux2KleinModelLoader"].INPUT_TYPES()["required"]["model_name"][1]["options"]
    assert "klein_tiny-Q8_0.gguf" in choices and "klein_tiny.safetensors" in choices
    (model,) = nodes["Flux2KleinModelLoader"].execute("klein_tiny-Q8_0.gguf", "distilled")
    assert model.core.transformer.double_blocks[0].img_attn.qkv.weight.dtype == torch.uint8
    out = run_sampler(nodes, {**loaded, "model": model})
    plain = run_sampler(nodes, loaded)
    assert ((out - plain).norm() / plain.norm()).item() < 0.1
