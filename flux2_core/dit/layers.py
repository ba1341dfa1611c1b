"""Building blocks of the FLUX.2 DiT. Attribute names are the BFL checkpoint keys.

Each block's ``forward`` is the math of BFL's ``model.py`` and diffusers' ``Flux2TransformerBlock``:
modulation, attention over the joint sequence, the MLP, gated residuals. The steps go through the call's
ops (``block_ops``: the reference PyTorch ops, or the fused forms a CPU runs below float32), and attention
through the call's ``BlockCall``, which holds what every block of one call shares: the RoPE table, the bias
of the logits, the text length, and the exchange of a sequence-parallel run. Every linear layer is an
``ops.Linear``: blocks never know where its weight comes from.

Tensor layout inside attention: [B, heads, L, head_dim]. The joint sequence is [text, image] for
text-to-image, [text, image, references] for the plain klein models (references appended after the noisy
tokens), and [text, cached references, image] for the KV model, whose reference keys/values come from a
``RefKVLayer``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ..ops import Linear
from .attention import GroupedMask
from .block_ops import PLAIN, PlainOps
from .kv_cache import RefKVLayer
from .pointwise import QKNorm, SwiGLU


@dataclass(frozen=True, eq=False)
class BlockCall:
    """What every block of one DiT call shares: its ``ops``, the RoPE table ``pe`` of the call's tokens
    ([text; image] order), the bias of the attention logits (``attention.attention_bias`` over the keys, a
    mask, or a ``GroupedMask``), the number of text tokens (the KV model's cached references go after them),
    and ``exchange``: the communicator of a sequence-parallel run (``devices.parallel.SequenceComm``), None in
    one process."""

    ops: PlainOps
    pe: torch.Tensor
    bias: torch.Tensor | GroupedMask | None = None
    num_txt: int = 0
    exchange: object | None = None

    def attention(self, q, k, v, kv: RefKVLayer | None = None) -> torch.Tensor:
        """Attention of the joint sequence's rotated q, k, v [B, heads, L, D] -> [B, L, heads * D].

        - ``kv`` filled: the stored reference K/V are spliced in after the ``num_txt`` text keys.
        - ``kv`` empty: the sequence is the references alone (``encode_reference_kv``); their K/V are stored.

        Under sequence parallelism every token of this process's heads is gathered first (the K/V cache then
        holds those heads for every reference token) and the result is scattered back.
        """
        if self.exchange is not None:
            q, k, v = self.exchange.to_heads(q, k, v)
        if kv is not None and kv.filled:
            k_ref, v_ref = kv.get(q.shape[0])
            k = torch.cat([k[:, :, : self.num_txt], k_ref, k[:, :, self.num_txt :]], dim=2)
            v = torch.cat([v[:, :, : self.num_txt], v_ref, v[:, :, self.num_txt :]], dim=2)
        elif kv is not None:
            kv.store(k, v)
        out = self.ops.attention(q, k, v, self.bias)
        if self.exchange is not None:
            out = self.exchange.to_tokens(out)
        return rearrange(out, "B H L D -> B L (H D)")

    def moved_to(self, device: torch.device) -> BlockCall:
        """The same call with its table and bias on ``device`` (a block placed on another device)."""
        if self.pe.device == device:
            return self
        bias = None if self.bias is None else self.bias.to(device)
        return replace(self, pe=self.pe.to(device), bias=bias)


def timestep_embedding(
    t: torch.Tensor, dim: int = 256, max_period: float = 10000.0, factor: float = 1000.0
) -> torch.Tensor:
    """Sinusoidal embedding of ``factor * t`` (t in [0, 1]), cos first: [B, dim], float32."""
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device) / half)
    args = (factor * t.float())[:, None] * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def mlp(hidden: int, mlp_hidden: int, act: nn.Module, bias: bool = False) -> nn.Sequential:
    """``{0: in, 1: act, 2: out}``, the checkpoint layout of every FLUX MLP."""
    rows = act.inputs_per_output * mlp_hidden
    return nn.Sequential(Linear(hidden, rows, bias=bias), act, Linear(mlp_hidden, hidden, bias=bias))


class MLPEmbedder(nn.Module):
    def __init__(self, in_dim: int, hidden: int, bias: bool = False):
        super().__init__()
        self.in_layer = Linear(in_dim, hidden, bias=bias)
        self.out_layer = Linear(hidden, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out_layer(F.silu(self.in_layer(x)))


class SelfAttention(nn.Module):
    """Holds qkv / norm / proj so their keys match the checkpoint; the blocks drive the attention."""

    def __init__(self, dim: int, num_heads: int, bias: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = Linear(dim, 3 * dim, bias=bias)
        self.norm = QKNorm(dim // num_heads)
        self.proj = Linear(dim, dim, bias=bias)


def heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[B, L, heads * D] -> [B, heads, L, D] (a view)."""
    return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)


def qkv_heads(qkv: torch.Tensor, num_heads: int) -> tuple[torch.Tensor, ...]:
    """[B, L, 3 * H] -> q, k and v [B, heads, L, head_dim] (views)."""
    return tuple(rearrange(qkv, "B L (K H D) -> K B H L D", K=3, H=num_heads))


