"""The FLUX.2 DiT (klein 4B / 9B / 9B-KV, and the dev 32B shape), with BFL checkpoint names.

Its one entry point, ``forward(x, x_ids, t, ctx, extras)``:
    x       [B, N, 128]   packed noisy latent tokens          x_ids   [N, 4]
    t       [B]           sigma in [0, 1] (1 = pure noise)
    ctx     [B, T, C]     text conditioning (C = 3 * text width; its ids are ``rope.text_ids(T)``)
    extras  ``call.CallExtras``: references or the 9B-KV cache, their strengths' bias, the regional mask,
            the control net, extrapolated positions, the step cache, the embedded guidance (dev)
Output: the velocity for the N noisy tokens, [B, N, 128]
(x_sigma = (1 - sigma) x0 + sigma noise, v = noise - x0).

Plain klein models append references after the noisy tokens ([x; ref]) with the same modulation. The KV
checkpoint instead modulates references at t = 0 and lets them attend only to themselves, so
``encode_reference_kv`` computes their per-block K/V once, from the references alone, and ``forward`` with
``extras.kv_cache`` runs text and noisy tokens against that cache at every step.

``comm`` (``comm.LOCAL`` in one process) splits the tokens among the processes of a sequence-parallel run
before the blocks and gathers the image tokens after them (``devices.parallel``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ..configs import Flux2Config, Variant
from ..errors import STREAM_AND_COMPILE, Flux2Error
from ..hooks import weight_mover
from ..ops import Linear
from .attention import GroupedMask, KeyGroup, attention_bias
from .block_ops import ops_for
from .call import NO_EXTRAS, CallExtras, RegionalMask, check_extras
from .comm import LOCAL
from .kv_cache import RefKVCache
from .layers import (
    BlockCall,
    DoubleStreamBlock,
    LastLayer,
    MLPEmbedder,
    Modulation,
    SingleStreamBlock,
    timestep_embedding,
)
from .rope import RotationCache, text_ids

CONTROL_AND_PARALLEL = (
    "the Fun ControlNet runs in one process: its control blocks are not split across processes yet; run "
    "without --parallel (or use --offload stream for memory)"
)
REF_KV_TIMESTEP = 0.0  # the KV checkpoint modulates reference tokens as if they were clean (t = 0)


class DiT(nn.Module):
    """What every FLUX DiT of the pack shares around its own blocks: its compute dtype and device (those of
    ``img_in``), its blocks in run order (``double_blocks`` then ``single_blocks``: hooks, streaming,
    placement, compile), the RoPE tables of its calls, and the process's share of a parallel run
    (``comm``)."""

    comm = LOCAL

    def __init__(self):
        super().__init__()
        self.compute_dtype: torch.dtype | None = None  # set by the loader: quantised weights are not it
        self.rotations = RotationCache()

    @property
    def dtype(self) -> torch.dtype:
        return self.compute_dtype or self.img_in.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.img_in.weight.device

    def blocks(self) -> list[nn.Module]:
        """Every block in the order they run (for per-block hooks)."""
        return [*self.double_blocks, *self.single_blocks]

    def block_call(self, img, ids, num_txt: int, bias=None, positions=None) -> BlockCall:
        """The ``BlockCall`` of this call's ``img`` tokens (after ``num_txt`` text tokens, ``ids`` of both),
        ``bias`` as ``_attention_bias`` gives it, ``positions`` extrapolating the image rows' RoPE."""
        pe = self.rotations(ids, self.config.axes_dim, self.config.theta, img.device, num_txt, positions)
        exchange = self.comm if self.comm.exchanges_heads else None
        return BlockCall(ops_for(img.device, img.dtype), pe, bias, num_txt, exchange)


