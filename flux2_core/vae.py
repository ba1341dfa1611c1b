"""FLUX.2 autoencoder: 32-channel KL VAE, 2x2 latent patchify and latent BatchNorm (BFL ``autoencoder.py``).

encode: pixels [B, 3, H, W] in [-1, 1] -> posterior mean [B, 32, H/8, W/8] -> patchify [B, 128, H/16, W/16]
-> BatchNorm with the file's running stats (eps 1e-4). That normalized latent is what the DiT and ComfyUI's
FLUX.2 ``LATENT`` hold; ``decode`` is the exact inverse. Every size is read from the checkpoint's shapes, so
the official VAE, the small decoder and tiny test VAEs load through one path. Module attributes are the BFL
key names; diffusers ``AutoencoderKLFlux2`` names are converted with one table (``DIFFUSERS_TO_BFL``).
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from .checkpoint import load_into, open_checkpoint, reject_quantized, strip_prefix
from .errors import Flux2Error

log = logging.getLogger(__name__)

BN_EPS = 1e-4  # latent BatchNorm eps (diffusers ``batch_norm_eps``); the GroupNorms use 1e-6
PATCH = 2  # the 32-channel latent is patchified 2x2 -> 128 channels
PREFIXES = ("first_stage_model.", "vae.")  # full LDM-style checkpoints / merged files


@dataclass(frozen=True)
class VAEConfig:
    """Shape of a FLUX.2 autoencoder (BFL ``AutoEncoderParams``), read from a checkpoint's tensor shapes."""

    ch: int = 128
    ch_mult: tuple[int, ...] = (1, 2, 4, 4)  # encoder widths = ch * mult
    num_res_blocks: int = 2  # per encoder level; each decoder level has one more
    z_channels: int = 32
    decoder_ch: int = 128  # 96 in the official small decoder (widths 96/192/384/384)
    decoder_ch_mult: tuple[int, ...] = (1, 2, 4, 4)
    in_channels: int = 3
    out_ch: int = 3
    norm_groups: int = 32
    has_encoder: bool = True  # False for a decoder-only file

    def __post_init__(self):
        odd = [w for w in self.encoder_widths + self.decoder_widths if w % self.norm_groups]
        if len(self.ch_mult) != len(self.decoder_ch_mult) or odd:
            raise Flux2Error(
                f"VAE widths {list(self.encoder_widths)} / {list(self.decoder_widths)} do not form a FLUX.2 "
                f"VAE (equal level counts, multiples of {self.norm_groups}): use flux2-vae.safetensors"
            )

    @property
    def encoder_widths(self) -> tuple[int, ...]:
        return tuple(self.ch * m for m in self.ch_mult)

    @property
    def decoder_widths(self) -> tuple[int, ...]:
        return tuple(self.decoder_ch * m for m in self.decoder_ch_mult)

    @property
    def downscale(self) -> int:  # pixels per latent cell: a stride-2 conv between levels, then the patch (16)
        return 2 ** (len(self.ch_mult) - 1) * PATCH

    @property
    def latent_channels(self) -> int:
        return self.z_channels * PATCH * PATCH


FLUX2_VAE = VAEConfig()
FLUX2_SMALL_DECODER_VAE = VAEConfig(decoder_ch=96)
VAE_PRESETS = {"FLUX.2 VAE": FLUX2_VAE, "FLUX.2 VAE with small decoder": FLUX2_SMALL_DECODER_VAE}


def describe_vae(config: VAEConfig) -> str:
    names = [name for name, preset in VAE_PRESETS.items() if preset == config]
    what = "FLUX.2-style VAE" if config.has_encoder else "FLUX.2-style decoder-only VAE"
    return (
        names[0] if names else f"{what} (decoder widths {list(config.decoder_widths)}, z {config.z_channels})"
    )


