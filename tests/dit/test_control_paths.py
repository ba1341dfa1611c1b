"""The Fun ControlNet on every path the DiT has: quantised control files, quantised and GGUF dev bases,
streaming (of the DiT and of the control net), the block split, and the memory plan.

Each path is held to the plain path on the same weights: a quantised file to a float32 file of the values it
holds (what a correct loader reconstructs, computed by the quantisers in tests/fixtures/quant_files.py),
streaming and the split to the resident run bit for bit.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from quant_files import quantised_layers, write_gguf, write_quantised
from safetensors.torch import save_file
from tiny_control import control_state_dict
from tiny_dit import bfl_state_dict, make_diffusers_dit

from flux2_core import (
    SampleRequest,
    SampleSettings,
    enable_streaming,
    estimate_memory,
    load_transformer,
    sample,
)
from flux2_core.devices.placement import place_blocks, remove_placement
from flux2_core.devices.streaming import disable_streaming, streamer_of
from flux2_core.dit.control import CONTROL_CHANNELS, hint_bytes, load_controlnet
from flux2_core.steering.control_image import AppliedControl

HIDDEN, HEAD, MLP, BLOCKS = 32, 16, 96, 2
SETTINGS = SampleSettings(96, 64, 3, 4.0, 5, 1)  # 6 x 4 latent tokens


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """A tiny dev DiT as float32, fp8 and GGUF Q8_0 files, each with a float32 twin of the values it holds;
    a control file in bf16 and in fp8 (its block linears), with the fp8 one's float32 twin."""
    tmp = tmp_path_factory.mktemp("control_paths")
    dit = make_diffusers_dit(
        num_layers=4, num_single_layers=2, attention_head_dim=HEAD, num_attention_heads=2,
        joint_attention_dim=24, axes_dims_rope=(4, 4, 4, 4), guidance_embeds=True, seed=3,
    )  # fmt: skip
    sd = bfl_state_dict(dit)
    out = {"float": tmp / "flux2-dev.safetensors"}
    save_file({k: v.contiguous() for k, v in sd.items()}, str(out["float"]))
    held = write_quantised(sd, tmp / "flux2-dev-fp8.safetensors", "float8_e4m3fn", high=torch.float32)
    out["fp8"], out["fp8 twin"] = tmp / "flux2-dev-fp8.safetensors", tmp / "fp8-twin.safetensors"
    save_file({**sd, **held}, str(out["fp8 twin"]))
    gguf = write_gguf(
        sd, tmp / "flux2-dev-Q8_0.gguf", "flux", {k + ".weight": "Q8_0" for k in quantised_layers(sd)}
    )
    out["gguf"], out["gguf twin"] = tmp / "flux2-dev-Q8_0.gguf", tmp / "gguf-twin.safetensors"
    save_file(gguf, str(out["gguf twin"]))
    control = control_state_dict(HIDDEN, HEAD, MLP, BLOCKS, seed=4)
    out["control"] = tmp / "FLUX.2-dev-Fun-Controlnet-Union-2602.safetensors"
    save_file({k: v.contiguous() for k, v in control.items()}, str(out["control"]))
    linears = [k[: -len(".weight")] for k, v in control.items() if k.startswith("control_transformer_blocks")
               and k.endswith(".weight") and v.ndim == 2]  # fmt: skip
    out["control fp8"] = tmp / "FLUX.2-dev-Fun-Controlnet-Union-2602-fp8.safetensors"
    held = write_quantised(control, out["control fp8"], "float8_e4m3fn", layers=linears, high=torch.float32)
    out["control fp8 twin"] = tmp / "control-fp8-twin.safetensors"
    save_file({**control, **held}, str(out["control fp8 twin"]))
    return out


def _context(seed: int = 0) -> torch.Tensor:
    return torch.randn(1, 24, CONTROL_CHANNELS, generator=torch.Generator().manual_seed(seed))


def _run(model, net, strength: float = 0.8, **kw) -> torch.Tensor:
    positive = torch.randn(1, 6, 24, generator=torch.Generator().manual_seed(1))
    control = AppliedControl(net, _context(), strength) if net is not None else None
    return sample(SampleRequest(model, positive, SETTINGS, control=control, **kw))


def test_an_fp8_control_file_stays_fp8_and_steers_as_the_values_it_holds(files):
    """The release layout names q, k and v apart, each with its own scale: those three are dequantised and
    joined into our fused qkv at load; every other block linear keeps its fp8 bytes."""
    net = load_controlnet(files["control fp8"])
    block = net.double_blocks[0]
    for layer in (block.img_attn.proj, block.txt_attn.proj, block.img_mlp[0], block.txt_mlp[2]):
        assert layer.weight.dtype == torch.float8_e4m3fn  # kept in its format, not widened at load
    assert block.img_attn.qkv.weight.dtype == torch.float32
    twin = load_controlnet(files["control fp8 twin"])
    model = load_transformer(files["float"], variant="dev")
    plain, ours, theirs = _run(model, None), _run(model, net), _run(model, twin)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert (ours - plain).abs().mean() > 1e-2  # and it steers