class Modulation(nn.Module):
    """One linear map of silu(vec) to (shift, scale, gate) sets: FLUX.2 shares one per block kind, FLUX.1 has
    one per block (with a bias)."""

    def __init__(self, dim: int, double: bool, bias: bool = False):
        super().__init__()
        self.multiplier = 6 if double else 3
        self.lin = Linear(dim, self.multiplier * dim, bias=bias)

    def forward(self, vec: torch.Tensor) -> tuple[tuple[torch.Tensor, ...], ...]:
        out = self.lin(F.silu(vec))[:, None, :].chunk(self.multiplier, dim=-1)  # each [B, 1, H]
        return tuple(tuple(out[i : i + 3]) for i in range(0, self.multiplier, 3))  # (shift, scale, gate) sets


class DoubleStreamBlock(nn.Module):
    """Text and image keep separate weights and attend jointly. ``act`` and ``bias``: SwiGLU without biases
    (FLUX.2), tanh GELU with biases (FLUX.1)."""

    def __init__(self, hidden: int, num_heads: int, mlp_hidden: int, act=SwiGLU, bias: bool = False):
        super().__init__()
        self.img_attn = SelfAttention(hidden, num_heads, bias)
        self.img_mlp = mlp(hidden, mlp_hidden, act(), bias)
        self.txt_attn = SelfAttention(hidden, num_heads, bias)
        self.txt_mlp = mlp(hidden, mlp_hidden, act(), bias)

    def forward(self, img, txt, mod_img, mod_txt, call: BlockCall, kv: RefKVLayer | None = None):
        (img_shift1, img_scale1, img_gate1), (img_shift2, img_scale2, img_gate2) = mod_img
        (txt_shift1, txt_scale1, txt_gate1), (txt_shift2, txt_scale2, txt_gate2) = mod_txt
        ops, num_txt = call.ops, txt.shape[1]
        # attention over [text; image]: each stream's own projection and q/k norms
        img_qkv = ops.project(self.img_attn.qkv, ops.modulate(img, img_shift1, img_scale1))
        txt_qkv = self.txt_attn.qkv(ops.modulate(txt, txt_shift1, txt_scale1))
        img_qkv = self._normed(img_qkv, self.img_attn, ops, call.pe[num_txt:])
        txt_qkv = self._normed(txt_qkv, self.txt_attn, ops, call.pe[:num_txt])
        attn = call.attention(*_joined(txt_qkv, img_qkv), kv)
        txt_attn, img_attn = attn[:, :num_txt], attn[:, num_txt:]
        img = ops.gated(img, img_gate1, self.img_attn.proj(img_attn))
        txt = ops.gated(txt, txt_gate1, self.txt_attn.proj(txt_attn))
        # the MLPs
        img = ops.gated(img, img_gate2, ops.mlp(self.img_mlp, ops.modulate(img, img_shift2, img_scale2)))
        txt = ops.gated(txt, txt_gate2, self.txt_mlp(ops.modulate(txt, txt_shift2, txt_scale2)))
        return img, txt

    @staticmethod
    def _normed(qkv: torch.Tensor, attn: SelfAttention, ops: PlainOps, table: torch.Tensor) -> list:
        q, k, v = qkv_heads(qkv, attn.num_heads)
        return [*ops.qk_norm_rope(q, k, attn.norm, table), v]


def _joined(txt_qkv: list, img_qkv: list) -> list[torch.Tensor]:
    """q, k and v of the joint sequence [text; image]: each stream's copy is dropped as soon as its joint
    tensor exists, so at most one of them is held twice."""
    return [torch.cat([txt_qkv.pop(0), img_qkv.pop(0)], dim=2) for _ in range(3)]


class SingleStreamBlock(nn.Module):
    """Parallel attention + MLP on the joint sequence, with fused input and output projections. ``linear1``'s
    rows are [q|k|v|gate|up] with FLUX.2's SwiGLU, [q|k|v|mlp] with FLUX.1's tanh GELU (and biases).
    ``hidden`` and ``mlp_rows`` are the widths of the attention and MLP parts this process holds."""

    def __init__(self, hidden: int, num_heads: int, mlp_hidden: int, act=SwiGLU, bias: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.hidden = hidden
        self.act = act()
        self.mlp_rows = self.act.inputs_per_output * mlp_hidden
        self.linear1 = Linear(hidden, 3 * hidden + self.mlp_rows, bias=bias)
        self.linear2 = Linear(hidden + mlp_hidden, hidden, bias=bias)
        self.norm = QKNorm(hidden // num_heads)

    def forward(self, x, mod, call: BlockCall, kv: RefKVLayer | None = None):
        shift, scale, gate = mod
        ops, h = call.ops, self.hidden
        fused = ops.project(self.linear1, ops.modulate(x, shift, scale))
        q, k, v, mlp = fused.split([h, h, h, self.mlp_rows], dim=-1)
        del fused  # the MLP rows go with the activation, not held through attention
        mlp = ops.activate(self.act, mlp)
        q, k = ops.qk_norm_rope(heads(q, self.num_heads), heads(k, self.num_heads), self.norm, call.pe)
        v = heads(v, self.num_heads).contiguous()  # its own copy: the kernels read it fastest contiguous
        attn = call.attention(q, k, v, kv)
        del q, k, v
        return ops.gated(x, gate, self.linear2(ops.join(attn, mlp)))


class LastLayer(nn.Module):
    def __init__(self, hidden: int, out_channels: int, bias: bool = False):
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), Linear(hidden, 2 * hidden, bias=bias))
        self.linear = Linear(hidden, out_channels, bias=bias)

    def forward(self, x: torch.Tensor, vec: torch.Tensor, ops: PlainOps = PLAIN) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(vec)[:, None, :].chunk(2, dim=-1)  # (shift, scale) in BFL files
        return self.linear(ops.modulate(x, shift, scale))
