"""The FLUX.2 DiT (klein 4B / 9B / 9B-KV, and the dev 32B shape), with BFL checkpoint names.

Inputs, shared by the three entry points:
    x       [B, N, 128]   packed noisy latent tokens          x_ids   [N, 4]
    t       [B]           sigma in [0, 1] (1 = pure noise)
    ctx     [B, T, C]     text conditioning (C = 3 * text width)  ctx_ids [T, 4]
    ref     [B, R, 128]   reference tokens (editing)          ref_ids [R, 4]
Output: the velocity for the N noisy tokens, [B, N, 128]
(x_sigma = (1 - sigma) x0 + sigma noise, v = noise - x0).

``forward`` appends references after the noisy tokens ([x; ref]) with the same modulation: the plain
klein models.
``forward_kv_extract`` / ``forward_kv_cached`` are the KV checkpoint's two modes (see kv_cache.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .configs import Flux2Config
from .kv_cache import RefKVCache
from .layers import (
    DoubleStreamBlock,
    LastLayer,
    MLPEmbedder,
    Modulation,
    SingleStreamBlock,
    timestep_embedding,
)
from .rope import rope_table

REF_KV_TIMESTEP = 0.0  # the KV checkpoint modulates reference tokens as if they were clean (t = 0)


class Flux2Transformer(nn.Module):
    def __init__(self, config: Flux2Config):
        super().__init__()
        self.config = config
        hidden, heads, mlp = config.hidden_size, config.num_heads, config.mlp_hidden_dim
        # 1. Input projections and the timestep (and, for dev, guidance) embedders
        self.img_in = nn.Linear(config.in_channels, hidden, bias=False)
        self.txt_in = nn.Linear(config.context_in_dim, hidden, bias=False)
        self.time_in = MLPEmbedder(256, hidden)
        if config.guidance_embed:
            self.guidance_in = MLPEmbedder(256, hidden)
        # 2. Global modulation, computed once per forward and shared by all blocks of a kind
        self.double_stream_modulation_img = Modulation(hidden, double=True)
        self.double_stream_modulation_txt = Modulation(hidden, double=True)
        self.single_stream_modulation = Modulation(hidden, double=False)
        # 3. Blocks and output layer
        self.double_blocks = nn.ModuleList(DoubleStreamBlock(hidden, heads, mlp) for _ in range(config.depth))
        self.single_blocks = nn.ModuleList(
            SingleStreamBlock(hidden, heads, mlp) for _ in range(config.depth_single_blocks)
        )
        self.final_layer = LastLayer(hidden, config.in_channels)
        self.on_block: Callable[[], None] | None = None  # called before each block (interruption)
        self._rope_cache: dict[tuple, torch.Tensor] = {}

    @property
    def dtype(self) -> torch.dtype:
        return self.img_in.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.img_in.weight.device

    def forward(self, x, x_ids, t, ctx, ctx_ids, ref=None, ref_ids=None, guidance=None):
        num_img = x.shape[1]
        if ref is not None and ref.shape[1] > 0:
            x = torch.cat([x, ref.to(x.dtype).expand(x.shape[0], -1, -1)], dim=1)
            x_ids = torch.cat([x_ids, ref_ids])
        vec = self._vec(t, guidance, x.dtype)
        mods = (
            self.double_stream_modulation_img(vec),
            self.double_stream_modulation_txt(vec),
            self.single_stream_modulation(vec)[0],
        )
        out = self._run_blocks(x, ctx, torch.cat([ctx_ids, x_ids]), mods)
        return self.final_layer(out[:, :num_img], vec)

    def forward_kv_extract(self, x, x_ids, t, ctx, ctx_ids, ref, ref_ids, guidance=None):
        """First KV step: references modulated at t = 0, attending only to themselves; fills a new cache.

        ``ref`` is [1, R, C] when every batch item shares the references (the cache then keeps one copy) or
        [B, R, C].
        """
        num_ref = ref.shape[1]
        shared = ref.shape[0] == 1
        cache = RefKVCache(len(self.double_blocks), len(self.single_blocks), batch_shared=shared)
        cache.num_ref_tokens = num_ref
        vec = self._vec(t, guidance, x.dtype)
        ref_vec = self._vec(torch.full_like(t, REF_KV_TIMESTEP), guidance, x.dtype)
        num_txt = ctx.shape[1]
        img_mod = _per_token(
            self.double_stream_modulation_img(ref_vec),
            self.double_stream_modulation_img(vec),
            num_ref,
            x.shape[1],
        )
        txt_mod = self.double_stream_modulation_txt(vec)
        single = self.single_stream_modulation(vec)[0]
        single_ref = self.single_stream_modulation(ref_vec)[0]
        single_mod = tuple(  # [txt: vec | ref: ref_vec | img: vec]
            torch.cat(
                [m.expand(-1, num_txt, -1), r.expand(-1, num_ref, -1), m.expand(-1, x.shape[1], -1)], dim=1
            )
            for m, r in zip(single, single_ref)
        )
        stream = torch.cat([ref.to(x.dtype).expand(x.shape[0], -1, -1), x], dim=1)
        ids = torch.cat([ctx_ids, ref_ids, x_ids])
        out = self._run_blocks(stream, ctx, ids, (img_mod, txt_mod, single_mod), num_ref=num_ref, cache=cache)
        return self.final_layer(out[:, num_ref:], vec), cache

    def forward_kv_cached(self, x, x_ids, t, ctx, ctx_ids, cache: RefKVCache, guidance=None):
        """Later KV steps: only text and noisy tokens run; the cached reference K/V are spliced in."""
        if not cache.filled:
            cache.double[0].get(x.shape[0])  # raises the clear "cache is empty" error
        vec = self._vec(t, guidance, x.dtype)
        mods = (
            self.double_stream_modulation_img(vec),
            self.double_stream_modulation_txt(vec),
            self.single_stream_modulation(vec)[0],
        )
        out = self._run_blocks(x, ctx, torch.cat([ctx_ids, x_ids]), mods, cache=cache)
        return self.final_layer(out, vec)

    def _vec(self, t: torch.Tensor, guidance: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        vec = self.time_in(timestep_embedding(t).to(dtype))
        if self.config.guidance_embed:
            if guidance is None:
                guidance = torch.full_like(t, 4.0)
            vec = vec + self.guidance_in(timestep_embedding(guidance).to(dtype))
        return vec

    def _run_blocks(self, img, ctx, ids, mods, num_ref=0, cache: RefKVCache | None = None):
        """Double blocks on (img, txt), then single blocks on [txt; img]; returns the image part."""
        img_mod, txt_mod, single_mod = mods
        pe = self._rope(ids, img.device)
        img = self.img_in(img)
        txt = self.txt_in(ctx.to(img.dtype))
        for i, block in enumerate(self.double_blocks):
            if self.on_block is not None:
                self.on_block()
            kv = cache.double[i] if cache is not None else None
            img, txt = block(img, txt, img_mod, txt_mod, pe, num_ref=num_ref, kv=kv)
            img, txt = _fp16_safe(img), _fp16_safe(txt)
        num_txt = txt.shape[1]
        h = torch.cat([txt, img], dim=1)
        for i, block in enumerate(self.single_blocks):
            if self.on_block is not None:
                self.on_block()
            kv = cache.single[i] if cache is not None else None
            h = _fp16_safe(block(h, single_mod, pe, num_txt=num_txt, num_ref=num_ref, kv=kv))
        return h[:, num_txt:]

    def _rope(self, ids: torch.Tensor, device: torch.device) -> torch.Tensor:
        """RoPE table for ``ids`` on ``device``, kept for the last few id layouts (they repeat every step)."""
        key = (ids.cpu().numpy().tobytes(), tuple(ids.shape), str(device))
        if key not in self._rope_cache:
            if len(self._rope_cache) >= 4:
                self._rope_cache.clear()
            self._rope_cache[key] = rope_table(ids, self.config.axes_dim, self.config.theta).to(device)
        return self._rope_cache[key]


def _per_token(ref_mod, img_mod, num_ref: int, num_img: int):
    """Modulation sets for an image stream laid out [ref; img]: each [B, 1, H] becomes [B, R + N, H]."""
    return tuple(
        tuple(
            torch.cat([r.expand(-1, num_ref, -1), m.expand(-1, num_img, -1)], dim=1) for r, m in zip(rs, ms)
        )
        for rs, ms in zip(ref_mod, img_mod)
    )


def _fp16_safe(x: torch.Tensor) -> torch.Tensor:
    """float16 overflows in the residual stream of large blocks: clip to its range (as diffusers does)."""
    return x.clip(-65504, 65504) if x.dtype == torch.float16 else x
