"""RefControl LoRAs (structure for klein base from a control map): the layout assumed for the published
files, written tiny here, loads with every key applied, and steers a two-reference edit.

The published files' headers could not be read here, so the layout is assumed (and said so in
docs/steering.md): the one klein LoRAs are most often shared in (ai-toolkit's, which ComfyUI's own loader
reads), BFL module names under ``diffusion_model.`` with ``lora_A`` / ``lora_B`` (and an ``alpha``) on every
linear layer of every double and single block. Files in the other known layouts load too
(tests/lora/test_lora.py), and the report names any key that does not match.
"""

from __future__ import annotations

import torch
from safetensors.torch import save_file
from tiny_dit import bfl_state_dict, make_diffusers_dit, write_bfl_file

from flux2_core import ReferenceLatents, SampleRequest, SampleSettings, load_transformer, sample
from flux2_core.lora import prepare_lora, read_lora

BLOCK_LAYERS = {
    "double_blocks": ("img_attn.qkv", "img_attn.proj", "img_mlp.0", "img_mlp.2",
                      "txt_attn.qkv", "txt_attn.proj", "txt_mlp.0", "txt_mlp.2"),
    "single_blocks": ("linear1", "linear2"),
}  # fmt: skip


def _refcontrol_file(sd: dict, path, rank=4) -> int:
    g = torch.Generator().manual_seed(7)
    tensors, count = {}, 0
    for kind, layers in BLOCK_LAYERS.items():
        blocks = {int(k.split(".")[1]) for k in sd if k.startswith(kind + ".")}
        for i in sorted(blocks):
            for layer in layers:
                name = f"{kind}.{i}.{layer}"
                out, inp = sd[name + ".weight"].shape
                tensors[f"diffusion_model.{name}.lora_A.weight"] = torch.randn(rank, inp, generator=g) * 0.2
                tensors[f"diffusion_model.{name}.lora_B.weight"] = torch.randn(out, rank, generator=g) * 0.2
                tensors[f"diffusion_model.{name}.alpha"] = torch.tensor(float(rank))
                count += 1
    save_file(tensors, str(path))
    return count


def test_a_refcontrol_lora_applies_every_key_and_steers_a_two_reference_edit(tmp_path):
    dit = make_diffusers_dit(seed=5)
    sd = bfl_state_dict(dit)
    model = load_transformer(
        write_bfl_file(dit, tmp_path / "flux-2-klein-base-4b.safetensors"), variant="base"
    )
    count = _refcontrol_file(sd, tmp_path / "refcontrol.safetensors")
    lora = prepare_lora(read_lora(tmp_path / "refcontrol.safetensors"), model.transformer, strength=0.9)
    report = lora.report
    assert report.total == report.matched == count and not report.unmatched and not report.incomplete
    assert not report.ignored_tensors and report.unmatched_count == 0
    g = torch.Generator().manual_seed(3)
    control, subject = torch.randn(1, 128, 4, 4, generator=g), torch.randn(1, 128, 4, 4, generator=g)
    refs = ReferenceLatents.from_latents([control, subject])  # the control map first, the subject second
    settings = SampleSettings(64, 64, 2, 4.0, 1)
    text, empty = torch.randn(1, 8, 24, generator=g), torch.zeros(1, 8, 24)
    plain = sample(SampleRequest(model, text, settings, negative=empty, references=refs))
    steered = sample(SampleRequest(model.with_lora(lora), text, settings, negative=empty, references=refs))
    assert (steered - plain).abs().mean() > 1e-3
