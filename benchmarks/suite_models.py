"""The three implementations the suite times, built on one set of random weights.

``Weights`` holds the source of truth: a diffusers ``Flux2Transformer2DModel`` with random weights (a reduced
klein shape on the CPU, or the real klein 4B / 9B shape built on the meta device and filled on the GPU), its
BFL-layout state dict, a random Qwen3 text encoder and a random FLUX.2 VAE. ``Ours``, ``Diffusers`` and
``Native`` each turn one benchmark case into a zero-argument callable that runs one DiT step (or one VAE /
text-encoder call) of that implementation, so the suite can alternate them call by call.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

import klein_shapes  # noqa: F401  (puts the repository and tests/ on the path)
import live_tensors
import torch

from flux2_core.configs import DEV_32B, KLEIN_4B, KLEIN_9B, VARIANTS, Flux2Config
from flux2_core.dit.call import call_extras
from flux2_core.dit.rope import image_ids, reference_ids, text_ids
from flux2_core.flux1.config import FILL_DEV

# FLUX.2 [dev] at its real widths (48 heads of 128, Mistral's 5120-wide states x 3) with a quarter of its
# blocks (2 + 12 of 8 + 48): 7.9 B parameters, so that three copies fit on one 80-141 GB GPU in bf16.
DEV_QUARTER = replace(DEV_32B, depth=2, depth_single_blocks=12)
REAL_SHAPES = {"klein-4b": KLEIN_4B, "klein-9b": KLEIN_9B, "dev": DEV_QUARTER, "fill": FILL_DEV}
# Qwen3-4B / Qwen3-8B (the klein text encoders): hidden, MLP, heads, KV heads (head dim 128)
REAL_TEXT = {2560: (2560, 9728, 32, 8), 4096: (4096, 12288, 32, 8)}


def comfy_import(gpu: bool, sdpa: bool) -> bool:
    """Make native ComfyUI's ``comfy`` package importable from ``COMFYUI_PATH``; False when it is not set."""
    root = os.environ.get("COMFYUI_PATH")
    if not root:
        return False
    if root not in sys.path:
        sys.path.insert(0, root)
    argv = sys.argv
    sys.argv = [argv[0]] + ([] if gpu else ["--cpu"]) + (["--use-pytorch-cross-attention"] if sdpa else [])
    try:
        import comfy.options

        comfy.options.enable_args_parsing()
        import comfy.model_management  # noqa: F401  (parses the arguments once)
    finally:
        sys.argv = argv
    return True


