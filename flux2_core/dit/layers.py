"""Building blocks of the FLUX.2 DiT. Attribute names are the BFL checkpoint keys.

Tensor layout inside attention: [B, heads, L, head_dim]. The joint sequence is [text, image] for
text-to-image, [text, image, references] for the plain klein models (references appended after the noisy
tokens), and [text, cached references, image] for the KV model, whose reference keys/values come from a
``RefKVLayer`` (see ``joint_attention``). Every linear layer is an ``ops.Linear``: blocks never know where
its weight comes from. Every block holds a ``comm`` (``LOCAL`` in one process): what it exchanges with the
other processes running the same model (``parallel``): the sums of partial outputs (tensor parallelism) and
the trade of sequence for heads around attention (Ulysses). Blocks see only their local heads and widths.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn

from ..ops import Linear
from .attention import sdpa
from .kv_cache import RefKVLayer
from .pointwise import (  # noqa: F401  (the blocks' elementwise steps, importable from here as before)
    FUSED_DTYPES,
    NORM_EPS,
    QKNorm,
    RMSNorm,
    SwiGLU,
    TanhGELU,
    gated,
    layer_norm,
    modulate,
    norm_rope,
    rope_table_if_fused,
    swiglu,
)
from .rope import apply_rope_
from .scratch import Scratch, run_mlp, scratch, scratch_scope  # noqa: F401


class LocalComm:
    """What a model running in one process exchanges with the others: nothing. ``parallel`` has the
    communicators of tensor and sequence parallelism, with the same methods."""

    def sum_partials(self, *parts: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The full outputs of row-parallel projections from this process's partial sums."""
        return parts

    def to_heads(self, q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, heads, local tokens, D] -> [B, local heads, all tokens, D] (Ulysses), before attention."""
        return q, k, v

    def to_tokens(self, out: torch.Tensor) -> torch.Tensor:
        """The inverse of ``to_heads``, after attention."""
        return out

    def split_tokens(self, txt, img, ids) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This process's text and image tokens (and their ids, ``[text ids; image ids]``)."""
        return txt, img, ids

    def gather_tokens(self, img: torch.Tensor) -> torch.Tensor:
        """Every image token, from this process's ``split_tokens`` share."""
        return img

    def arrange_keys(self, values: torch.Tensor) -> torch.Tensor:
        """A value per token [L] in ``[text; image]`` order -> the order of the keys attention sees after
        ``to_heads`` (per-key attention bias travels with its keys)."""
        return values

    def sum_image_tokens(self, stats: torch.Tensor) -> torch.Tensor:
        """[K, B, local image tokens] per-token statistics -> [K] sums over every real image token of every
        process (the same numbers on all of them)."""
        return stats.flatten(1).sum(1)


LOCAL = LocalComm()


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

    def qkv_heads(self, x: torch.Tensor, table=None, buffered: bool = False) -> tuple[torch.Tensor, ...]:
        """q, k and v [B, heads, L, head_dim] (q and k rotated by ``table`` when given); the projection in
        the scratch buffer when ``buffered`` and one is open (v is then a view of it: copy it before the
        buffer is taken again)."""
        buffers = scratch() if buffered else None
        out = None if buffers is None else buffers.take((*x.shape[:-1], self.qkv.out_features), x)
        return split_qkv(self.qkv(x, out=out), self.num_heads, self.norm, table)


def split_qkv(qkv: torch.Tensor, num_heads: int, norm: QKNorm, table=None) -> tuple[torch.Tensor, ...]:
    """[B, L, 3 * H] -> normalised q, k and v, each [B, heads, L, head_dim]; with ``table`` (a RoPE
    rotation table of these L tokens) q and k also rotated, in one pass (``norm_rope``)."""
    q, k, v = rearrange(qkv, "B L (K H D) -> K B H L D", K=3, H=num_heads)
    if table is not None:
        return norm_rope(q, norm.query_norm, table), norm_rope(k, norm.key_norm, table), v
    return norm.query_norm(q).to(v.dtype), norm.key_norm(k).to(v.dtype), v


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


