"""Architecture records, family constants and sampling variants of the FLUX.2 family.

The sizes of a model are always read from its checkpoint (``dit.files.transformer_config``,
``flux1.dit_files.fill_config``); the named presets below are the published shapes, used to put a name on
what a file holds and as checks in the tests. Presets are frozen: derive new ones with
``dataclasses.replace``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeVar

from .errors import Flux2Error


@dataclass(frozen=True)
class Family:
    """Constants a whole model family shares: latent layout, image sizes, text length, reference ids."""

    name: str
    latent_channels: int  # channels of the normalised, patchified latent the DiT and ComfyUI's LATENT hold
    size_multiple: int  # pixels per latent cell (VAE downscale x patch): image sides are multiples of it
    min_size: int  # smallest image side accepted
    max_text_tokens: int  # every prompt is padded or cut to this many tokens
    ref_time_offset: int  # reference k sits at t = ref_time_offset * (k + 1) on the time axis of RoPE
    default_size: int  # output side when nothing else gives one
    latent_scale: int = 16  # pixels per cell of the family's LATENT (the noise grid)
    noise_channels: int | None = None  # channels of that LATENT (None: latent_channels)


FLUX2 = Family(
    "FLUX.2",
    latent_channels=128,
    size_multiple=16,
    min_size=64,
    max_text_tokens=512,
    ref_time_offset=10,
    default_size=1024,
)
# FLUX.1 (Fill [dev]): ComfyUI's LATENT is the raw 16-channel VAE mean at 1/8 scale; the DiT packs 2x2 cells
# into one 64-channel token, so image sides are multiples of 16 here too. No references (ref offset unused).
FLUX1 = Family(
    "FLUX.1",
    latent_channels=64,
    size_multiple=16,
    min_size=64,
    max_text_tokens=512,
    ref_time_offset=0,
    default_size=1024,
    latent_scale=8,
    noise_channels=16,
)


@dataclass(frozen=True)
class Flux2Config:
    """Shape of a FLUX.2 DiT (BFL ``Flux2Params``)."""

    hidden_size: int  # num_heads * head_dim
    num_heads: int
    depth: int  # double-stream blocks
    depth_single_blocks: int
    context_in_dim: int  # 3 * text-encoder width: three hidden states concatenated per token
    in_channels: int = FLUX2.latent_channels  # 32 VAE channels * 2x2 patch
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

    @property
    def family(self) -> Family:
        return FLUX2


KLEIN_4B = Flux2Config(hidden_size=3072, num_heads=24, depth=5, depth_single_blocks=20, context_in_dim=7680)
KLEIN_9B = Flux2Config(hidden_size=4096, num_heads=32, depth=8, depth_single_blocks=24, context_in_dim=12288)
DEV_32B = Flux2Config(
    hidden_size=6144, num_heads=48, depth=8, depth_single_blocks=48, context_in_dim=15360, guidance_embed=True
)

TRANSFORMER_PRESETS = {"klein 4B": KLEIN_4B, "klein 9B": KLEIN_9B, "FLUX.2 dev 32B": DEV_32B}

# Text-encoder width (3 hidden states are concatenated) -> the encoder that gives it.
TEXT_ENCODER_FOR_CONTEXT = {7680: "Qwen3-4B", 12288: "Qwen3-8B", 15360: "Mistral-Small-3.2-24B"}

T = TypeVar("T")


def preset_name(presets: dict[str, T], value: T) -> str | None:
    """The name of the preset ``value`` equals, or None for any other shape (e.g. a test model)."""
    return next((name for name, preset in presets.items() if preset == value), None)


def describe(config: Flux2Config) -> str:
    return preset_name(TRANSFORMER_PRESETS, config) or (
        f"FLUX.2 DiT ({config.hidden_size} wide, {config.depth}+{config.depth_single_blocks} blocks, "
        f"{config.context_in_dim}-wide text)"
    )


GuidanceKind = Literal["none", "cfg", "embedded"]


@dataclass(frozen=True)
class Variant:
    """How a checkpoint is meant to be sampled. Distilled, base and KV weights have identical shapes.

    ``guidance`` is the kind of guidance the weights were trained for: ``none`` (distilled: one pass, the
    value is unused), ``cfg`` (true classifier-free guidance with a negative prompt, two passes per step) or
    ``embedded`` (the value is fed to the model's guidance embedder, one pass: FLUX.2 [dev]).
    """

    name: str  # "distilled", "base", "kv" or "dev"
    default_steps: int
    default_guidance: float
    guidance: GuidanceKind
    kv_cache: bool = False  # reference K/V are computed once and reused (9B-KV checkpoint)
    max_references: int | None = None  # None: as many as memory allows

    def check_references(self, count: int) -> None:
        if self.max_references is not None and count > self.max_references:
            raise Flux2Error(
                f"{count} reference images: the {self.name} model takes up to {self.max_references} (BFL "
                "recommends at most 6 for FLUX.2 [dev]); give fewer, or stitch several into one image"
            )

    @property
    def uses_cfg(self) -> bool:
        return self.guidance == "cfg"

    @property
    def embeds_guidance(self) -> bool:
        return self.guidance == "embedded"


VARIANTS = {
    "distilled": Variant("distilled", default_steps=4, default_guidance=1.0, guidance="none"),
    "base": Variant("base", default_steps=50, default_guidance=4.0, guidance="cfg"),
    "kv": Variant("kv", default_steps=4, default_guidance=1.0, guidance="none", kv_cache=True),
    "dev": Variant("dev", default_steps=50, default_guidance=4.0, guidance="embedded", max_references=10),
}


# What the klein text encoders can drive; dev also needs its Mistral text encoder.
KLEIN_VARIANTS = ("distilled", "base", "kv")


def get_variant(name: str) -> Variant:
    try:
        return VARIANTS[name]
    except KeyError:
        raise Flux2Error(
            f"unknown variant {name!r}: choose one of {', '.join(VARIANTS)} (or 'auto')"
        ) from None


def check_variant(variant: Variant, config: Flux2Config, name: str) -> None:
    """A guidance-embedding DiT (dev) only runs as the dev variant, and no other DiT does."""
    if config.guidance_embed and not variant.embeds_guidance:
        raise Flux2Error(
            f"{name} embeds the guidance value (FLUX.2 [dev] weights), so it cannot run as the "
            f"{variant.name} variant: choose variant 'dev' or 'auto'"
        )
    if variant.embeds_guidance and not config.guidance_embed:
        raise Flux2Error(
            f"{name} has no guidance embedder, so it cannot run as the dev variant: choose 'auto', "
            "'distilled', 'base' or 'kv'"
        )
