"""FLUX.2 autoencoder: the shared VAE blocks, FLUX.2's latent format, presets, checks and ``load_vae``.

encode: pixels [B, 3, H, W] in [-1, 1] -> posterior mean [B, 32, H/8, W/8] -> the latent format (2x2
patchify and BatchNorm) -> [B, 128, H/16, W/16]. That normalised latent is what the DiT and ComfyUI's FLUX.2
``LATENT`` hold; ``decode`` is the exact inverse. Every size is read from the checkpoint's shapes, so the
official VAE, the small decoder and tiny test VAEs load through one path. Module attributes are the BFL key
names; diffusers ``AutoencoderKLFlux2`` names are mapped by ``keymaps.VAE``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor, nn

from ..configs import preset_name
from ..errors import Flux2Error
from ..weights.checkpoint import Checkpoint
from ..weights.keymaps import BARE_DECODER, VAE, VAE_PREFIXES
from ..weights.loading import load_checkpoint, load_component
from ..weights.plan import ComponentSpec, block_count, plan_checkpoint
from . import tiling as vae_tiling
from .blocks import Decoder, Encoder, VAEConfig
from .latent_format import BN_EPS, PatchedBatchNorm, denormalize, normalize, patchify, unpatchify
from .progress import Progress

__all__ = [
    "AutoEncoder",
    "VAEConfig",
    "blocks_config",
    "denormalize",
    "load_vae",
    "normalize",
    "patchify",
    "unpatchify",
    "vae_rename",
]

FLUX2_VAE = VAEConfig()
FLUX2_SMALL_DECODER_VAE = VAEConfig(decoder_ch=96)
MAX_VAE_BLOCKS = 16  # levels, and resnet blocks per level (the FLUX VAEs have 4 and 2-3)
VAE_PRESETS = {"FLUX.2 VAE": FLUX2_VAE, "FLUX.2 VAE with small decoder": FLUX2_SMALL_DECODER_VAE}


def describe_vae(config: VAEConfig) -> str:
    what = "FLUX.2-style VAE" if config.has_encoder else "FLUX.2-style decoder-only VAE"
    return preset_name(VAE_PRESETS, config) or (
        f"{what} (decoder widths {list(config.decoder_widths)}, z {config.z_channels})"
    )


class AutoEncoder(nn.Module):
    """Pixels <-> normalised, patchified FLUX.2 latents ([B, 128, H/16, W/16] for the real model).

    Subclasses (the FLUX.1 VAE) change the latent format and the names in messages."""

    family = "FLUX.2"
    file_hint = "flux2-vae.safetensors"

    def __init__(self, config: VAEConfig):
        super().__init__()
        self.config = config
        self.downscale = config.downscale
        self.latent_channels = config.latent_channels
        if config.has_encoder:
            self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.bn = self._latent_statistics(config)
        self.latent_format = PatchedBatchNorm()

    def _latent_statistics(self, config: VAEConfig) -> nn.Module | None:
        # Only the running stats are used (never batch statistics); BatchNorm2d gives the checkpoint's keys.
        return nn.BatchNorm2d(config.latent_channels, eps=BN_EPS, affine=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.conv_in.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.decoder.conv_in.weight.device

    @torch.no_grad()
    def encode(
        self,
        pixels: Tensor,
        tile_size: int | None = None,
        tile_overlap: int = vae_tiling.DEFAULT_OVERLAP,
        progress: Progress | None = None,
    ) -> Tensor:
        """[B, 3, H, W] in [-1, 1] -> normalised latent [B, 128, H/16, W/16], always float32.

        ``tile_size`` (pixels, a multiple of 16, at least 128) encodes in overlapping tiles that share
        ``tile_overlap`` pixels, for large images in bounded memory; None or 0 tiles only when the image
        would not fit in the free memory (see ``vae_tiling``). ``progress(done, total)`` is called before
        the work and after each encoder stage of each tile, and may raise to stop (``vae.progress``).
        """
        if not self.config.has_encoder:
            raise Flux2Error(
                "this VAE file has no encoder (decoder weights only), so it cannot encode images: use "
                f"full_encoder_small_decoder.safetensors or {self.file_hint}"
            )
        if pixels.ndim != 4 or pixels.shape[1] != self.config.in_channels:
            raise Flux2Error(f"VAE encode expects images [B, 3, H, W], got shape {list(pixels.shape)}")
        _check_image_size(pixels.shape[-2], pixels.shape[-1], self.downscale)
        return vae_tiling.encode(self, pixels, tile_size, tile_overlap, self._encode_whole, progress)

    def _encode_whole(self, pixels: Tensor, after: Callable[[int], None] | None = None) -> Tensor:
        moments = self.encoder(pixels.to(self.device, self.dtype), after)  # [B, 2*z, H/8, W/8]: mean ‖ logvar
        # BFL, diffusers and ComfyUI all take the posterior mean; nobody samples
        return self.latent_format.to_latent(moments[:, : self.config.z_channels], self.bn)

    @torch.no_grad()
    def decode(
        self,
        latent: Tensor,
        tile_size: int | None = None,
        tile_overlap: int = vae_tiling.DEFAULT_OVERLAP,
        progress: Progress | None = None,
    ) -> Tensor:
        """Normalised latent [B, 128, h, w] -> pixels [B, 3, 16h, 16w], about [-1, 1], unclamped, float32.

        ``tile_size`` (pixels, a multiple of 16, at least 128) decodes in overlapping tiles that share
        ``tile_overlap`` pixels, blended smoothly, for large images in bounded memory; None or 0 tiles only
        when the image would not fit in the free memory (see ``vae_tiling``). ``progress(done, total)`` is
        called before the work and after each decoder stage of each tile, and may raise to stop
        (``vae.progress``); the pixels are the same with it as without.
        """
        if latent.ndim != 4 or latent.shape[1] != self.latent_channels:
            raise Flux2Error(
                f"VAE decode expects a {self.family} latent [B, {self.latent_channels}, h, w], got shape "
                f"{list(latent.shape)}: connect a latent made by {self.family} with this VAE (a latent of "
                "another model family needs that family's VAE)"
            )
        pixels = vae_tiling.decode(self, latent, tile_size, tile_overlap, self._decode_whole, progress)
        if not torch.isfinite(pixels).all():
            cause = (
                "the latent holds NaN/inf"
                if not torch.isfinite(latent).all()
                else "the VAE overflowed in float16 or its weights hold NaN/inf: load it in bfloat16 or "
                "float32, or download the VAE file again"
            )
            raise Flux2Error(f"decoding produced NaN or infinite pixels: {cause}")
        return pixels

    def _decode_whole(self, latent: Tensor, after: Callable[[int], None] | None = None) -> Tensor:
        z = self.latent_format.from_latent(latent.to(self.device), self.bn)
        return self.decoder(z.to(self.dtype), after).float()

    def decode_work(self, rows: int, cols: int) -> int:
        """Multiply-adds of decoding one latent of ``rows x cols`` cells: the decoder stages' costs."""
        patch = self.config.patch  # the decoder sees the unpatchified latent
        return sum(cost for _, cost in self.decoder.stages(rows * patch, cols * patch))

    def encode_work(self, height: int, width: int) -> int:
        """Multiply-adds of encoding one ``width x height`` image: the encoder stages' costs."""
        return sum(cost for _, cost in self.encoder.stages(height, width))

    def encode_memory(
        self, height: int, width: int, tile: int | None = None, overlap: int = vae_tiling.DEFAULT_OVERLAP
    ) -> int:
        """Peak bytes of encoding one ``width x height`` image: as for decoding, about 8 maps of the
        encoder's full-resolution width; with a positive ``tile``, those of one tile plus the latent."""
        if tile is not None and 0 < tile < max(height, width):
            return vae_tiling.tiled_encode_memory(self, height, width, tile, overlap)
        return height * width * self.config.ch * 8 * (torch.finfo(self.dtype).bits // 8)

    def decode_memory(
        self, height: int, width: int, tile: int | None = None, overlap: int = vae_tiling.DEFAULT_OVERLAP
    ) -> int:
        """Peak bytes of decoding one ``width x height`` image: the decoder's full-resolution level holds
        about 6 maps of its width (measured 6.2 for a 2048^2 decode); 8 leaves a margin. With a positive
        ``tile``, those of one tile plus the float32 image."""
        if tile is not None and 0 < tile < max(height, width):
            return vae_tiling.tiled_decode_memory(self, height, width, tile, overlap)
        return height * width * self.config.decoder_ch * 8 * (torch.finfo(self.dtype).bits // 8)


def load_vae(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> AutoEncoder:
    """Load a FLUX.2 VAE (BFL/ComfyUI file, diffusers ``vae/`` folder or file, or a decoder-only file).

    The BatchNorm statistics stay float32 whatever ``dtype`` is, so a bf16 model normalises exactly.
    """
    return load_component(VAE_SPEC, path, dtype, device).module


def vae_from_state_dict(state_dict: dict[str, Tensor], name: str = "the VAE file") -> AutoEncoder:
    """Build from in-memory tensors (any accepted layout), keeping their dtype."""
    return load_checkpoint(VAE_SPEC, Checkpoint(Path(name), state_dict), None).module


def vae_shapes(state_dict: dict[str, Tensor], name: str = "the VAE file") -> dict[str, tuple[int, ...]]:
    """BFL key -> shape of what a VAE file (any layout, meta tensors too) holds, after the key map."""
    return plan_checkpoint(VAE_SPEC, Checkpoint(Path(name), state_dict)).shapes


def vae_config(shapes: dict[str, tuple[int, ...]], name: str = "the VAE file") -> VAEConfig:
    """Read every dimension from BFL-named shapes (levels, blocks per level, widths, latent channels)."""
    _check_flux2_vae(shapes, name)
    return blocks_config(shapes)


def blocks_config(shapes: dict[str, tuple[int, ...]], patch: int = 2) -> VAEConfig:
    """The encoder/decoder shape of any FLUX VAE from its BFL-named shapes; ``patch``: the latent's."""
    dec_widths = _level_widths(shapes, "decoder.up")
    has_encoder = "encoder.conv_in.weight" in shapes
    if has_encoder:
        ch, in_channels = _shape(shapes, "encoder.conv_in.weight")[:2]
        enc_widths = _level_widths(shapes, "encoder.down")
        num_res_blocks = _count(shapes, "encoder.down.0.block.")
    else:  # decoder-only: mirror the decoder, which is all that gets built
        ch, in_channels, enc_widths = dec_widths[0], 3, dec_widths
        num_res_blocks = _count(shapes, "decoder.up.0.block.") - 1
    return VAEConfig(
        ch=ch,
        ch_mult=_mult(enc_widths, ch),
        num_res_blocks=num_res_blocks,
        z_channels=_shape(shapes, "decoder.conv_in.weight")[1],
        decoder_ch=dec_widths[0],
        decoder_ch_mult=_mult(dec_widths, dec_widths[0]),
        in_channels=in_channels,
        out_ch=_shape(shapes, "decoder.conv_out.weight")[0],
        has_encoder=has_encoder,
        patch=patch,
        quant_conv="decoder.post_quant_conv.weight" in shapes or "encoder.quant_conv.weight" in shapes,
    )


# Files that are not VAEs at all: (key substrings, what it is, what to do).
_OTHER_MODELS = (
    (("double_blocks.", "single_blocks.", "transformer_blocks.", "img_in.", "x_embedder.", "input_blocks."),
     "a diffusion model (DiT/UNet)", "load it as the model and choose flux2-vae.safetensors as the VAE"),
    (("embed_tokens.", "self_attn."),
     "a text encoder", "load it as the text encoder and choose flux2-vae.safetensors as the VAE"),
)  # fmt: skip
# Latent width of VAEs without the FLUX.2 latent BatchNorm -> what they are.
_OLDER_VAES = {16: "a FLUX.1 (or SD3) VAE (16 latent channels)", 4: "an SD 1.x/SDXL VAE (4 latent channels)"}


def _identify(names: dict[str, str], checkpoint: Checkpoint) -> None:
    for markers, what, fix in _OTHER_MODELS:
        if any(m in k for k in names for m in markers):
            raise Flux2Error(f"{checkpoint.name} looks like {what}, not a VAE: {fix}")


def vae_rename(names: dict[str, str]) -> dict[str, str]:
    if any(k.startswith(("encoder.", "decoder.")) for k in names):
        return names
    # small_decoder.safetensors: decoder keys without their "decoder." prefix
    return {f"decoder.{k}" if BARE_DECODER.match(k) else k: v for k, v in names.items()}


def _check_image_size(height: int, width: int, factor: int) -> None:
    if height % factor or width % factor or not (height and width):
        fit = f"{max(factor, width // factor * factor)}x{max(factor, height // factor * factor)}"
        raise Flux2Error(
            f"image size {width}x{height} is not a multiple of {factor}: crop or resize it to a multiple "
            f"of {factor} on both sides (e.g. {fit})"
        )


def _check_flux2_vae(shapes: dict[str, tuple[int, ...]], name: str) -> None:
    has_encoder, has_decoder = "encoder.conv_in.weight" in shapes, "decoder.conv_in.weight" in shapes
    if not (has_encoder or has_decoder):
        raise Flux2Error(
            f"{name} does not look like a VAE (no conv_in weights): choose flux2-vae.safetensors"
        )
    # latent channels: decoder input, or half the encoder output (mean ‖ logvar)
    z = (
        _shape(shapes, "decoder.conv_in.weight")[1]
        if has_decoder
        else _shape(shapes, "encoder.conv_out.weight")[0] // 2
    )
    if "bn.running_mean" not in shapes:  # every FLUX.2 VAE carries the latent BatchNorm; older VAEs do not
        what = _OLDER_VAES.get(z, f"a VAE with {z} latent channels and no latent BatchNorm, not a FLUX.2 VAE")
        if z not in _OLDER_VAES and not has_encoder:
            what = "decoder weights only, without the latent BatchNorm statistics FLUX.2 latents need"
        raise Flux2Error(
            f"{name} holds {what}; FLUX.2 needs flux2-vae.safetensors "
            "(or full_encoder_small_decoder.safetensors)"
        )
    if not has_decoder:
        raise Flux2Error(f"{name} holds only a VAE encoder: use flux2-vae.safetensors, which has both halves")
    if (bn := _shape(shapes, "bn.running_mean")[0]) != 4 * z:
        raise Flux2Error(
            f"{name} has {z} latent channels but {bn} BatchNorm channels (expected {4 * z}): "
            "the file is not a consistent FLUX.2 VAE"
        )


def _shape(shapes: dict[str, tuple[int, ...]], key: str) -> tuple[int, ...]:
    if key not in shapes:
        raise Flux2Error(f"the VAE file has no tensor {key}: it is incomplete or not a FLUX.2 VAE")
    return tuple(shapes[key])


def _count(shapes, prefix: str) -> int:
    """How many numbered blocks ``prefix{i}.`` there are (contiguous from 0, bounded: ``block_count``)."""
    return block_count(shapes, prefix, "VAE blocks", "the VAE file", limit=MAX_VAE_BLOCKS)


def _level_widths(shapes, prefix: str) -> list[int]:
    levels = _count(shapes, prefix + ".")
    return [_shape(shapes, f"{prefix}.{i}.block.0.conv2.weight")[0] for i in range(max(levels, 1))]


def _mult(widths: list[int], ch: int) -> tuple[int, ...]:
    if any(w % ch for w in widths):
        raise Flux2Error(f"VAE level widths {widths} are not multiples of {ch}: not a FLUX.2 VAE")
    return tuple(w // ch for w in widths)


VAE_SPEC = ComponentSpec(
    what="VAE",
    component="vae",
    keymap=VAE,
    config=lambda shapes, checkpoint: vae_config(shapes, checkpoint.name),
    build=AutoEncoder,
    describe=describe_vae,
    prefixes=(VAE_PREFIXES,),
    identify=_identify,
    rename=vae_rename,
    keep_float32=("bn.",),
    defaults={"bn.num_batches_tracked": lambda: torch.tensor(0)},
)