@dataclass
class Case:
    """One DiT step: a ``size``² output with references of ``ref_size``², plain or against cached K/V."""

    name: str
    size: int
    refs: int = 0
    ref_size: int = 512
    kv: bool = False
    text_tokens: int = 512

    @property
    def grid(self) -> int:
        return self.size // 16

    @property
    def ref_tokens(self) -> int:
        return self.refs * (self.ref_size // 16) ** 2

    @property
    def query_tokens(self) -> int:
        """Tokens the step runs through its linear layers."""
        return self.text_tokens + self.grid**2 + (0 if self.kv else self.ref_tokens)

    @property
    def attended_tokens(self) -> int:
        """Tokens every query attends to (the x axis of the plot)."""
        return self.text_tokens + self.grid**2 + self.ref_tokens


@dataclass
class Inputs:
    x: torch.Tensor  # [1, N, 128] noisy tokens
    ctx: torch.Tensor  # [1, T, C]
    refs: list[torch.Tensor]  # [1, R_k, 128] each
    t: torch.Tensor
    x_ids: torch.Tensor
    ctx_ids: torch.Tensor  # diffusers' txt_ids (ours makes its text ids itself)
    ref_ids: torch.Tensor | None
    grid: int
    ref_grid: int
    extra: dict = field(default_factory=dict)

    @property
    def ref(self) -> torch.Tensor | None:
        return torch.cat(self.refs, 1) if self.refs else None

    @cached_property
    def our_x_ids(self) -> torch.Tensor:
        """The image ids as our DiT takes them: on the CPU (it turns them into its RoPE table, after the
        text's own ids), as the sampler passes them; ``x_ids`` stay on the device for diffusers."""
        return self.x_ids.cpu()

    @cached_property
    def our_ref_ids(self) -> torch.Tensor | None:
        return None if self.ref_ids is None else self.ref_ids.cpu()


def make_inputs(case: Case, ctx_dim: int, device, dtype, seed: int = 0, guidance: float | None = None):
    g = torch.Generator().manual_seed(seed)
    grid, ref_grid = case.grid, case.ref_size // 16
    x = torch.randn(1, grid * grid, 128, generator=g).to(device, dtype)
    ctx = torch.randn(1, case.text_tokens, ctx_dim, generator=g).to(device, dtype)
    refs = [torch.randn(1, ref_grid**2, 128, generator=g).to(device, dtype) for _ in range(case.refs)]
    ref_ids = reference_ids([(ref_grid, ref_grid)] * case.refs).to(device) if case.refs else None
    return Inputs(
        x,
        ctx,
        refs,
        torch.tensor([0.7], device=device),
        image_ids(grid, grid).to(device),
        text_ids(case.text_tokens).to(device),
        ref_ids,
        grid,
        ref_grid,
        {} if guidance is None else {"guidance": torch.tensor([guidance], device=device)},
    )


def dit_flops(config: Flux2Config, case: Case) -> float:
    """FLOPs of one DiT step from the shape: every linear layer (2 per multiply-add) and attention (QK^T and
    the weighted sum of V: 4 * queries * keys * hidden per block). Modulation and embedders (per image, not
    per token) are left out; so are norms, RoPE and activations (not matmuls)."""
    h, mlp = config.hidden_size, config.mlp_hidden_dim
    queries = case.query_tokens
    keys = case.attended_tokens
    double = 2 * (3 * h * h + h * h + h * 2 * mlp + mlp * h)  # per token per stream: qkv, proj, SwiGLU MLP
    single = 2 * (h * (3 * h + 2 * mlp) + (h + mlp) * h)  # linear1 (qkv + MLP in), linear2
    attention = 4 * queries * keys * h
    image = case.grid**2 + (0 if case.kv else case.ref_tokens)
    total = config.depth * (queries * double + attention)
    total += config.depth_single_blocks * (queries * single + attention)
    total += (
        2 * image * 128 * h + 2 * case.text_tokens * config.context_in_dim * h + 2 * case.grid**2 * h * 128
    )
    return float(total)


# ---------------------------------------------------------------------------------------------- weights


def random_fill_(model: torch.nn.Module, seed: int) -> None:
    """Random weights as fixtures/tiny_dit.py draws them (norm scales near 1, unit-variance linear outputs),
    drawn on the parameters' own device (so a meta-built model is filled on the GPU)."""
    if on_meta(model):  # a dry run: shapes only, nothing to fill
        return
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            g = torch.Generator(p.device).manual_seed(seed + i)
            noise = torch.randn(p.shape, generator=g, device=p.device, dtype=torch.float32)
            std = 0.3 if p.ndim == 1 else 1.0 / p.shape[1] ** 0.5
            p.copy_(noise * std + (1.0 if p.ndim == 1 else 0.0))


def on_meta(model: torch.nn.Module) -> bool:
    """Whether ``model`` lives on the meta device (``suite.py --dry-run``)."""
    return next(model.parameters()).device.type == "meta"


def diffusers_kwargs(config: Flux2Config) -> dict:
    return dict(
        in_channels=config.in_channels,
        num_layers=config.depth,
        num_single_layers=config.depth_single_blocks,
        attention_head_dim=config.head_dim,
        num_attention_heads=config.num_heads,
        joint_attention_dim=config.context_in_dim,
        axes_dims_rope=tuple(config.axes_dim),
        mlp_ratio=config.mlp_ratio,
        guidance_embeds=config.guidance_embed,
    )


def build_diffusers_dit(config: Flux2Config, device, dtype, seed: int = 0):
    """diffusers' DiT of ``config``: built on the meta device, materialised and filled on ``device``."""
    from diffusers import Flux2Transformer2DModel

    with torch.device("meta"):
        model = Flux2Transformer2DModel(**diffusers_kwargs(config))
    model = model.to(dtype).to_empty(device=device)  # cast on meta, filled in place: never in float32
    for name, _ in model.named_buffers():  # none today; anything here would hold garbage
        raise RuntimeError(f"diffusers' Flux2 DiT has a buffer {name} that to_empty leaves uninitialised")
    random_fill_(model, seed)
    return model.eval().requires_grad_(False)


def fp8_state_dict(bfl: dict) -> dict:
    """``bfl`` with its block linears in float8_e4m3fn and a per-tensor ``weight_scale`` (amax / 448), in
    ComfyUI's ``.comfy_quant`` layout (the form of the fp8 releases, which ours and native both load); the
    other tensors are ``bfl``'s own. Each weight is quantised in its own dtype: no float32 copy is made."""

    def fp8(w):
        scale = (w.abs().amax().float() / 448.0).reshape(())
        return {"weight": (w / scale.to(w.dtype)).to(torch.float8_e4m3fn), "weight_scale": scale}

    return quantised_state_dict(bfl, "float8_e4m3fn", fp8)


def quantised_state_dict(bfl: dict, fmt: str, quantise) -> dict:
    """``bfl`` with its block linears replaced by ``quantise(weight)`` ({role: tensor}) and a ``.comfy_quant``
    marker of ``fmt``, as ComfyUI's quantised files store them; the other tensors are ``bfl``'s own."""
    from quant_files import QUANTISED, marker

    out = {}
    for key, w in bfl.items():
        layer = key[: -len(".weight")]
        if not (key.endswith(".weight") and QUANTISED.fullmatch(layer)):
            out[key] = w
            continue
        out.update({f"{layer}.{role}": t for role, t in quantise(w).items()})
        out[f"{layer}.comfy_quant"] = marker({"format": fmt})
    return out


def fp8_storage(model: torch.nn.Module, dtype: torch.dtype) -> None:
    """diffusers' own fp8: its layerwise casting keeps every linear weight in float8_e4m3fn (no scale) and
    casts it to ``dtype`` as the layer runs."""
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=dtype)