class AutoEncoder(nn.Module):
    """Pixels <-> normalized, patchified FLUX.2 latents ([B, 128, H/16, W/16] for the real model)."""

    def __init__(self, config: VAEConfig):
        super().__init__()
        self.config = config
        self.downscale = config.downscale
        self.latent_channels = config.latent_channels
        if config.has_encoder:
            self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        # Only the running stats are used (never batch statistics); BatchNorm2d gives the checkpoint's keys.
        self.bn = nn.BatchNorm2d(config.latent_channels, eps=BN_EPS, affine=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.conv_in.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.decoder.conv_in.weight.device

    @torch.no_grad()
    def encode(self, pixels: Tensor) -> Tensor:
        """[B, 3, H, W] in [-1, 1] -> normalized latent [B, 128, H/16, W/16], always float32."""
        if not self.config.has_encoder:
            raise Flux2Error(
                "this VAE file has no encoder (decoder weights only), so it cannot encode images: use "
                "full_encoder_small_decoder.safetensors or flux2-vae.safetensors"
            )
        if pixels.ndim != 4 or pixels.shape[1] != self.config.in_channels:
            raise Flux2Error(f"VAE encode expects images [B, 3, H, W], got shape {list(pixels.shape)}")
        _check_image_size(pixels.shape[-2], pixels.shape[-1], self.downscale)
        moments = self.encoder(pixels.to(self.device, self.dtype))  # [B, 2*z, H/8, W/8]: mean ‖ logvar
        # BFL, diffusers and ComfyUI all take the posterior mean; nobody samples
        mean = moments[:, : self.config.z_channels]
        return normalize(patchify(mean), self.bn.running_mean, self.bn.running_var)

    @torch.no_grad()
    def decode(self, latent: Tensor) -> Tensor:
        """Normalized latent [B, 128, h, w] -> pixels [B, 3, 16h, 16w], about [-1, 1], unclamped, float32."""
        if latent.ndim != 4 or latent.shape[1] != self.latent_channels:
            raise Flux2Error(
                f"VAE decode expects a FLUX.2 latent [B, {self.latent_channels}, h, w], got shape "
                f"{list(latent.shape)}: connect a latent made by FLUX.2 (not an SD/FLUX.1 latent)"
            )
        z = denormalize(latent.to(self.device), self.bn.running_mean, self.bn.running_var)
        return self.decoder(unpatchify(z).to(self.dtype)).float()


def patchify(z: Tensor) -> Tensor:
    """[B, C, H, W] -> [B, 4C, H/2, W/2]; channel c*4 + pi*2 + pj (diffusers ``_patchify_latents``)."""
    return rearrange(z, "b c (i pi) (j pj) -> b (c pi pj) i j", pi=PATCH, pj=PATCH)


def unpatchify(x: Tensor) -> Tensor:
    """[B, 4C, h, w] -> [B, C, 2h, 2w], the exact inverse of ``patchify``."""
    return rearrange(x, "b (c pi pj) i j -> b c (i pi) (j pj)", pi=PATCH, pj=PATCH)


def normalize(x: Tensor, running_mean: Tensor, running_var: Tensor, eps: float = BN_EPS) -> Tensor:
    """Latent BatchNorm in float32: (x - mean) / sqrt(var + eps) per channel of [B, C, h, w]."""
    mean, std = _bn_stats(x, running_mean, running_var, eps)
    return (x.float() - mean) / std


def denormalize(x: Tensor, running_mean: Tensor, running_var: Tensor, eps: float = BN_EPS) -> Tensor:
    """Inverse of ``normalize``, in float32."""
    mean, std = _bn_stats(x, running_mean, running_var, eps)
    return x.float() * std + mean


def load_vae(
    path: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> AutoEncoder:
    """Load a FLUX.2 VAE (BFL/ComfyUI file, diffusers ``vae/`` folder or file, or a decoder-only file)."""
    ckpt = open_checkpoint(path, "vae")
    reject_quantized(ckpt.tensors, ckpt.metadata, ckpt.name)
    model = vae_from_state_dict(ckpt.tensors, ckpt.name)
    model.to(device=device)
    for part in model.children():  # the BN stats stay as stored (fp32) so a bf16 model normalizes exactly
        if part is not model.bn:
            part.to(dtype=dtype)
    model.bn.float()
    log.info("loaded %s from %s (%s)", describe_vae(model.config), ckpt.path, dtype)
    return model.eval()


def vae_from_state_dict(state_dict: dict[str, Tensor], name: str = "the VAE file") -> AutoEncoder:
    """Build on the meta device and assign the (converted) tensors strictly; keeps the tensors' dtype."""
    sd = convert_vae_state_dict(state_dict, name)
    config = vae_config_from_state_dict(sd)
    with torch.device("meta"):
        model = AutoEncoder(config)
    load_into(model, sd, f"{name} ({describe_vae(config)})")
    return model.eval()


# diffusers ``AutoencoderKLFlux2`` -> BFL names (spec 4.3). Every rule is tried in order, so one key may be
# touched by several (``up_blocks`` + ``conv_shortcut``). ``{up}`` is reversed: up_blocks.{i} is
# up.{levels - 1 - i}. ComfyUI's top-level quant convs and a bare decoder's post_quant_conv use the first two.
DIFFUSERS_TO_BFL = (
    (r"^quant_conv\.", "encoder.quant_conv."),
    (r"^post_quant_conv\.", "decoder.post_quant_conv."),
    (r"^(?P<part>encoder|decoder)\.conv_norm_out\.", "{part}.norm_out."),
    (r"^encoder\.down_blocks\.(?P<i>\d+)\.resnets\.", "encoder.down.{i}.block."),
    (r"^encoder\.down_blocks\.(?P<i>\d+)\.downsamplers\.0\.", "encoder.down.{i}.downsample."),
    (r"^decoder\.up_blocks\.(?P<up>\d+)\.resnets\.", "decoder.up.{up}.block."),
    (r"^decoder\.up_blocks\.(?P<up>\d+)\.upsamplers\.0\.", "decoder.up.{up}.upsample."),
    (r"\.mid_block\.resnets\.0\.", ".mid.block_1."),
    (r"\.mid_block\.resnets\.1\.", ".mid.block_2."),
    (r"\.mid_block\.attentions\.0\.", ".mid.attn_1."),
    (r"\.attn_1\.group_norm\.", ".attn_1.norm."),
    (r"\.attn_1\.to_(?P<p>q|k|v)\.", ".attn_1.{p}."),
    (r"\.attn_1\.to_out\.0\.", ".attn_1.proj_out."),
    (r"\.conv_shortcut\.", ".nin_shortcut."),
)
_ATTN_WEIGHT = re.compile(r"\.attn_1\.(q|k|v|proj_out)\.weight$")  # diffusers: Linear [C, C], BFL: 1x1 conv
_BARE_DECODER = re.compile(r"^(conv_in|conv_out|norm_out|conv_norm_out|mid|mid_block|up|up_blocks)\.")

# Files that are not VAEs at all: (key substrings, what it is, what to do).
_OTHER_MODELS = (
    (("double_blocks.", "single_blocks.", "transformer_blocks.", "img_in.", "x_embedder.", "input_blocks."),
     "a diffusion model (DiT/UNet)", "load it as the model and choose flux2-vae.safetensors as the VAE"),
    (("embed_tokens.", "self_attn."),
     "a text encoder", "load it as the text encoder and choose flux2-vae.safetensors as the VAE"),
)  # fmt: skip
# Latent width of VAEs without the FLUX.2 latent BatchNorm -> what they are.
_OLDER_VAES = {16: "a FLUX.1 (or SD3) VAE (16 latent channels)", 4: "an SD 1.x/SDXL VAE (4 latent channels)"}


def convert_vae_state_dict(state_dict: dict[str, Tensor], name: str = "the VAE file") -> dict[str, Tensor]:
    """Any accepted layout -> BFL keys, after checking that the file is a FLUX.2 VAE."""
    sd = strip_prefix(dict(state_dict), PREFIXES)
    for markers, what, fix in _OTHER_MODELS:
        if any(m in k for k in sd for m in markers):
            raise Flux2Error(f"{name} looks like {what}, not a VAE: {fix}")
    sd = remap_keys(sd)
    _check_flux2_vae(sd, name)
    sd.setdefault("bn.num_batches_tracked", torch.tensor(0))  # optional in files, a buffer of BatchNorm2d
    return sd


def remap_keys(sd: dict[str, Tensor]) -> dict[str, Tensor]:
    """Rename diffusers / ComfyUI / bare-decoder keys to BFL keys; BFL keys pass through unchanged."""
    if not any(k.startswith(("encoder.", "decoder.")) for k in sd):
        # small_decoder.safetensors: decoder keys without their "decoder." prefix
        sd = {f"decoder.{k}" if _BARE_DECODER.match(k) else k: v for k, v in sd.items()}
    up_levels = _count(sd, r"decoder\.up_blocks\.(\d+)\.")
    out = {}
    for key, tensor in sd.items():
        for pattern, template in DIFFUSERS_TO_BFL:
            if match := re.search(pattern, key):
                groups = match.groupdict()
                if "up" in groups:
                    groups["up"] = str(up_levels - 1 - int(groups["up"]))
                key = key[: match.start()] + template.format(**groups) + key[match.end() :]
        out[key] = tensor[:, :, None, None] if _ATTN_WEIGHT.search(key) and tensor.ndim == 2 else tensor
    return out


def vae_config_from_state_dict(sd: dict[str, Tensor]) -> VAEConfig:
    """Read every dimension from BFL-named shapes (levels, blocks per level, widths, latent channels)."""
    dec_widths = _level_widths(sd, "decoder.up")
    has_encoder = "encoder.conv_in.weight" in sd
    if has_encoder:
        ch, in_channels = _shape(sd, "encoder.conv_in.weight")[:2]
        enc_widths = _level_widths(sd, "encoder.down")
        num_res_blocks = _count(sd, r"encoder\.down\.0\.block\.(\d+)\.")
    else:  # decoder-only: mirror the decoder, which is all that gets built
        ch, in_channels, enc_widths = dec_widths[0], 3, dec_widths
        num_res_blocks = _count(sd, r"decoder\.up\.0\.block\.(\d+)\.") - 1
    return VAEConfig(
        ch=ch,
        ch_mult=_mult(enc_widths, ch),
        num_res_blocks=num_res_blocks,
        z_channels=_shape(sd, "decoder.conv_in.weight")[1],
        decoder_ch=dec_widths[0],
        decoder_ch_mult=_mult(dec_widths, dec_widths[0]),
        in_channels=in_channels,
        out_ch=_shape(sd, "decoder.conv_out.weight")[0],
        has_encoder=has_encoder,
    )


class Encoder(nn.Module):
    def __init__(self, c: VAEConfig):
        super().__init__()
        widths, last = c.encoder_widths, len(c.ch_mult) - 1
        self.conv_in = nn.Conv2d(c.in_channels, c.ch, 3, padding=1)
        ins = (c.ch, *widths[:-1])  # level i is entered from level i - 1 (or from conv_in)
        self.down = nn.ModuleList(
            Level(ins[i], w, c.num_res_blocks, c.norm_groups, "downsample" if i != last else None)
            for i, w in enumerate(widths)
        )
        self.mid = _mid_block(widths[-1], c.norm_groups)
        self.norm_out = _group_norm(widths[-1], c.norm_groups)
        self.conv_out = nn.Conv2d(widths[-1], 2 * c.z_channels, 3, padding=1)
        self.quant_conv = nn.Conv2d(2 * c.z_channels, 2 * c.z_channels, 1)

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv_in(x)
        for level in self.down:
            h = level(h)
        h = self.conv_out(F.silu(self.norm_out(self.mid(h))))
        return self.quant_conv(h)  # [B, 2*z, H/8, W/8]


class Decoder(nn.Module):
    def __init__(self, c: VAEConfig):
        super().__init__()
        widths = c.decoder_widths
        self.post_quant_conv = nn.Conv2d(c.z_channels, c.z_channels, 1)
        self.conv_in = nn.Conv2d(c.z_channels, widths[-1], 3, padding=1)
        self.mid = _mid_block(widths[-1], c.norm_groups)
        # up.{k} is level k (0 = full resolution); forward runs them from the deepest level to level 0
        ins = (*widths[1:], widths[-1])  # level k is entered from level k + 1 (or from mid)
        self.up = nn.ModuleList(
            Level(ins[k], w, c.num_res_blocks + 1, c.norm_groups, "upsample" if k else None)
            for k, w in enumerate(widths)
        )
        self.norm_out = _group_norm(widths[0], c.norm_groups)
        self.conv_out = nn.Conv2d(widths[0], c.out_ch, 3, padding=1)

    def forward(self, z: Tensor) -> Tensor:
        h = self.mid(self.conv_in(self.post_quant_conv(z)))
        for level in reversed(self.up):
            h = level(h)
        return self.conv_out(F.silu(self.norm_out(h)))


class Level(nn.Module):
    """One resolution: ``block.{j}`` ResnetBlocks, then an optional ``downsample`` or ``upsample``."""

    def __init__(self, in_ch: int, out_ch: int, num_blocks: int, groups: int, resample: str | None):
        super().__init__()
        ins = (in_ch, *[out_ch] * (num_blocks - 1))
        self.block = nn.ModuleList(ResnetBlock(i, out_ch, groups) for i in ins)
        self.resample = resample
        if resample:
            self.add_module(resample, Resample(out_ch, up=resample == "upsample"))

    def forward(self, x: Tensor) -> Tensor:
        for block in self.block:
            x = block(x)
        return getattr(self, self.resample)(x) if self.resample else x


class ResnetBlock(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, groups: int):
        super().__init__()
        self.norm1 = _group_norm(in_ch, groups)
        self.conv1 = nn.Conv2d(in_ch, out_ch, 3, padding=1)
        self.norm2 = _group_norm(out_ch, groups)
        self.conv2 = nn.Conv2d(out_ch, out_ch, 3, padding=1)
        self.nin_shortcut = nn.Conv2d(in_ch, out_ch, 1) if in_ch != out_ch else None

    def forward(self, x: Tensor) -> Tensor:
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (x if self.nin_shortcut is None else self.nin_shortcut(x)) + h


class AttnBlock(nn.Module):
    """Single-head self-attention over the H*W positions; q/k/v/proj_out are 1x1 convs (BFL keys)."""

    def __init__(self, ch: int, groups: int):
        super().__init__()
        self.norm = _group_norm(ch, groups)
        self.q = nn.Conv2d(ch, ch, 1)
        self.k = nn.Conv2d(ch, ch, 1)
        self.v = nn.Conv2d(ch, ch, 1)
        self.proj_out = nn.Conv2d(ch, ch, 1)

    def forward(self, x: Tensor) -> Tensor:
        h, w = x.shape[-2:]
        hn = self.norm(x)
        q, k, v = (rearrange(f(hn), "b c h w -> b 1 (h w) c") for f in (self.q, self.k, self.v))
        out = F.scaled_dot_product_attention(q, k, v)  # [B, 1, H*W, C], scale 1/sqrt(C)
        return x + self.proj_out(rearrange(out, "b 1 (h w) c -> b c h w", h=h, w=w))


class Resample(nn.Module):
    """Down: zero pad (right, bottom) + 3x3 stride-2 conv, as in BFL/LDM. Up: nearest x2 + 3x3 conv."""

    def __init__(self, ch: int, up: bool):
        super().__init__()
        self.up = up
        self.conv = nn.Conv2d(ch, ch, 3, stride=1 if up else 2, padding=1 if up else 0)

    def forward(self, x: Tensor) -> Tensor:
        if self.up:
            return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))
        return self.conv(F.pad(x, (0, 1, 0, 1)))


