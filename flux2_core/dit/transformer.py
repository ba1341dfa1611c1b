"""The FLUX.2 DiT (klein 4B / 9B / 9B-KV, and the dev 32B shape), with BFL checkpoint names.

Inputs of the entry points:
    x       [B, N, 128]   packed noisy latent tokens          x_ids   [N, 4]
    t       [B]           sigma in [0, 1] (1 = pure noise)
    ctx     [B, T, C]     text conditioning (C = 3 * text width)  ctx_ids [T, 4]
    ref     [B, R, 128]   reference tokens (editing)          ref_ids [R, 4]
    guidance [B]          the embedded guidance value (dev only)
Output: the velocity for the N noisy tokens, [B, N, 128]
(x_sigma = (1 - sigma) x0 + sigma noise, v = noise - x0).

``forward`` appends references after the noisy tokens ([x; ref]) with the same modulation: the plain klein
models. The KV checkpoint instead modulates references at t = 0 and lets them attend only to themselves, so
``encode_reference_kv`` computes their per-block K/V once, from the references alone, and
``forward_kv_cached`` runs text and noisy tokens against that cache at every step.

``ref_bias`` [R] (both entry points) is added to the attention logits of every query against each reference
key, in every block: log of each reference's strength (``reference_strength``). ``attn_mask`` (``forward``,
without references), an [L, L] tensor or an ``attention.GroupedMask``, masks the joint ``[text; image]``
sequence: the regional prompts' mask (``steering.regions``).

``comm`` (``layers.LOCAL`` in one process) splits the tokens among the processes of a sequence-parallel run
before the blocks and gathers the image tokens after them (``parallel``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ..configs import Flux2Config, Variant
from ..errors import STREAM_AND_COMPILE, Flux2Error
from ..hooks import weight_mover
from ..ops import Linear
from .attention import GroupedMask, attention_bias
from .extrapolation import KV_AND_EXTRAPOLATION
from .kv_cache import RefKVCache
from .layers import (
    LOCAL,
    DoubleStreamBlock,
    LastLayer,
    MLPEmbedder,
    Modulation,
    SingleStreamBlock,
    cached_key_bias,
    scratch_scope,
    timestep_embedding,
)
from .rope import cached_rotation

REGIONS_AND_REFERENCES = (
    "regional prompts and reference images cannot be combined: remove the references, or the regions (use "
    "one prompt)"
)
CONTROL_AND_PARALLEL = (
    "the Fun ControlNet runs in one process: its control blocks are not split across processes yet; run "
    "without --parallel (or use --offload stream for memory)"
)
REF_KV_TIMESTEP = 0.0  # the KV checkpoint modulates reference tokens as if they were clean (t = 0)


class DiT(nn.Module):
    """What every FLUX DiT of the pack shares around its own blocks: its compute dtype and device (those of
    ``img_in``), its blocks in run order (``double_blocks`` then ``single_blocks``: hooks, streaming,
    placement, compile) and a cached RoPE table."""

    def __init__(self):
        super().__init__()
        self._rope_cache: dict[tuple, torch.Tensor] = {}
        self.compute_dtype: torch.dtype | None = None  # set by the loader: quantised weights are not it

    @property
    def dtype(self) -> torch.dtype:
        return self.compute_dtype or self.img_in.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.img_in.weight.device

    def blocks(self) -> list[nn.Module]:
        """Every block in the order they run (for per-block hooks)."""
        return [*self.double_blocks, *self.single_blocks]

    def _rope(self, ids: torch.Tensor, device, num_text: int = 0, positions=None) -> torch.Tensor:
        """The rotation table of ``ids``; with ``positions`` (``extrapolation.Positions``) the image rows
        (after the first ``num_text``) extrapolated."""
        axes, theta = self.config.axes_dim, self.config.theta
        return cached_rotation(self._rope_cache, ids, axes, theta, device, num_text, positions)


class Flux2Transformer(DiT):
    comm = LOCAL

    def __init__(self, config: Flux2Config):
        super().__init__()
        self.config = config
        hidden, heads, mlp = config.hidden_size, config.num_heads, config.mlp_hidden_dim
        # 1. Input projections and the timestep (and, for dev, guidance) embedders
        self.img_in = Linear(config.in_channels, hidden, bias=False)
        self.txt_in = Linear(config.context_in_dim, hidden, bias=False)
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

    def forward(
        self,
        x,
        x_ids,
        t,
        ctx,
        ctx_ids,
        ref=None,
        ref_ids=None,
        guidance=None,
        step_cache=None,
        ref_bias=None,
        attn_mask=None,
        control=None,
        extrapolation=None,
    ):
        num_img = x.shape[1]
        positions = _positions(extrapolation, t, x_ids)
        bias = attn_mask
        if attn_mask is not None and ref is not None and ref.shape[1] > 0:
            raise Flux2Error(REGIONS_AND_REFERENCES)
        if ref is not None and ref.shape[1] > 0:
            x = torch.cat([x, ref.to(x.dtype).expand(x.shape[0], -1, -1)], dim=1)
            x_ids = torch.cat([x_ids, ref_ids])
            if ref_bias is not None:  # [text; image; references] keys: only the references' get a bias
                bias = torch.cat([ref_bias.new_zeros(ctx.shape[1] + num_img), ref_bias])
        if control is not None and self.comm is not LOCAL:
            raise Flux2Error(CONTROL_AND_PARALLEL)
        vec = self._vec(t, guidance, x.dtype)
        ids = torch.cat([ctx_ids, x_ids])
        hints = (control, control.padded(x.shape[1])) if control is not None and control.strength else None
        out = self._run_blocks(
            x, ctx, ids, self._mods(vec), step_cache=step_cache, attn_bias=bias, hints=hints,
            positions=positions,
        )  # fmt: skip
        return self.final_layer(out[:, :num_img], vec)

    @torch.inference_mode()
    def encode_reference_kv(self, ref, ref_ids, guidance=None) -> RefKVCache:
        """The KV checkpoint's reference K/V of every block, from the references alone at t = 0.

        ``ref`` is [1, R, C] when every batch item shares the references (the cache then keeps one copy and
        serves any batch size) or [B, R, C].
        """
        batch = ref.shape[0]
        cache = RefKVCache(len(self.double_blocks), len(self.single_blocks), batch_shared=batch == 1)
        t = torch.full((batch,), REF_KV_TIMESTEP, dtype=torch.float32, device=ref.device)
        vec = self._vec(t, guidance, self.dtype)
        no_text = torch.zeros(batch, 0, self.config.context_in_dim, dtype=self.dtype, device=ref.device)
        self._run_blocks(ref.to(self.dtype), no_text, ref_ids, self._mods(vec), cache=cache)
        return cache

    def forward_kv_cached(
        self, x, x_ids, t, ctx, ctx_ids, cache: RefKVCache, guidance=None, step_cache=None, ref_bias=None,
        extrapolation=None,
    ):  # fmt: skip
        """Text and noisy tokens attend to themselves and to the cached reference K/V."""
        if _positions(extrapolation, t, x_ids) is not None:
            raise Flux2Error(KV_AND_EXTRAPOLATION)
        if not cache.filled:
            cache.double[0].get(x.shape[0])  # raises the clear "cache is empty" error
        vec = self._vec(t, guidance, x.dtype)
        ids = torch.cat([ctx_ids, x_ids])
        out = self._run_blocks(
            x, ctx, ids, self._mods(vec), cache=cache, step_cache=step_cache, cached_bias=ref_bias
        )
        return self.final_layer(out, vec)

    def _vec(self, t: torch.Tensor, guidance: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
        vec = self.time_in(timestep_embedding(t).to(dtype))
        if self.config.guidance_embed:
            if guidance is None:
                raise Flux2Error(
                    "this model embeds the guidance value (FLUX.2 [dev]): give a guidance value (about 4)"
                )
            # 1000 * g is formed in the compute dtype, as BFL and diffusers do (g = 2.5: 2496 in bfloat16)
            scaled = guidance.to(t.device, dtype) * 1000
            vec = vec + self.guidance_in(timestep_embedding(scaled, factor=1.0).to(dtype))
        return vec

    def _mods(self, vec: torch.Tensor):
        return (
            self.double_stream_modulation_img(vec),
            self.double_stream_modulation_txt(vec),
            self.single_stream_modulation(vec)[0],
        )

    def _run_blocks(self, img, ctx, ids, mods, **kwargs):
        with scratch_scope(img.device, self.dtype):
            return self._blocks(img, ctx, ids, mods, **kwargs)

    def _blocks(
        self, img, ctx, ids, mods, cache: RefKVCache | None = None, step_cache=None, attn_bias=None,
        cached_bias=None, hints=None, positions=None,
    ):  # fmt: skip
        """Double blocks on (img, txt), then single blocks on [txt; img]; returns the image part.
        ``step_cache`` (a ``step_cache.FirstBlockCache``) may end the step after the first block;
        ``attn_bias`` ([L] over the keys in ``[text; image]`` order, an [L, L] mask or a ``GroupedMask``) or
        ``cached_bias`` ([R] over the KV model's cached reference keys) goes to every attention. ``hints``
        (a ``control.Control`` and its context over the image tokens) adds the control net's hints after its
        double blocks, before the step cache looks at the first block's output (a controlled step is
        compared with controlled steps). ``positions`` (``extrapolation.Positions``) extrapolates the image
        tokens' RoPE."""
        img_mod, txt_mod, single_mod = mods
        tokens = ctx.shape[1] + img.shape[1]
        ctx, img, ids = self.comm.split_tokens(ctx, img, ids)
        attn_bias = self._attention_bias(attn_bias, cached_bias, ctx.shape[1], tokens, img.dtype)
        pe = self._rope(ids, img.device, ctx.shape[1], positions)
        img = self.img_in(img)
        txt = self.txt_in(ctx.to(img.dtype))
        added = {}
        if hints is not None:
            control, context = hints
            steer = control.net.hints(context, img, txt, img_mod, txt_mod, pe, attn_bias=attn_bias)
            added = {layer: (hint, control.strength) for layer, hint in zip(control.net.layers, steer)}
        for i, block in enumerate(self.double_blocks):
            kv = cache.double[i] if cache is not None else None
            before = img
            img, txt = block(img, txt, img_mod, txt_mod, pe, kv=kv, attn_bias=attn_bias)
            if i in added:
                hint, strength = added.pop(i)
                img = img + hint.to(img.device) * strength
            img, txt = _fp16_safe(img), _fp16_safe(txt)
            if i == 0 and step_cache is not None:
                cached = step_cache.skip(before, img, self.comm)
                if cached is not None:
                    return self.comm.gather_tokens(_fp16_safe(cached))
        num_txt = txt.shape[1]
        h = torch.cat([txt, img], dim=1)
        for i, block in enumerate(self.single_blocks):
            kv = cache.single[i] if cache is not None else None
            h = _fp16_safe(block(h, single_mod, pe, num_txt=num_txt, kv=kv, attn_bias=attn_bias))
        out = h[:, num_txt:]
        if step_cache is not None:
            step_cache.ran_all(out)
        return self.comm.gather_tokens(out)

    def _attention_bias(self, values, cached, num_txt: int, tokens: int, dtype) -> torch.Tensor | None:
        """The bias of this call's attentions, built once for every block: ``values`` put in the order
        ``comm.to_heads`` gives the keys (a mask: its rows and columns alike), or ``cached`` spliced in after
        this process's ``num_txt`` text keys (of ``tokens`` in all); additive in ``dtype``, a mask as is."""
        if cached is not None:
            values = cached_key_bias(cached, num_txt, tokens + cached.shape[0])
        elif isinstance(values, GroupedMask):
            order = self.comm.arrange_keys(torch.arange(tokens, dtype=torch.float32)).long()
            return values.arranged(order).to(dtype=dtype)
        elif values is not None and values.ndim == 1:
            values = self.comm.arrange_keys(values)
        elif values is not None:
            order = self.comm.arrange_keys(torch.arange(values.shape[0], dtype=torch.float32))
            order = order.long().to(values.device)
            values = values.index_select(0, order).index_select(1, order)
        if values is None:
            return None
        return attention_bias(values if values.dtype == torch.bool else values.to(dtype))


