"""Shapes and constants of FLUX.1 Fill [dev]: the DiT record, the published preset, the sampling defaults.

Sizes of a loaded model always come from its tensors (``dit_files.fill_config``); the preset puts a name on
what a file holds and checks the tests' parameter counts.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..configs import FLUX1, preset_name
from ..vae.latent_format import ScaleShift

# The FLUX.1 VAE's latent normalisation (BFL ``AutoEncoderParams``, diffusers ``scaling/shift_factor``).
LATENT_SCALE, LATENT_SHIFT = 0.3611, 0.1159
LATENT_FORMAT = ScaleShift(LATENT_SCALE, LATENT_SHIFT)

NOISE_CHANNELS = 16  # VAE latent channels; a token packs 2x2 of them: 64
MASK_CELL = 8  # pixels per latent cell: each token carries its 2x2 cells' 8x8 mask pixels (256 channels)
FILL_CHANNELS = 64 + 64 + 256  # noisy latent | masked-image latent | mask, per token

DEFAULT_STEPS = 50  # BFL's Fill CLI and demo, diffusers' FluxFillPipeline
DEFAULT_GUIDANCE = 30.0  # the embedded guidance Fill was distilled for (ComfyUI's 3.5 fallback blurs)
T5_TOKENS = FLUX1.max_text_tokens  # 512: BFL's default and diffusers' (BFL's Fill CLI uses 128)
CLIP_TOKENS = 77

# Schedule shift, linear in the image-token count (BFL ``get_lin_function``, diffusers ``calculate_shift``).
BASE_SEQ_LEN, MAX_SEQ_LEN, BASE_SHIFT, MAX_SHIFT = 256, 4096, 0.5, 1.15


@dataclass(frozen=True)
class Flux1Config:
    """Shape of a FLUX.1 DiT (BFL ``FluxParams``)."""

    hidden_size: int  # num_heads * 128
    num_heads: int
    depth: int  # double-stream blocks
    depth_single_blocks: int
    in_channels: int = FILL_CHANNELS
    out_channels: int = 64
    context_in_dim: int = 4096  # T5-XXL width
    vec_in_dim: int = 768  # CLIP-L pooled width
    mlp_ratio: float = 4.0
    axes_dim: tuple[int, ...] = (16, 56, 56)
    theta: int = 10000
    guidance_embed: bool = True

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_hidden_dim(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)

    @property
    def family(self):
        return FLUX1


FILL_DEV = Flux1Config(hidden_size=3072, num_heads=24, depth=19, depth_single_blocks=38)
FLUX1_PRESETS = {"FLUX.1 Fill [dev]": FILL_DEV}


def describe(config: Flux1Config) -> str:
    return preset_name(FLUX1_PRESETS, config) or (
        f"FLUX.1 Fill DiT ({config.hidden_size} wide, {config.depth}+{config.depth_single_blocks} blocks, "
        f"{config.context_in_dim}-wide text, {config.vec_in_dim}-wide pooled)"
    )


def schedule_shift(image_tokens: int) -> float:
    """mu for ``image_tokens`` tokens: 0.5 at 256, 1.15 at 4096, extrapolated beyond (BFL, diffusers)."""
    slope = (MAX_SHIFT - BASE_SHIFT) / (MAX_SEQ_LEN - BASE_SEQ_LEN)
    return BASE_SHIFT + slope * (image_tokens - BASE_SEQ_LEN)