def text_config(width: int) -> dict:
    """A full-depth (28-layer) Qwen3 of ``width``: the real Qwen3-4B / 8B shapes, else a small one."""
    if width in REAL_TEXT:
        hidden, mlp, heads, kv_heads = REAL_TEXT[width]
        return dict(
            hidden_size=hidden,
            intermediate_size=mlp,
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=128,
        )
    heads = max(1, width // 64)
    return dict(
        hidden_size=width,
        intermediate_size=3 * width,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=64,
    )


def build_text_model(width: int, device, dtype):
    """transformers' Qwen3ForCausalLM of ``width`` with random weights, built on the meta device and filled
    on ``device``."""
    from tiny_text import TINY_QWEN3
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(**{**TINY_QWEN3, **text_config(width)}, attn_implementation="sdpa", use_cache=False)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    model = model.to(dtype).to_empty(device=device)  # cast on meta: never materialised in float32
    with torch.no_grad():
        for i, (name, p) in enumerate(() if on_meta(model) else model.named_parameters()):
            g = torch.Generator(p.device).manual_seed(1000 + i)
            noise = torch.randn(p.shape, generator=g, device=p.device)
            if p.ndim == 1:
                p.copy_(1.0 + 0.2 * noise)
            elif "embed_tokens" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[1] ** 0.5)
        model.model.rotary_emb = type(model.model.rotary_emb)(config).to(device)  # its buffers: recomputed
    return model.eval().requires_grad_(False)


# ---------------------------------------------------------------------------------------------- DiTs


class Ours:
    name = "ours"
    has_kv = True

    def __init__(self, bfl: dict, device, dtype):
        from flux2_core.dit.files import DIT_SPEC
        from flux2_core.dit.transformer import Flux2Model
        from flux2_core.weights.checkpoint import Checkpoint
        from flux2_core.weights.loading import load_checkpoint

        loaded = load_checkpoint(DIT_SPEC, Checkpoint(Path("bench.safetensors"), bfl), dtype, device)
        self.net = loaded.module
        live_tensors.ignore(self.net.parameters())  # its linear layers view their weights (scratch outputs)
        variant = "dev" if self.net.config.guidance_embed else "distilled"
        self.model = Flux2Model(self.net, VARIANTS[variant], "bench")

    def step(self, case: Case, inp: Inputs, step_cache=None):
        """One step of ours: its ``CallExtras`` built in the call, as the sampler builds each step's."""
        net, x_ids = self.net, inp.our_x_ids
        if case.kv:
            cache = net.encode_reference_kv(inp.ref, inp.our_ref_ids)
            return lambda: net(inp.x, x_ids, inp.t, inp.ctx, call_extras(kv_cache=cache))
        g = inp.extra.get("guidance")

        def run():
            ref = inp.ref  # the references joined, in the call as before
            refs = None if ref is None else (ref, inp.our_ref_ids)
            extras = call_extras(references=refs, guidance=g, step_cache=step_cache)
            return net(inp.x, x_ids, inp.t, inp.ctx, extras)

        return run

    def extract(self, case: Case, inp: Inputs):
        """The KV model's first step: the references' K/V computed (from the references alone), then the
        step against them."""
        net, x_ids = self.net, inp.our_x_ids

        def run():
            cache = net.encode_reference_kv(inp.ref, inp.our_ref_ids)
            return net(inp.x, x_ids, inp.t, inp.ctx, call_extras(kv_cache=cache))

        return run


