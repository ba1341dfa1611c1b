"""The 16-channel FLUX.1 VAE (``ae.safetensors``): FLUX.2's encoder and decoder blocks without the quant
convs, and ComfyUI's FLUX.1 ``LATENT`` convention.

encode: pixels [B, 3, H, W] in [-1, 1] -> posterior mean [B, 16, H/8, W/8], raw (neither scaled nor
shifted: what native ``VAEEncode`` gives with ``ae.safetensors``, so native ``VAEDecode`` decodes ours and
ours decodes native ones). The model side applies ``config.LATENT_FORMAT``. BFL and diffusers names load.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..configs import preset_name
from ..errors import Flux2Error
from ..vae.autoencoder import AutoEncoder, VAEConfig, blocks_config, vae_rename
from ..vae.latent_format import RawMean
from ..weights.checkpoint import Checkpoint
from ..weights.keymaps import VAE, VAE_PREFIXES
from ..weights.loading import load_component
from ..weights.plan import ComponentSpec
from .config import NOISE_CHANNELS

FLUX1_VAE = VAEConfig(z_channels=NOISE_CHANNELS, patch=1, quant_conv=False)
FILE_HINT = "ae.safetensors (the FLUX.1 VAE, 16 latent channels)"


class Flux1AutoEncoder(AutoEncoder):
    """Pixels <-> raw FLUX.1 latents [B, 16, H/8, W/8]."""

    family = "FLUX.1"
    file_hint = "ae.safetensors"

    def __init__(self, config: VAEConfig):
        super().__init__(config)
        self.latent_format = RawMean()

    def _latent_statistics(self, config: VAEConfig) -> None:
        return None  # FLUX.1 normalises with two constants, applied by the model (config.LATENT_FORMAT)


def describe_flux1_vae(config: VAEConfig) -> str:
    return preset_name({"FLUX.1 VAE": FLUX1_VAE}, config) or (
        f"FLUX.1-style VAE (decoder widths {list(config.decoder_widths)}, z {config.z_channels})"
    )


def load_flux1_vae(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> Flux1AutoEncoder:
    """Load ``ae.safetensors`` (BFL / ComfyUI names) or a diffusers ``vae/`` folder or file."""
    return load_component(FLUX1_VAE_SPEC, path, dtype, device).module


def flux1_vae_config(shapes: dict[str, tuple[int, ...]], name: str) -> VAEConfig:
    """Every dimension from the shapes, after checking the file is a whole 16-channel VAE."""
    if "decoder.conv_in.weight" not in shapes:
        raise Flux2Error(f"{name} does not look like a VAE (no decoder.conv_in weight): choose {FILE_HINT}")
    z = shapes["decoder.conv_in.weight"][1]
    if "bn.running_mean" in shapes or z != NOISE_CHANNELS:
        what = "the FLUX.2 VAE (32 latent channels)" if z == 32 else f"a VAE with {z} latent channels"
        raise Flux2Error(f"{name} is {what}; FLUX.1 Fill [dev] needs {FILE_HINT}")
    if "encoder.conv_in.weight" not in shapes:
        raise Flux2Error(
            f"{name} holds only a VAE decoder; FLUX.1 Fill encodes the image, so it needs {FILE_HINT}"
        )
    return blocks_config(shapes, patch=1)


def _identify(names: dict[str, str], checkpoint: Checkpoint) -> None:
    if any(
        k.startswith(("double_blocks.", "single_blocks.", "transformer_blocks.", "img_in.")) for k in names
    ):
        raise Flux2Error(
            f"{checkpoint.name} is a diffusion model, not a VAE: load it as the model and choose {FILE_HINT}"
        )
    if any(k.startswith(("shared.", "text_model.", "encoder.block.", "embed_tokens.")) for k in names):
        raise Flux2Error(
            f"{checkpoint.name} is a text encoder, not a VAE: load it as one and choose {FILE_HINT} here"
        )


FLUX1_VAE_SPEC = ComponentSpec(
    what="FLUX.1 VAE",
    component="vae",
    keymap=VAE,
    config=lambda shapes, checkpoint: flux1_vae_config(shapes, checkpoint.name),
    build=Flux1AutoEncoder,
    describe=describe_flux1_vae,
    prefixes=(VAE_PREFIXES,),
    identify=_identify,
    rename=vae_rename,
)
