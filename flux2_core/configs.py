"""Architecture records and sampling variants of the FLUX.2 family.

The sizes of a model are always read from its checkpoint (see ``loading.transformer_config``); the named
presets below are the published shapes, used to put a name on what a file holds and as checks in the tests.
Presets are frozen: derive new ones with ``dataclasses.replace``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import Flux2Error


@dataclass(frozen=True)
class Flux2Config:
    """Shape of a FLUX.2 DiT (BFL ``Flux2Params``)."""

    hidden_size: int  # num_heads * head_dim
    num_heads: int
    depth: int  # double-stream blocks
    depth_single_blocks: int
    context_in_dim: int  # 3 * text-encoder width: three hidden states concatenated per token
    in_channels: int = 128  # 32 VAE channels * 2x2 patch
    mlp_ratio: float = 3.0
    axes_dim: tuple[int, ...] = (32, 32, 32, 32)  # RoPE chunk per position axis (t, h, w, l)
    theta: int = 2000
    guidance_embed: bool = False  # dev only: embedded (distilled) guidance

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def mlp_hidden_dim(self) -> int:
        return int(self.hidden_size * self.mlp_ratio)


KLEIN_4B = Flux2Config(hidden_size=3072, num_heads=24, depth=5, depth_single_blocks=20, context_in_dim=7680)
KLEIN_9B = Flux2Config(hidden_size=4096, num_heads=32, depth=8, depth_single_blocks=24, context_in_dim=12288)
DEV_32B = Flux2Config(
    hidden_size=6144, num_heads=48, depth=8, depth_single_blocks=48, context_in_dim=15360, guidance_embed=True
)

TRANSFORMER_PRESETS = {"klein 4B": KLEIN_4B, "klein 9B": KLEIN_9B, "FLUX.2 dev 32B": DEV_32B}

# Text-encoder width (3 hidden states are concatenated) -> the encoder that gives it.
TEXT_ENCODER_FOR_CONTEXT = {7680: "Qwen3-4B", 12288: "Qwen3-8B", 15360: "Mistral-Small-3.2-24B"}


def preset_name(config: Flux2Config) -> str | None:
    """The published model this shape belongs to, or None for any other (e.g. a test model)."""
    for name, preset in TRANSFORMER_PRESETS.items():
        if preset == config:
            return name
    return None


def describe(config: Flux2Config) -> str:
    name = preset_name(config)
    if name:
        return name
    return (
        f"FLUX.2 DiT ({config.hidden_size} wide, {config.depth}+{config.depth_single_blocks} blocks, "
        f"{config.context_in_dim}-wide text)"
    )


@dataclass(frozen=True)
class Variant:
    """How a checkpoint is meant to be sampled. Distilled, base and KV weights have identical shapes."""

    name: str  # "distilled", "base" or "kv"
    default_steps: int
    default_guidance: float
    uses_cfg: bool  # true CFG with a negative prompt (two passes per step)
    kv_cache: bool  # reference K/V are computed once and reused (9B-KV checkpoint)


VARIANTS = {
    "distilled": Variant("distilled", default_steps=4, default_guidance=1.0, uses_cfg=False, kv_cache=False),
    "base": Variant("base", default_steps=50, default_guidance=4.0, uses_cfg=True, kv_cache=False),
    "kv": Variant("kv", default_steps=4, default_guidance=1.0, uses_cfg=False, kv_cache=True),
}


def get_variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise Flux2Error(
            f"unknown variant {name!r}: choose one of {', '.join(VARIANTS)} (or 'auto')"
        ) from None