class Diffusers:
    name = "diffusers"
    has_kv = True

    def __init__(self, model):
        self.model = model
        blocks = [*model.transformer_blocks, *model.single_transformer_blocks]
        self.plain = [(b.attn, b.attn.processor) for b in blocks]

    def kv_mode(self, on: bool) -> None:
        """diffusers' KV transformer path needs its KV attention processors (the KV pipeline sets them)."""
        from diffusers.models.transformers.transformer_flux2 import (
            Flux2KVAttnProcessor,
            Flux2KVParallelSelfAttnProcessor,
        )

        if not on:
            for attn, processor in self.plain:
                attn.set_processor(processor)
            return
        for block in self.model.transformer_blocks:
            block.attn.set_processor(Flux2KVAttnProcessor())
        for block in self.model.single_transformer_blocks:
            block.attn.set_processor(Flux2KVParallelSelfAttnProcessor())

    def _call(self, x, ids, inp: Inputs, **kw):
        return self.model(
            hidden_states=x,
            encoder_hidden_states=inp.ctx,
            timestep=inp.t,
            img_ids=ids,
            txt_ids=inp.ctx_ids,
            guidance=inp.extra.get("guidance"),
            return_dict=False,
            **kw,
        )

    def _extract(self, inp: Inputs):
        joint, ids = torch.cat([inp.ref, inp.x], 1), torch.cat([inp.ref_ids, inp.x_ids])
        out, kv = self._call(joint, ids, inp, kv_cache_mode="extract", num_ref_tokens=inp.ref.shape[1])
        return out, kv

    def step(self, case: Case, inp: Inputs):
        self.kv_mode(case.kv)
        n = inp.x.shape[1]
        if case.kv:
            _, kv = self._extract(inp)
            return lambda: self._call(inp.x, inp.x_ids, inp, kv_cache_mode="cached", kv_cache=kv)[0]
        if not inp.refs:
            return lambda: self._call(inp.x, inp.x_ids, inp)[0]
        joint, ids = torch.cat([inp.x, inp.ref], 1), torch.cat([inp.x_ids, inp.ref_ids])
        return lambda: self._call(joint, ids, inp)[0][:, :n]

    def extract(self, case: Case, inp: Inputs):
        self.kv_mode(True)
        return lambda: self._extract(inp)[0]


class Native:
    """Native ComfyUI's FLUX.2 (``comfy.ldm.flux.model.Flux``), loaded by ``comfy.sd`` from our BFL tensors
    and called directly: latents [B, 128, h, w] in and out, references as ``ref_latents``."""

    name = "native"
    has_kv = False  # native ComfyUI has no reference K/V cache (the KV model runs its joint forward)

    def __init__(self, bfl: dict, device, dtype):
        import comfy.model_management as mm
        import comfy.sd

        self.patcher = comfy.sd.load_diffusion_model_state_dict(dict(bfl), model_options={"dtype": dtype})
        if torch.device(device).type == "cuda":
            mm.load_models_gpu([self.patcher], force_full_load=True)
        self.dm = self.patcher.model.diffusion_model
        self.device, self.dtype = torch.device(device), dtype

    @staticmethod
    def latent(tokens: torch.Tensor, grid: int) -> torch.Tensor:
        return tokens.transpose(1, 2).reshape(tokens.shape[0], 128, grid, grid)

    def step(self, case: Case, inp: Inputs):
        x = self.latent(inp.x, inp.grid)
        refs = [self.latent(r, inp.ref_grid) for r in inp.refs] or None
        n = inp.x.shape[1]

        def run():
            out = self.dm(x, inp.t, inp.ctx, ref_latents=refs, guidance=inp.extra.get("guidance"))
            return out.reshape(out.shape[0], 128, n).transpose(1, 2)

        return run


# ---------------------------------------------------------------------------------------------- VAEs


def vae_impls(sd: dict, config, device, with_native: bool) -> dict:
    """name -> (encode(pixels [1, 3, H, W] in -1..1), decode(latent [1, 128, h, w])) for each VAE."""
    from tiny_vae import comfy_layout, make_diffusers_vae

    from flux2_core.vae.autoencoder import vae_from_state_dict

    ours = vae_from_state_dict(sd).to(device)
    theirs = make_diffusers_vae(sd, config).to(device)
    out = {
        "ours": (ours.encode, ours.decode),
        "diffusers": (
            lambda px: theirs.encode(px).latent_dist.mode(),
            lambda lat: theirs.decode(_unpack(lat)).sample,
        ),
    }
    if with_native:
        import comfy.sd

        native = comfy.sd.VAE(sd=comfy_layout(sd), dtype=torch.float32)
        out["native"] = (
            lambda px: native.encode(((px + 1) / 2).movedim(1, -1)),
            lambda lat: native.decode(lat),
        )
    return out


def _unpack(latent: torch.Tensor) -> torch.Tensor:
    """[B, 128, h, w] -> diffusers' VAE latent [B, 32, 2h, 2w] (the 2x2 patch undone; normalisation kept)."""
    b, c, h, w = latent.shape
    return latent.reshape(b, c // 4, 2, 2, h, w).permute(0, 1, 4, 2, 5, 3).reshape(b, c // 4, 2 * h, 2 * w)
