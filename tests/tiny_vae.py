"""Tiny random FLUX.2 VAEs written in the real file layouts (test helper).

The source is a seeded random state dict in BFL naming (``ae.safetensors`` / ComfyUI ``flux2-vae``), with
the names and shapes of the product's module built on the meta device. The diffusers layout is made by
diffusers itself: its LDM->diffusers VAE converter renames the tensors, its ``AutoencoderKLFlux2`` loads them
strictly and ``save_pretrained`` writes the folder, so the loader's diffusers table meets an independent one.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from diffusers import AutoencoderKLFlux2
from diffusers.loaders.single_file_utils import convert_ldm_vae_checkpoint
from safetensors.torch import save_file

from flux2_core.vae.autoencoder import FLUX2_VAE, AutoEncoder, VAEConfig

# 4 levels like the real VAE (so diffusers' reversed up_blocks index is exercised), factor 16, 128 latent
# channels; every width a multiple of the 32 GroupNorm groups.
TINY_VAE = VAEConfig(
    ch=32, ch_mult=(1, 2, 2, 2), num_res_blocks=1, decoder_ch=32, decoder_ch_mult=(1, 2, 2, 2)
)
# A narrower decoder than its encoder, as in the official small decoder (there 96/192/384/384 vs 128/.../512).
TINY_SMALL_DECODER_VAE = replace(TINY_VAE, ch_mult=(1, 2, 4, 4), decoder_ch_mult=(1, 2, 3, 3))


def random_vae_state_dict(
    config: VAEConfig = TINY_VAE, seed: int = 0, bn: bool = True
) -> dict[str, torch.Tensor]:
    """Seeded random weights in BFL naming; GroupNorm affines and BN stats are non-trivial on purpose."""
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in AutoEncoder(config).state_dict().items()}
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for key, shape in shapes.items():
        if key.startswith("bn."):
            continue
        if len(shape) == 4:  # convs: unit-variance outputs for unit-variance inputs
            sd[key] = torch.randn(shape, generator=g) / (shape[1] * shape[2] * shape[3]) ** 0.5
        elif key.endswith(".weight"):  # GroupNorm scales near 1, so a swapped norm1/norm2 shows
            sd[key] = 1.0 + 0.2 * torch.randn(shape, generator=g)
        else:
            sd[key] = 0.1 * torch.randn(shape, generator=g)
    if bn:  # num_batches_tracked is left out: it is optional in files
        sd["bn.running_mean"] = 0.1 * torch.randn(config.latent_channels, generator=g)
        sd["bn.running_var"] = 0.5 + torch.rand(config.latent_channels, generator=g)
    return sd


def full_size_vae_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights with the real FLUX.2 VAE shapes (84 M parameters, about 340 MB in float32)."""
    return random_vae_state_dict(FLUX2_VAE, seed)


def comfy_layout(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """ComfyUI's renaming: the quant convs at top level (``quant_conv.``, ``post_quant_conv.``)."""
    renames = {"encoder.quant_conv.": "quant_conv.", "decoder.post_quant_conv.": "post_quant_conv."}
    out = {}
    for key, tensor in sd.items():
        for old, new in renames.items():
            key = new + key[len(old) :] if key.startswith(old) else key
        out[key] = tensor
    return out


def bare_decoder(sd: dict[str, torch.Tensor], bn: bool = True) -> dict[str, torch.Tensor]:
    """A decoder-only file like ``small_decoder.safetensors``: decoder keys without ``decoder.``."""
    out = {k[len("decoder.") :]: v for k, v in sd.items() if k.startswith("decoder.")}
    if bn:
        out.update({k: v for k, v in sd.items() if k.startswith("bn.")})
    return out


def write_bfl_file(sd: dict[str, torch.Tensor], path: Path, prefix: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({prefix + k: v.contiguous() for k, v in sd.items()}, str(path))
    return path


def make_diffusers_vae(sd: dict[str, torch.Tensor], config: VAEConfig = TINY_VAE) -> AutoencoderKLFlux2:
    """diffusers' own model holding the same weights, renamed by diffusers' own LDM VAE converter."""
    levels = len(config.ch_mult)
    model = AutoencoderKLFlux2(
        in_channels=config.in_channels,
        out_channels=config.out_ch,
        down_block_types=("DownEncoderBlock2D",) * levels,
        up_block_types=("UpDecoderBlock2D",) * levels,
        block_out_channels=tuple(config.ch * m for m in config.ch_mult),
        decoder_block_out_channels=tuple(config.decoder_ch * m for m in config.decoder_ch_mult),
        layers_per_block=config.num_res_blocks,
        latent_channels=config.z_channels,
        norm_num_groups=config.norm_groups,
        batch_norm_eps=1e-4,
        patch_size=(2, 2),
    )
    converted = convert_ldm_vae_checkpoint(comfy_layout(sd), model.config)  # wants top-level quant convs
    converted.update({k: v for k, v in sd.items() if k.startswith("bn.")})
    converted["bn.num_batches_tracked"] = torch.tensor(0)
    model.load_state_dict(converted, strict=True)
    return model.eval()


def write_diffusers_folder(sd: dict[str, torch.Tensor], root: Path, config: VAEConfig = TINY_VAE) -> Path:
    """A diffusers repository root: ``model_index.json`` and ``vae/`` (config.json + safetensors weights)."""
    make_diffusers_vae(sd, config).save_pretrained(root / "vae", safe_serialization=True)
    index = {"_class_name": "Flux2KleinPipeline", "vae": ["diffusers", "AutoencoderKLFlux2"]}
    (root / "model_index.json").write_text(json.dumps(index), encoding="utf-8")
    return root