class Flux2Transformer(DiT):
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

    def forward(self, x, x_ids, t, ctx, extras: CallExtras = NO_EXTRAS):
        """The velocity of the noisy tokens ``x`` (see the module docstring)."""
        check_extras(extras)
        num_img = x.shape[1]
        if extras.kv_cache is not None and not extras.kv_cache.filled:
            extras.kv_cache.double[0].get(x.shape[0])  # raises the clear "cache is empty" error
        if extras.references is not None:
            ref, ref_ids = extras.references
            x = torch.cat([x, ref.to(x.dtype).expand(x.shape[0], -1, -1)], dim=1)
            x_ids = torch.cat([x_ids, ref_ids.to(x_ids.device)])
        vec = self._vec(t, extras.guidance, x.dtype)
        ids = torch.cat([text_ids(ctx.shape[1]).to(x_ids.device), x_ids])
        out = self._blocks(x, ctx, ids, vec, extras)
        return self.final_layer(out[:, :num_img], vec, ops_for(out.device, out.dtype))

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
        self._blocks(ref.to(self.dtype), no_text, ref_ids, vec, CallExtras(kv_cache=cache))
        return cache

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

    def _blocks(self, img, ctx, ids, vec, extras: CallExtras):
        """Double blocks on (img, txt), then single blocks on [txt; img] (``ids`` of both); returns the image
        stream (with the appended references). The step cache may end the step after the first block; the
        control net's hints are added after their double blocks, before the step cache looks at the first
        block's output (a controlled step is compared with controlled steps)."""
        img_mod = self.double_stream_modulation_img(vec)
        txt_mod = self.double_stream_modulation_txt(vec)
        single_mod = self.single_stream_modulation(vec)[0]
        control, step_cache, cache = extras.control, extras.step_cache, extras.kv_cache
        control = control if control is not None and control.strength else None
        if control is not None and self.comm is not LOCAL:
            raise Flux2Error(CONTROL_AND_PARALLEL)
        tokens = ctx.shape[1] + img.shape[1]
        context = None if control is None else control.padded(img.shape[1])
        ctx, img, ids = self.comm.split_tokens(ctx, img, ids)
        bias = self._attention_bias(extras, ctx.shape[1], tokens, img)
        call = self.block_call(img, ids, ctx.shape[1], bias, extras.positions)
        img = self.img_in(img)
        txt = self.txt_in(ctx.to(img.dtype))
        added = {}
        if control is not None:
            steer = control.net.hints(context, img, txt, img_mod, txt_mod, call)
            added = {layer: hint for layer, hint in zip(control.net.layers, steer)}
        for i, block in enumerate(self.double_blocks):
            before = img
            img, txt = block(img, txt, img_mod, txt_mod, call, None if cache is None else cache.double[i])
            if i in added:
                img = img + added.pop(i).to(img.device) * control.strength
            img, txt = _fp16_safe(img), _fp16_safe(txt)
            if i == 0 and step_cache is not None:
                cached = step_cache.skip(before, img, self.comm)
                if cached is not None:
                    return self.comm.gather_tokens(_fp16_safe(cached))
        h = torch.cat([txt, img], dim=1)
        for i, block in enumerate(self.single_blocks):
            h = _fp16_safe(block(h, single_mod, call, None if cache is None else cache.single[i]))
        out = h[:, txt.shape[1] :]
        if step_cache is not None:
            step_cache.ran_all(out)
        return self.comm.gather_tokens(out)

    def _attention_bias(self, extras: CallExtras, num_txt: int, tokens: int, like: torch.Tensor):
        """The bias of this call's attentions, built once for every block, over the keys in the order
        ``comm.to_heads`` gives them (``tokens`` in all, ``num_txt`` of them this process's text): the
        regional mask (its rows and columns alike), or the references' strengths (after the text and noisy
        tokens, or, for the KV model's cache, spliced in after the text); additive in ``like``'s dtype, on its
        device."""
        values = extras.regions
        referenced = extras.references is not None or extras.kv_cache is not None
        refs = extras.reference_bias if referenced else None
        if referenced and isinstance(values, RegionalMask):
            return self._regional_bias(extras, values, num_txt, tokens).to(like.device, like.dtype)
        if refs is not None and extras.kv_cache is not None:
            zeros = refs.new_zeros
            values = torch.cat([zeros(num_txt), refs, zeros(tokens - num_txt)])
        elif refs is not None:
            values = self.comm.arrange_keys(torch.cat([refs.new_zeros(tokens - refs.shape[0]), refs]))
        elif isinstance(values, GroupedMask):
            order = self.comm.arrange_keys(torch.arange(tokens, dtype=torch.float32)).long()
            return values.arranged(order).to(like.device, like.dtype)
        elif values is not None:
            order = self.comm.arrange_keys(torch.arange(values.shape[0], dtype=torch.float32))
            order = order.long().to(values.device)
            values = values.index_select(0, order).index_select(1, order)
        if values is None:
            return None
        values = values.to(like.device) if values.dtype == torch.bool else values.to(like.device, like.dtype)
        return attention_bias(values)

    def _regional_bias(self, extras: CallExtras, mask: RegionalMask, num_txt: int, tokens: int):
        """The regional mask of a call with references (``RegionalMask.with_references``), its queries and
        keys placed where attention sees them: the references after the image (plain klein: one sequence of
        ``tokens``, reordered as ``comm.arrange_keys`` orders its keys), or the 9B-KV model's cached keys
        spliced in after this process's ``num_txt`` text keys, its queries the ``tokens`` of text and
        image. A ``GroupedMask``."""
        cached = extras.kv_cache is not None
        count = extras.kv_cache.num_tokens if cached else extras.references[0].shape[1]
        whole = mask.with_references(count, extras.reference_bias, cached)
        order = self.comm.arrange_keys(torch.arange(tokens, dtype=torch.float32)).long()
        if not cached:
            return whole.arranged(order)
        place = torch.empty_like(order)
        place[order] = torch.arange(order.numel())  # each token's place among the gathered queries
        keys = torch.cat([place + count * (place >= num_txt), torch.arange(num_txt, num_txt + count)])
        groups = []
        for g in whole.groups:
            placed, turn = keys[g.keys].sort()  # ascending in their places, each with its bias
            bias = None if g.bias is None else g.bias[turn]
            groups.append(KeyGroup(place[g.queries], placed, bias))
        return GroupedMask(whole.length, tuple(groups))


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
