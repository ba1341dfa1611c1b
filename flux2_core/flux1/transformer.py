"""The FLUX.1 Fill [dev] DiT, with BFL checkpoint names (``Flux`` of BFL's ``model.py``).

Inputs of ``forward(x, x_ids, t, ctx, extras)``:
    x       [B, N, 384]  packed tokens: noisy latent (64) | masked-image latent (64) | mask (256)
    x_ids   [N, 3]       (0, row, col) per token          t        [B]  sigma in [0, 1] (1 = noise)
    ctx     [B, L, 4096] T5-XXL hidden states (their ids [L, 3] are all zeros)
    extras  ``dit.call.CallExtras``: ``pooled`` [B, 768] CLIP-L's pooled output, ``guidance`` [B] the
            embedded guidance (about 30), ``step_cache``
Output: the velocity of the noisy latent, [B, N, 64] (v = noise - x0).

Against FLUX.2 (``..transformer``): every block has its own modulation, every linear layer a bias, the MLPs
are tanh GELU with ratio 4, ``vec`` adds the guidance and the CLIP pooled vector to the timestep, and RoPE has
three axes (16, 56, 56) with theta 10000. The blocks are FLUX.2's, built with those options.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..dit import rope
from ..dit.call import NO_EXTRAS, CallExtras, check_extras
from ..dit.layers import (
    BlockCall,
    DoubleStreamBlock,
    LastLayer,
    MLPEmbedder,
    Modulation,
    SingleStreamBlock,
    timestep_embedding,
)
from ..dit.pointwise import TanhGELU
from ..dit.transformer import DiT
from ..errors import Flux2Error
from ..ops import Linear
from .config import Flux1Config


class Flux1DoubleBlock(DoubleStreamBlock):
    """FLUX.2's double block with FLUX.1's options, plus its own ``img_mod`` / ``txt_mod``."""

    def __init__(self, hidden: int, num_heads: int, mlp_hidden: int):
        super().__init__(hidden, num_heads, mlp_hidden, act=TanhGELU, bias=True)
        self.img_mod = Modulation(hidden, double=True, bias=True)
        self.txt_mod = Modulation(hidden, double=True, bias=True)

    def forward(self, img, txt, vec, call: BlockCall):
        return super().forward(img, txt, self.img_mod(vec), self.txt_mod(vec), call)


class Flux1SingleBlock(SingleStreamBlock):
    """FLUX.2's single block with FLUX.1's options, plus its own ``modulation``."""

    def __init__(self, hidden: int, num_heads: int, mlp_hidden: int):
        super().__init__(hidden, num_heads, mlp_hidden, act=TanhGELU, bias=True)
        self.modulation = Modulation(hidden, double=False, bias=True)

    def forward(self, x, vec, call: BlockCall):
        return super().forward(x, self.modulation(vec)[0], call)


class Flux1Transformer(DiT):
    def __init__(self, config: Flux1Config):
        super().__init__()
        self.config = config
        hidden, heads, mlp = config.hidden_size, config.num_heads, config.mlp_hidden_dim
        self.img_in = Linear(config.in_channels, hidden, bias=True)
        self.time_in = MLPEmbedder(256, hidden, bias=True)
        self.vector_in = MLPEmbedder(config.vec_in_dim, hidden, bias=True)
        if config.guidance_embed:
            self.guidance_in = MLPEmbedder(256, hidden, bias=True)
        self.txt_in = Linear(config.context_in_dim, hidden, bias=True)
        self.double_blocks = nn.ModuleList(Flux1DoubleBlock(hidden, heads, mlp) for _ in range(config.depth))
        self.single_blocks = nn.ModuleList(
            Flux1SingleBlock(hidden, heads, mlp) for _ in range(config.depth_single_blocks)
        )
        self.final_layer = LastLayer(hidden, config.out_channels, bias=True)

    def forward(self, x, x_ids, t, ctx, extras: CallExtras = NO_EXTRAS):
        check_extras(extras)
        dtype, guidance, step_cache = x.dtype, extras.guidance, extras.step_cache
        if extras.pooled is None:
            raise Flux2Error("FLUX.1 models take CLIP's pooled vector: give it (extras.pooled, [B, 768])")
        vec = self.time_in(timestep_embedding(t).to(dtype)) + self.vector_in(extras.pooled.to(dtype))
        if self.config.guidance_embed:
            if guidance is None:
                raise Flux2Error("FLUX.1 [dev] models embed a guidance value: give one (about 30 for Fill)")
            # 1000 * g is formed in the compute dtype, as BFL and diffusers do (g = 30: 29952 in bfloat16)
            scaled = guidance.to(x.device, dtype) * 1000
            vec = vec + self.guidance_in(timestep_embedding(scaled, factor=1.0).to(dtype))
        ids = torch.cat([text_ids(ctx.shape[1]).to(x_ids.device), x_ids])
        call = self.block_call(x, ids, ctx.shape[1])
        img, txt = self.img_in(x), self.txt_in(ctx.to(dtype))
        for i, block in enumerate(self.double_blocks):
            before = img
            img, txt = block(img, txt, vec, call)
            if i == 0 and step_cache is not None:  # First-Block Cache (dit/step_cache.py)
                cached = step_cache.skip(before, img, self.comm)
                if cached is not None:
                    return self.final_layer(cached, vec, call.ops)
        num_txt = txt.shape[1]
        h = torch.cat([txt, img], dim=1)
        for block in self.single_blocks:
            h = block(h, vec, call)
        if step_cache is not None:
            step_cache.ran_all(h[:, num_txt:])
        return self.final_layer(h[:, num_txt:], vec, call.ops)


@dataclass
class Flux1FillModel:
    """A loaded FLUX.1 Fill DiT and the name of its shape."""

    transformer: Flux1Transformer
    name: str  # "FLUX.1 Fill [dev]" or a description of another shape

    @property
    def config(self) -> Flux1Config:
        return self.transformer.config


def image_ids(height: int, width: int) -> torch.Tensor:
    """[height * width, 3]: (0, row, col) for a grid of ``height x width`` tokens, row-major (FLUX.2's ids
    without their fourth axis)."""
    return rope.image_ids(height, width)[:, :3]


def text_ids(length: int) -> torch.Tensor:
    """[length, 3] zeros: FLUX.1 gives every text token the same position."""
    return torch.zeros(length, 3, dtype=torch.int64)
