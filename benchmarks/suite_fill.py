"""FLUX.1 Fill [dev] in the suite: its three DiTs on one set of random weights, and one step of each.

A Fill step takes 384 channels a token (the noisy latent's 64, the masked image's 64 and the mask's 256),
T5 text (4096 wide), CLIP's pooled vector (768) and the embedded guidance (30, Fill's own value).
``Ours`` is our ``Flux1Transformer`` loaded from the BFL tensors, ``Diffusers`` is diffusers'
``FluxTransformer2DModel`` (the source of the weights), ``Native`` is native ComfyUI's ``Flux`` loaded by
``comfy.sd`` from the same BFL tensors and called on latents (96 channels in: 16 + 16 + 64; 16 out).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch
from suite_models import Case, random_fill_

from flux2_core.dit.call import call_extras
from flux2_core.flux1.config import FILL_CHANNELS, Flux1Config
from flux2_core.flux1.transformer import image_ids, text_ids

FILL_GUIDANCE = 30.0


@dataclass
class FillInputs:
    x: torch.Tensor  # [1, N, 384]
    ctx: torch.Tensor  # [1, T, 4096]
    y: torch.Tensor  # [1, 768]
    t: torch.Tensor
    guidance: torch.Tensor
    x_ids: torch.Tensor  # on the device (diffusers); ours takes them on the CPU (``our_x_ids``)
    ctx_ids: torch.Tensor  # diffusers' txt_ids (ours makes its text ids itself)
    grid: int

    @cached_property
    def our_x_ids(self) -> torch.Tensor:
        return self.x_ids.cpu()


def fill_cases(sizes: list[int]) -> list[Case]:
    return [Case(f"fill {s}²", s) for s in sizes]


def make_fill_inputs(case: Case, config: Flux1Config, device, dtype, seed: int = 0) -> FillInputs:
    g = torch.Generator().manual_seed(seed)
    grid = case.grid
    return FillInputs(
        torch.randn(1, grid * grid, FILL_CHANNELS, generator=g).to(device, dtype),
        torch.randn(1, case.text_tokens, config.context_in_dim, generator=g).to(device, dtype),
        torch.randn(1, config.vec_in_dim, generator=g).to(device, dtype),
        torch.tensor([0.7], device=device),
        torch.tensor([FILL_GUIDANCE], device=device),
        image_ids(grid, grid).to(device),
        text_ids(case.text_tokens).to(device),
        grid,
    )


def build_diffusers_fill(config: Flux1Config, device, dtype, seed: int = 0):
    """diffusers' FLUX.1 DiT of ``config``, built on the meta device and filled on ``device``."""
    from diffusers import FluxTransformer2DModel

    with torch.device("meta"):
        model = FluxTransformer2DModel(
            patch_size=1,
            in_channels=config.in_channels,
            out_channels=64,
            num_layers=config.depth,
            num_single_layers=config.depth_single_blocks,
            attention_head_dim=config.hidden_size // config.num_heads,
            num_attention_heads=config.num_heads,
            joint_attention_dim=config.context_in_dim,
            pooled_projection_dim=config.vec_in_dim,
            guidance_embeds=config.guidance_embed,
            axes_dims_rope=tuple(config.axes_dim),
        )
    model = model.to(dtype).to_empty(device=device)  # cast on meta: never materialised in float32
    random_fill_(model, seed)
    return model.eval().requires_grad_(False)


class FillOurs:
    name = "ours"
    has_kv = False

    def __init__(self, bfl: dict, device, dtype):
        from flux2_core.flux1.dit_files import FILL_SPEC
        from flux2_core.weights.checkpoint import Checkpoint
        from flux2_core.weights.loading import load_checkpoint

        self.net = load_checkpoint(FILL_SPEC, Checkpoint(Path("fill.safetensors"), bfl), dtype, device).module

    def step(self, case: Case, inp: FillInputs, step_cache=None):
        net, x_ids = self.net, inp.our_x_ids

        def run():
            extras = call_extras(pooled=inp.y, guidance=inp.guidance, step_cache=step_cache)
            return net(inp.x, x_ids, inp.t, inp.ctx, extras)

        return run


class FillDiffusers:
    name = "diffusers"
    has_kv = False

    def __init__(self, model):
        self.model = model

    def step(self, case: Case, inp: FillInputs):
        return lambda: self.model(
            hidden_states=inp.x,
            encoder_hidden_states=inp.ctx,
            pooled_projections=inp.y,
            timestep=inp.t,
            img_ids=inp.x_ids,
            txt_ids=inp.ctx_ids,
            guidance=inp.guidance,
            return_dict=False,
        )[0]


class FillNative:
    name = "native"
    has_kv = False

    def __init__(self, bfl: dict, device, dtype):
        import comfy.model_management as mm
        import comfy.sd

        self.patcher = comfy.sd.load_diffusion_model_state_dict(dict(bfl), model_options={"dtype": dtype})
        if torch.device(device).type == "cuda":
            mm.load_models_gpu([self.patcher], force_full_load=True)
        self.dm = self.patcher.model.diffusion_model

    def step(self, case: Case, inp: FillInputs):
        g = inp.grid
        # tokens "b (h w) (c ph pw)" -> latent [b, c, 2h, 2w]: 16 noisy + 16 masked-image + 64 mask channels
        x = inp.x.reshape(1, g, g, -1, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(1, -1, 2 * g, 2 * g)

        def run():
            out = self.dm(x, inp.t, inp.ctx, y=inp.y, guidance=inp.guidance)  # [1, 16, 2g, 2g]
            return out.reshape(1, 16, g, 2, g, 2).permute(0, 2, 4, 1, 3, 5).reshape(1, g * g, 64)

        return run


def fill_flops(config: Flux1Config, case: Case) -> float:
    """FLOPs of one Fill step from the shape, counted as ``suite_models.dit_flops`` counts FLUX.2's (GELU MLP:
    one input row per hidden unit)."""
    h, mlp = config.hidden_size, config.mlp_hidden_dim
    queries = keys = case.text_tokens + case.grid**2
    double = 2 * (3 * h * h + h * h + 2 * h * mlp)
    single = 2 * (h * (3 * h + mlp) + (h + mlp) * h)
    attention = 4 * queries * keys * h
    total = config.depth * (queries * double + attention)
    total += config.depth_single_blocks * (queries * single + attention)
    total += 2 * case.grid**2 * (FILL_CHANNELS + 64) * h + 2 * case.text_tokens * config.context_in_dim * h
    return float(total)
