"""FLUX.1 Fill [dev], Black Forest Labs' inpainting and outpainting model, on the pack's seams.

A sibling of the FLUX.2 code, sharing its weight seam (``ops``), loading pipeline, sampling loop (``flow``),
attention, RoPE, norms, the VAE blocks and the editing helpers (crop-to-mask, outpaint canvas, composite)::

    model = load_fill_transformer("flux1-fill-dev.safetensors", torch.bfloat16)
    encoder = load_fill_text_encoder("t5xxl_fp16.safetensors", "clip_l.safetensors", tokenizers=[...])
    vae = load_flux1_vae("ae.safetensors")
    fill = fill_inputs(vae, pixels, mask)            # pixels [1, 3, H, W] in [-1, 1], mask [H, W], 1 = paint
    latent = sample_fill(model, encoder.encode("a cat"), fill, FillSettings(seed=0))
    image = vae.decode(latent)                        # [1, 3, H, W] in about -1..1
"""

from .config import DEFAULT_GUIDANCE, DEFAULT_STEPS, FILL_DEV, Flux1Config
from .dit_files import is_flux1_dit, load_fill_transformer
from .encoders import FillConditioning, FillTextEncoder, load_fill_text_encoder
from .fill import FillInputs, fill_inputs, mask_tokens, pack_latent, unpack_latent
from .sampling import FillSettings, check_fill_conditioning, fill_memory, fill_sigmas, sample_fill
from .text import text_encoder_kind
from .transformer import Flux1FillModel, Flux1Transformer
from .vae import Flux1AutoEncoder, load_flux1_vae

__all__ = [
    "DEFAULT_GUIDANCE",
    "DEFAULT_STEPS",
    "FILL_DEV",
    "FillConditioning",
    "FillInputs",
    "FillSettings",
    "FillTextEncoder",
    "Flux1AutoEncoder",
    "Flux1Config",
    "Flux1FillModel",
    "Flux1Transformer",
    "check_fill_conditioning",
    "fill_inputs",
    "fill_memory",
    "fill_sigmas",
    "is_flux1_dit",
    "load_fill_text_encoder",
    "load_fill_transformer",
    "load_flux1_vae",
    "mask_tokens",
    "pack_latent",
    "sample_fill",
    "text_encoder_kind",
    "unpack_latent",
]