@pytest.mark.parametrize("base", ["fp8", "gguf"])
def test_a_quantised_or_gguf_dev_base_takes_the_control_net(files, base):
    """Under control, the fp8 and GGUF Q8_0 bases sample what a float32 base of the same values samples."""
    net = load_controlnet(files["control"])
    model, twin = (load_transformer(files[k], variant="dev") for k in (base, f"{base} twin"))
    assert any(p.dtype not in (torch.float32, torch.bfloat16) for p in model.transformer.parameters())
    ours, theirs = _run(model, net), _run(twin, net)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert (ours - _run(model, None)).abs().mean() > 1e-2


def test_streamed_dit_and_control_net_sample_the_resident_image(files):
    """Both modules streamed block by block (nothing resident but their small parts) give the resident run
    bit for bit; the memory plan counts the control net's copies in flight and its hints."""
    model = load_transformer(files["float"], variant="dev")
    net = load_controlnet(files["control"])
    resident = _run(model, net)
    plain_plan = estimate_memory(model, SETTINGS, None)
    controlled_plan = estimate_memory(model, SETTINGS, None, control=net)
    assert controlled_plan - plain_plan == hint_bytes(net.config, 1, 24, torch.float32)
    assert hint_bytes(net.config, 1, 24, torch.float32) == 24 * (BLOCKS * HIDDEN + CONTROL_CHANNELS) * 4
    enable_streaming(model.transformer, "cpu", resident_bytes=0)
    streamer = enable_streaming(net, "cpu", resident_bytes=0)
    try:
        assert len(streamer.streamed_blocks) == BLOCKS and streamer_of(net) is streamer
        assert (
            estimate_memory(model, SETTINGS, None, control=net) - estimate_memory(model, SETTINGS, None)
            == hint_bytes(net.config, 1, 24, torch.float32) + streamer.working_bytes
        )
        assert torch.equal(_run(model, net), resident)
    finally:
        disable_streaming(net)
        disable_streaming(model.transformer)
    assert torch.equal(_run(model, net), resident)  # and back, whole


def test_the_block_split_under_control_samples_the_unsplit_image(files):
    model = load_transformer(files["float"], variant="dev")
    net = load_controlnet(files["control"])
    whole = _run(model, net)
    placement = place_blocks(model.transformer, ["cpu", "cpu"])
    try:
        assert sorted(set(placement.block_device)) == [0, 1]
        assert torch.equal(_run(model, net), whole)
    finally:
        remove_placement(model.transformer)


def test_a_batch_shares_the_control_context(files):
    """One [1, N, 260] context steers every item of a batch: item 0 of a batch of 2 is the run alone (the
    noise of item 0 is the seed's first draw)."""
    model = load_transformer(files["float"], variant="dev")
    net = load_controlnet(files["control"])
    positive = torch.randn(1, 6, 24, generator=torch.Generator().manual_seed(1))
    control = AppliedControl(net, _context(), 0.8)
    batch = sample(SampleRequest(model, positive, replace(SETTINGS, batch_size=2), control=control))
    alone = sample(SampleRequest(model, positive, SETTINGS, control=control))
    torch.testing.assert_close(batch[:1], alone, rtol=1e-5, atol=1e-5)


def test_a_lora_on_the_base_under_control_is_the_merged_base_under_control(files, tmp_path):
    """A LoRA applied while sampling (never merged) steers with the control net as a base whose weights
    hold the LoRA's delta does; the control net's own weights are not the LoRA's."""
    from safetensors.torch import load_file

    from flux2_core.lora import prepare_lora, read_lora

    sd = load_file(str(files["float"]))
    g = torch.Generator().manual_seed(9)
    tensors, merged = {}, dict(sd)
    for layer in ("double_blocks.0.img_attn.qkv", "double_blocks.1.img_mlp.0", "single_blocks.0.linear1"):
        out, inp = sd[layer + ".weight"].shape
        down, up = torch.randn(2, inp, generator=g) * 0.3, torch.randn(out, 2, generator=g) * 0.3
        tensors[f"diffusion_model.{layer}.lora_A.weight"] = down
        tensors[f"diffusion_model.{layer}.lora_B.weight"] = up
        merged[layer + ".weight"] = sd[layer + ".weight"] + 0.8 * (up @ down)
    save_file(tensors, str(tmp_path / "lora.safetensors"))
    save_file(merged, str(tmp_path / "merged.safetensors"))
    model = load_transformer(files["float"], variant="dev")
    lora = prepare_lora(read_lora(tmp_path / "lora.safetensors"), model.transformer, strength=0.8)
    net = load_controlnet(files["control"])
    ours = _run(model.with_lora(lora), net)
    theirs = _run(load_transformer(tmp_path / "merged.safetensors", variant="dev"), net)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert (ours - _run(model, net)).abs().mean() > 1e-3  # the LoRA changes the controlled run