def _mid_block(ch: int, groups: int) -> nn.Sequential:
    blocks = {"block_1": ResnetBlock(ch, ch, groups), "attn_1": AttnBlock(ch, groups)}
    return nn.Sequential(OrderedDict(blocks, block_2=ResnetBlock(ch, ch, groups)))


def _group_norm(ch: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, ch, eps=1e-6, affine=True)


def _bn_stats(x: Tensor, running_mean: Tensor, running_var: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    mean = running_mean.to(x.device, torch.float32).view(1, -1, 1, 1)
    std = torch.sqrt(running_var.to(x.device, torch.float32).view(1, -1, 1, 1) + eps)
    return mean, std


def _check_image_size(height: int, width: int, factor: int) -> None:
    if height % factor or width % factor or not (height and width):
        fit = f"{max(factor, width // factor * factor)}x{max(factor, height // factor * factor)}"
        raise Flux2Error(
            f"image size {width}x{height} is not a multiple of {factor}: crop or resize it to a multiple "
            f"of {factor} on both sides (e.g. {fit})"
        )


def _check_flux2_vae(sd: dict[str, Tensor], name: str) -> None:
    has_encoder, has_decoder = "encoder.conv_in.weight" in sd, "decoder.conv_in.weight" in sd
    if not (has_encoder or has_decoder):
        raise Flux2Error(
            f"{name} does not look like a VAE (no conv_in weights): choose flux2-vae.safetensors"
        )
    # latent channels: decoder input, or half the encoder output (mean ‖ logvar)
    z = (
        _shape(sd, "decoder.conv_in.weight")[1]
        if has_decoder
        else _shape(sd, "encoder.conv_out.weight")[0] // 2
    )
    if "bn.running_mean" not in sd:  # every FLUX.2 VAE carries the latent BatchNorm; older VAEs do not
        what = _OLDER_VAES.get(z, f"a VAE with {z} latent channels and no latent BatchNorm, not a FLUX.2 VAE")
        if z not in _OLDER_VAES and not has_encoder:
            what = "decoder weights only, without the latent BatchNorm statistics FLUX.2 latents need"
        raise Flux2Error(
            f"{name} holds {what}; FLUX.2 needs flux2-vae.safetensors "
            "(or full_encoder_small_decoder.safetensors)"
        )
    if not has_decoder:
        raise Flux2Error(f"{name} holds only a VAE encoder: use flux2-vae.safetensors, which has both halves")
    if (bn := _shape(sd, "bn.running_mean")[0]) != PATCH * PATCH * z:
        raise Flux2Error(
            f"{name} has {z} latent channels but {bn} BatchNorm channels (expected {PATCH * PATCH * z}): "
            "the file is not a consistent FLUX.2 VAE"
        )


def _shape(sd: dict[str, Tensor], key: str) -> tuple[int, ...]:
    if key not in sd:
        raise Flux2Error(f"the VAE file has no tensor {key}: it is incomplete or not a FLUX.2 VAE")
    return tuple(sd[key].shape)


def _count(sd: dict[str, Tensor], pattern: str) -> int:
    """How many distinct indices the first group of ``pattern`` takes over the keys."""
    return len({m[1] for k in sd if (m := re.match(pattern, k))})


def _level_widths(sd: dict[str, Tensor], prefix: str) -> list[int]:
    levels = _count(sd, re.escape(prefix) + r"\.(\d+)\.")
    return [_shape(sd, f"{prefix}.{i}.block.0.conv2.weight")[0] for i in range(max(levels, 1))]


def _mult(widths: list[int], ch: int) -> tuple[int, ...]:
    if any(w % ch for w in widths):
        raise Flux2Error(f"VAE level widths {widths} are not multiples of {ch}: not a FLUX.2 VAE")
    return tuple(w // ch for w in widths)