def joint_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    pe: torch.Tensor,
    num_txt: int = 0,
    kv: RefKVLayer | None = None,
    comm: LocalComm = LOCAL,
    attn_bias: torch.Tensor | None = None,
    rotated: bool = False,
) -> torch.Tensor:
    """Attention over the joint sequence after RoPE (``rotated``: q and k come rotated already);
    returns [B, L, heads * head_dim].

    - ``kv`` filled: the stored reference K/V are spliced in after the ``num_txt`` text keys.
    - ``kv`` empty: the sequence is the references alone (``encode_reference_kv``); their K/V are stored.
    - ``attn_bias``: added to the logits (``attention.attention_bias``: reference strengths, regional
      prompts), over the keys in the order they are in here (the cached references' after the text).

    Under sequence parallelism ``comm`` gathers every token of this process's heads after RoPE (the K/V
    cache then holds those heads for every reference token) and scatters the result back.
    """
    if not rotated:
        q, k = apply_rope_(q, pe), apply_rope_(k, pe)  # q and k are this call's own: rotated in place
    q, k, v = comm.to_heads(q, k, v)
    if kv is not None and kv.filled:
        k_ref, v_ref = kv.get(q.shape[0])
        k = torch.cat([k[:, :, :num_txt], k_ref, k[:, :, num_txt:]], dim=2)
        v = torch.cat([v[:, :, :num_txt], v_ref, v[:, :, num_txt:]], dim=2)
    elif kv is not None:
        kv.store(k, v)
    bias = None if attn_bias is None else attn_bias.to(q.device)  # a block split: the block's own device
    return rearrange(comm.to_tokens(sdpa(q, k, v, bias)), "B H L D -> B L (H D)")


def cached_key_bias(cached: torch.Tensor, num_txt: int, num_keys: int) -> torch.Tensor:
    """A bias [R] over the KV model's cached reference keys as a bias over all ``num_keys`` keys of a call,
    ``[text (num_txt); cached references; the rest]`` (``joint_attention``'s order), 0 on the call's own."""
    zeros = cached.new_zeros
    return torch.cat([zeros(num_txt), cached, zeros(num_keys - num_txt - cached.shape[0])])


class DoubleStreamBlock(nn.Module):
    """Text and image keep separate weights and attend jointly. ``act`` and ``bias``: SwiGLU without biases
    (FLUX.2), tanh GELU with biases (FLUX.1)."""

    comm = LOCAL

    def __init__(self, hidden: int, num_heads: int, mlp_hidden: int, act=SwiGLU, bias: bool = False):
        super().__init__()
        self.img_attn = SelfAttention(hidden, num_heads, bias)
        self.img_mlp = mlp(hidden, mlp_hidden, act(), bias)
        self.txt_attn = SelfAttention(hidden, num_heads, bias)
        self.txt_mlp = mlp(hidden, mlp_hidden, act(), bias)

    def forward(self, img, txt, mod_img, mod_txt, pe, kv=None, attn_bias=None):
        (img_sh1, img_sc1, img_g1), (img_sh2, img_sc2, img_g2) = mod_img
        (txt_sh1, txt_sc1, txt_g1), (txt_sh2, txt_sc2, txt_g2) = mod_txt
        table = rope_table_if_fused(img, pe)
        q, k, v = self._joint_qkv(modulate(img, img_sh1, img_sc1), modulate(txt, txt_sh1, txt_sc1), table)
        attn = joint_attention(
            q, k, v, pe, num_txt=txt.shape[1], kv=kv, comm=self.comm, attn_bias=attn_bias,
            rotated=table is not None,
        )  # fmt: skip
        del q, k, v
        txt_attn, img_attn = attn[:, : txt.shape[1]], attn[:, txt.shape[1] :]
        img_out, txt_out = self.comm.sum_partials(self.img_attn.proj(img_attn), self.txt_attn.proj(txt_attn))
        img, txt = gated(img, img_g1, img_out), gated(txt, txt_g1, txt_out)
        img_out, txt_out = self.comm.sum_partials(
            run_mlp(self.img_mlp, modulate(img, img_sh2, img_sc2), buffered=True),
            run_mlp(self.txt_mlp, modulate(txt, txt_sh2, txt_sc2), buffered=False),
        )
        return gated(img, img_g2, img_out), gated(txt, txt_g2, txt_out)

    def _joint_qkv(self, img: torch.Tensor, txt: torch.Tensor, table=None) -> list[torch.Tensor]:
        """q, k and v of the joint sequence [text; image], each [B, heads, L, D] (q and k rotated when
        ``table``, the joint sequence's, is given). Each stream's copy is dropped as soon as its joint
        tensor exists, so at most one of them is held twice."""
        num_txt = txt.shape[1]
        img_table, txt_table = (None, None) if table is None else (table[num_txt:], table[:num_txt])
        img_qkv = list(self.img_attn.qkv_heads(img, img_table, buffered=True))
        txt_qkv = list(self.txt_attn.qkv_heads(txt, txt_table))  # the text's is small: allocated
        return [torch.cat([txt_qkv.pop(0), img_qkv.pop(0)], dim=2) for _ in range(3)]


