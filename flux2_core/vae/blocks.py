"""The convolutional autoencoder blocks shared by the FLUX VAEs (BFL ``autoencoder.py`` layout and names).

FLUX.1's 16-channel VAE and FLUX.2's 32-channel VAE are the same encoder and decoder with other widths; what
differs is how the posterior mean becomes the model's latent (``latent_format.py``). ``VAEConfig`` holds the
shape, read from a checkpoint's tensors.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import torch.nn.functional as F
from einops import rearrange
from torch import Tensor, nn

from ..errors import Flux2Error


@dataclass(frozen=True)
class VAEConfig:
    """Shape of a FLUX autoencoder (BFL ``AutoEncoderParams``), read from a checkpoint's tensor shapes."""

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
    patch: int = 2  # FLUX.2 patchifies the latent 2x2 (FLUX.1: 1)
    quant_conv: bool = True  # 1x1 convs after the encoder and before the decoder (FLUX.2; FLUX.1 has none)

    def __post_init__(self):
        odd = [w for w in self.encoder_widths + self.decoder_widths if w % self.norm_groups]
        if len(self.ch_mult) != len(self.decoder_ch_mult) or odd:
            raise Flux2Error(
                f"VAE widths {list(self.encoder_widths)} / {list(self.decoder_widths)} do not form a FLUX "
                f"VAE (equal level counts, multiples of {self.norm_groups}): use flux2-vae.safetensors"
            )

    @property
    def encoder_widths(self) -> tuple[int, ...]:
        return tuple(self.ch * m for m in self.ch_mult)

    @property
    def decoder_widths(self) -> tuple[int, ...]:
        return tuple(self.decoder_ch * m for m in self.decoder_ch_mult)

    @property
    def downscale(self) -> int:  # pixels per latent cell: a stride-2 conv between levels, then the patch
        return 2 ** (len(self.ch_mult) - 1) * self.patch

    @property
    def latent_channels(self) -> int:
        return self.z_channels * self.patch * self.patch


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
        self.quant_conv = nn.Conv2d(2 * c.z_channels, 2 * c.z_channels, 1) if c.quant_conv else nn.Identity()

    def forward(self, x: Tensor, after: Callable[[int], None] | None = None) -> Tensor:
        """[B, 3, H, W] -> [B, 2*z, H/8, W/8]; ``after(cost)`` runs after each of ``stages``."""
        return run_stages(self.stages(*x.shape[-2:]), x, after)

    def stages(self, height: int, width: int) -> list[Stage]:
        """The encoder's work on an image of ``height x width``, in order: conv_in, each level's blocks and
        downsample, the mid block's three parts, the output convs."""
        first = (self.conv_in, height * width * _conv_cost(self.conv_in))
        levels, positions = _level_stages(self.down, height * width)
        out = positions * (_conv_cost(self.conv_out) + _conv_cost(self.quant_conv))
        return [first, *levels, *_mid_stages(self.mid, positions), (self._out, out)]

    def _out(self, h: Tensor) -> Tensor:
        return self.quant_conv(self.conv_out(F.silu(self.norm_out(h))))


class Decoder(nn.Module):
    def __init__(self, c: VAEConfig):
        super().__init__()
        widths = c.decoder_widths
        self.post_quant_conv = nn.Conv2d(c.z_channels, c.z_channels, 1) if c.quant_conv else nn.Identity()
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

    def forward(self, z: Tensor, after: Callable[[int], None] | None = None) -> Tensor:
        """[B, z, h, w] -> [B, 3, 8h, 8w]; ``after(cost)`` runs after each of ``stages``."""
        return run_stages(self.stages(*z.shape[-2:]), z, after)

    def stages(self, height: int, width: int) -> list[Stage]:
        """The decoder's work on a ``height x width`` input, in order: the input convs, the mid block's three
        parts, each level's blocks and upsample from the deepest level up, the output conv."""
        positions = height * width
        first = (self._enter, positions * (_conv_cost(self.post_quant_conv) + _conv_cost(self.conv_in)))
        levels, full = _level_stages(reversed(self.up), positions)
        out = (self._out, full * _conv_cost(self.conv_out))
        return [first, *_mid_stages(self.mid, positions), *levels, out]

    def _enter(self, z: Tensor) -> Tensor:
        return self.conv_in(self.post_quant_conv(z))

    def _out(self, h: Tensor) -> Tensor:
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
        # Contiguous q/k/v: strided ones make SDPA fall back to its math kernel, which builds the whole
        # (HW)^2 score matrix (17 GB for a 2048^2 image); the fused kernels keep memory linear in pixels.
        q, k, v = (rearrange(f(hn), "b c h w -> b 1 (h w) c").contiguous() for f in (self.q, self.k, self.v))
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


Stage = tuple[Callable[[Tensor], Tensor], int]
"""One step of an encoder's or decoder's work: what runs, and its multiply-adds for one image (convolutions
and attention; the norms and activations are left out), which weigh the progress a run reports."""


def run_stages(stages: list[Stage], x: Tensor, after: Callable[[int], None] | None = None) -> Tensor:
    """Run ``stages`` on ``x`` in order, calling ``after(cost)`` after each (it may raise to stop the run).
    The same operations in the same order as running the modules whole: the result is the same bit for bit."""
    for run, cost in stages:
        x = run(x)
        if after is not None:
            after(cost)
    return x


def _conv_cost(conv: nn.Module) -> int:
    """Multiply-adds of a convolution per output position (0 for an Identity)."""
    if not isinstance(conv, nn.Conv2d):
        return 0
    kh, kw = conv.kernel_size
    return conv.in_channels * conv.out_channels * kh * kw // conv.groups


def _resnet_cost(block: ResnetBlock, positions: int) -> int:
    shortcut = 0 if block.nin_shortcut is None else _conv_cost(block.nin_shortcut)
    return positions * (_conv_cost(block.conv1) + _conv_cost(block.conv2) + shortcut)


def _level_stages(levels, positions: int) -> tuple[list[Stage], int]:
    """The stages of ``levels`` run in turn from ``positions`` input positions, and the positions after."""
    stages = []
    for level in levels:
        stages += [(block, _resnet_cost(block, positions)) for block in level.block]
        if level.resample:
            resample = getattr(level, level.resample)
            positions = positions * 4 if resample.up else positions // 4
            stages.append((resample, positions * _conv_cost(resample.conv)))
    return stages, positions


def _mid_stages(mid: nn.Sequential, positions: int) -> list[Stage]:
    """The mid block's resnet block, attention (four 1x1 convs, and scores and sum over every position
    pair) and resnet block."""
    attn = mid.attn_1
    attention = positions * (4 * _conv_cost(attn.q) + 2 * positions * attn.q.out_channels)
    return [(mid.block_1, _resnet_cost(mid.block_1, positions)), (attn, attention),
            (mid.block_2, _resnet_cost(mid.block_2, positions))]  # fmt: skip


def _mid_block(ch: int, groups: int) -> nn.Sequential:
    blocks = {"block_1": ResnetBlock(ch, ch, groups), "attn_1": AttnBlock(ch, groups)}
    return nn.Sequential(OrderedDict(blocks, block_2=ResnetBlock(ch, ch, groups)))


def _group_norm(ch: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(groups, ch, eps=1e-6, affine=True)