@dataclass
class Flux2Model:
    """A loaded DiT with what was learned about it: its variant, the name of its shape, and the LoRAs to
    apply (at compute time, while it samples) on top of its weights."""

    transformer: Flux2Transformer
    variant: Variant
    name: str  # e.g. "klein 9B"
    loras: tuple = ()  # lora.Lora objects, applied in order

    def with_lora(self, lora) -> Flux2Model:
        """The same model (its weights shared, never copied) with ``lora`` added after the others."""
        return replace(self, loras=(*self.loras, lora))

    @property
    def config(self) -> Flux2Config:
        return self.transformer.config


def compile_blocks(net: Flux2Transformer) -> None:
    """Compile every block with ``torch.compile`` (in place): the first step of each new size pays the
    compilation, later steps run the fused kernels. Needs a working compiler toolchain (Triton on a GPU, a C++
    compiler on the CPU)."""
    if weight_mover(net) is not None:  # streamed blocks: their weights change place between calls
        raise Flux2Error(STREAM_AND_COMPILE)
    for block in net.blocks():
        block.compile()


def _fp16_safe(x: torch.Tensor) -> torch.Tensor:
    """float16 overflows in the residual stream of large blocks: clip to its range (as diffusers does)."""
    return x.clip(-65504, 65504) if x.dtype == torch.float16 else x


def _positions(extrapolation, t: torch.Tensor, x_ids: torch.Tensor):
    """One call's ``extrapolation.Positions`` for the noisy tokens of ``x_ids`` at ``t`` (one sigma for the
    batch), or None when there is nothing to extrapolate."""
    if extrapolation is None:
        return None
    grid = (int(x_ids[:, 1].max()) + 1, int(x_ids[:, 2].max()) + 1)
    return extrapolation.at(float(t.reshape(-1)[0]), grid)