class SingleStreamBlock(nn.Module):
    """Parallel attention + MLP on the joint sequence, with fused input and output projections. ``linear1``'s
    rows are [q|k|v|gate|up] with FLUX.2's SwiGLU, [q|k|v|mlp] with FLUX.1's tanh GELU (and biases).
    ``hidden`` and ``mlp_rows`` are the widths of the attention and MLP parts this process holds."""

    comm = LOCAL

    def __init__(self, hidden: int, num_heads: int, mlp_hidden: int, act=SwiGLU, bias: bool = False):
        super().__init__()
        self.num_heads = num_heads
        self.hidden = hidden
        self.act = act()
        self.mlp_rows = self.act.inputs_per_output * mlp_hidden
        self.linear1 = Linear(hidden, 3 * hidden + self.mlp_rows, bias=bias)
        self.linear2 = Linear(hidden + mlp_hidden, hidden, bias=bias)
        self.norm = QKNorm(hidden // num_heads)

    def forward(self, x, mod, pe, num_txt, kv=None, attn_bias=None):
        buffers = scratch()
        if buffers is not None:
            return self._forward_in_scratch(x, mod, pe, num_txt, kv, attn_bias, buffers)
        shift, scale, gate = mod
        qkv, mlp = self.linear1(modulate(x, shift, scale)).split([3 * self.hidden, self.mlp_rows], -1)
        # The activation first, then v's own copy (q and k are the norms' outputs): linear1's fused output,
        # mostly the MLP's input rows, is freed before attention rather than held through the block.
        mlp = self.act(mlp)
        table = rope_table_if_fused(x, pe)
        q, k, v = split_qkv(qkv, self.num_heads, self.norm, table)
        v = v.contiguous()
        del qkv
        attn = joint_attention(
            q, k, v, pe, num_txt=num_txt, kv=kv, comm=self.comm, attn_bias=attn_bias,
            rotated=table is not None,
        )  # fmt: skip
        del q, k, v
        (out,) = self.comm.sum_partials(self.linear2(torch.cat([attn, mlp], dim=-1)))
        return gated(x, gate, out)

    def _forward_in_scratch(self, x, mod, pe, num_txt, kv, attn_bias, buffers: Scratch) -> torch.Tensor:
        """``forward`` in one scratch buffer, linear1's output ``[q | k | v | MLP input]`` per token: the MLP
        activation is written over the start of the MLP input, the normalised and rotated queries over the
        raw ones, attention's output over v (copied out first), so that ``[attention | activation]``,
        linear2's input, lies in the buffer already (no concatenation). Keys and values get their own
        copies (the attention kernels read them fastest contiguous)."""
        shift, scale, gate = mod
        h, m = self.hidden, self.mlp_rows // self.act.inputs_per_output
        rows = buffers.take((*x.shape[:-1], self.linear1.out_features), x)
        fused = self.linear1(modulate(x, shift, scale), out=rows)
        mlp = fused[..., 3 * h :]
        self.act(mlp, out=mlp[..., :m])
        q, k, v = (
            fused[..., i * h : (i + 1) * h].unflatten(-1, (self.num_heads, -1)).transpose(1, 2)
            for i in range(3)
        )
        norm_rope(q, self.norm.query_norm, pe, out=q)
        k, v = norm_rope(k, self.norm.key_norm, pe), v.contiguous()
        attn = joint_attention(
            q, k, v, pe, num_txt=num_txt, kv=kv, comm=self.comm, attn_bias=attn_bias, rotated=True
        )
        del q, k, v
        fused[..., 2 * h : 3 * h].copy_(attn)
        del attn
        (out,) = self.comm.sum_partials(self.linear2(fused[..., 2 * h : 3 * h + m]))
        return gated(x, gate, out)


class LastLayer(nn.Module):
    def __init__(self, hidden: int, out_channels: int, bias: bool = False):
        super().__init__()
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), Linear(hidden, 2 * hidden, bias=bias))
        self.linear = Linear(hidden, out_channels, bias=bias)

    def forward(self, x: torch.Tensor, vec: torch.Tensor) -> torch.Tensor:
        shift, scale = self.adaLN_modulation(vec)[:, None, :].chunk(2, dim=-1)  # (shift, scale) in BFL files
        return self.linear(modulate(x, shift, scale))
