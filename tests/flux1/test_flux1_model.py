"""FLUX.1 Fill [dev] shapes, schedule, file pairing and quantised files.

- The real configurations built on the meta device have the parameter counts of the reference models and
  the BFL key names and shapes of flux1-fill-dev.safetensors.
- ``fill_sigmas`` equals diffusers' scheduler with the Fill config and BFL's get_schedule values.
- A wrong file in any loader (the FLUX.2 model, VAE or text encoder; FLUX.1 [dev] or Canny; swapped
  encoders) is refused with a message that names the right file; float16, mismatched or odd-sized masks are
  refused; a "white" 8-bit mask hides every source pixel.
- fp8 (``.comfy_quant`` and legacy ``scaled_fp8``) and Q8_0 GGUF Fill DiTs stay quantised and compute what
  a plain model holding their dequantised weights computes.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers.pipelines.flux.pipeline_flux_fill import calculate_shift
from quant_files import write_gguf, write_quantised
from tiny_dit import make_diffusers_dit
from tiny_dit import write_bfl_file as write_klein_dit
from tiny_flux1 import (
    bfl_fill_state_dict,
    fill_scheduler,
    make_diffusers_fill_dit,
    make_diffusers_flux1_vae,
    make_parity_clip,
    make_parity_t5,
    save_tensors,
)
from tiny_text import make_tiny_qwen3, model_tensors
from tiny_vae import random_vae_state_dict
from tiny_vae import write_bfl_file as write_flux2_vae

import flux2_core
from flux2_core.dit.call import CallExtras
from flux2_core.errors import Flux2Error
from flux2_core.flux1 import (
    FILL_DEV,
    FillConditioning,
    FillSettings,
    Flux1AutoEncoder,
    Flux1Config,
    Flux1Transformer,
    fill_inputs,
    fill_sigmas,
    load_fill_transformer,
    load_flux1_vae,
    sample_fill,
    text_encoder_kind,
)
from flux2_core.flux1.config import schedule_shift
from flux2_core.flux1.fill import FillInputs
from flux2_core.flux1.text import CLIP_L, T5_XXL, build_clip, build_t5, load_clip, load_t5
from flux2_core.flux1.transformer import image_ids
from flux2_core.flux1.vae import FLUX1_VAE
from flux2_core.ops import PLAIN, linears

CPU = torch.device("cpu")


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---- real-size configurations (meta device) --------------------------------------------------------------


def test_real_configs_have_the_reference_parameter_counts():
    with torch.device("meta"):
        dit, vae = Flux1Transformer(FILL_DEV), Flux1AutoEncoder(FLUX1_VAE)
        t5, clip = build_t5(T5_XXL), build_clip(CLIP_L)
    # The counts of the reference implementations built on the meta device from the released configurations:
    # diffusers' FluxTransformer2DModel with black-forest-labs/FLUX.1-Fill-dev's transformer/config.json
    # (in_channels 384, 19 double + 38 single blocks) and its per-block counts, diffusers' AutoencoderKL with
    # its vae/config.json (latent_channels 16, no quant convs), transformers' T5EncoderModel with
    # google/t5-v1_1-xxl's config.json and CLIPTextModel with openai/clip-vit-large-patch14's text_config.
    assert _count(dit) == 11_902_391_360
    assert _count(dit.double_blocks[0]) == 339_831_296
    assert _count(dit.single_blocks[0]) == 141_591_808
    assert _count(vae) == 83_819_683 and len(vae.state_dict()) == 244
    assert _count(vae.encoder) == 34_274_208 and _count(vae.decoder) == 49_545_475
    assert _count(t5) == 4_762_310_656  # the shared embedding counted once
    assert _count(clip) == 123_060_480 and len(list(clip.parameters())) == 196


# The BFL / ComfyUI names and shapes of flux1-fill-dev.safetensors (each with a bias but the norms): BFL's
# Flux (black-forest-labs/flux src/flux/model.py) with configs["flux-dev-fill"] (src/flux/util.py); the
# names diffusers' convert_flux_transformer_checkpoint_to_diffusers (loaders/single_file_utils.py) reads.
TOP_LEVEL = {
    "img_in": (3072, 384),
    "txt_in": (3072, 4096),
    "time_in.in_layer": (3072, 256),
    "time_in.out_layer": (3072, 3072),
    "guidance_in.in_layer": (3072, 256),
    "guidance_in.out_layer": (3072, 3072),
    "vector_in.in_layer": (3072, 768),
    "vector_in.out_layer": (3072, 3072),
    "final_layer.linear": (64, 3072),
    "final_layer.adaLN_modulation.1": (6144, 3072),
}
DOUBLE = {
    "img_mod.lin": (18432, 3072),
    "txt_mod.lin": (18432, 3072),
    "img_attn.qkv": (9216, 3072),
    "txt_attn.qkv": (9216, 3072),
    "img_attn.proj": (3072, 3072),
    "txt_attn.proj": (3072, 3072),
    "img_mlp.0": (12288, 3072),
    "img_mlp.2": (3072, 12288),
    "txt_mlp.0": (12288, 3072),
    "txt_mlp.2": (3072, 12288),
}
DOUBLE_NORMS = [f"{s}_attn.norm.{q}_norm.scale" for s in ("img", "txt") for q in ("query", "key")]
SINGLE = {"modulation.lin": (9216, 3072), "linear1": (21504, 3072), "linear2": (3072, 15360)}
SINGLE_NORMS = ["norm.query_norm.scale", "norm.key_norm.scale"]


def _with_biases(table: dict[str, tuple[int, ...]], prefix: str = "") -> dict[str, tuple[int, ...]]:
    out = {}
    for name, shape in table.items():
        out[f"{prefix}{name}.weight"], out[f"{prefix}{name}.bias"] = shape, shape[:1]
    return out


def test_dit_keys_are_the_bfl_table():
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in Flux1Transformer(FILL_DEV).state_dict().items()}
    assert (
        len(shapes) == 780 == 20 + 19 * 24 + 38 * 8
    )  # BFL's layout: 20 top-level, 24 per double, 8 per single block
    want = _with_biases(TOP_LEVEL)
    for n in range(19):
        want |= _with_biases(DOUBLE, f"double_blocks.{n}.")
        want |= {f"double_blocks.{n}.{k}": (128,) for k in DOUBLE_NORMS}
    for n in range(38):
        want |= _with_biases(SINGLE, f"single_blocks.{n}.")
        want |= {f"single_blocks.{n}.{k}": (128,) for k in SINGLE_NORMS}
    assert shapes == want


# ---- schedule ------------------------------------------------------------------------------------------


def test_schedule_worked_values():
    # BFL's get_schedule: 64x96 (24 tokens), 3 steps; mu 1.15 at 1024x1024, 0.63 at 512x512
    assert fill_sigmas(3, 24).tolist() == pytest.approx([1.0, 0.76022, 0.44216, 0.0], abs=1e-5)
    assert schedule_shift(4096) == pytest.approx(1.15)
    assert schedule_shift(1024) == pytest.approx(0.63)
    s = fill_sigmas(50, 4096).tolist()
    assert s[:4] == pytest.approx([1.0, 0.99358, 0.98698, 0.98019], abs=1e-5)
    assert s[-3:] == pytest.approx([0.11629, 0.06055, 0.0], abs=1e-5)


@pytest.mark.parametrize(("steps", "tokens"), [(3, 24), (2, 40), (20, 1024), (50, 4096), (28, 6000)])
def test_schedule_equals_diffusers_scheduler(steps, tokens):
    scheduler = fill_scheduler()
    mu = calculate_shift(tokens, 256, 4096, 0.5, 1.15)  # what FluxFillPipeline computes
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    want = scheduler.sigmas.float()
    got = fill_sigmas(steps, tokens)
    assert got.shape == want.shape == (steps + 1,)
    assert (got - want).abs().max().item() < 1e-6
    assert schedule_shift(tokens) == pytest.approx(mu)


def test_schedule_needs_a_step():
    with pytest.raises(Flux2Error, match="at least 1 step"):
        fill_sigmas(0, 24)


# ---- pairing and format errors -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """One file of each kind a user may pick by mistake, and the right FLUX.1 ones."""
    root = tmp_path_factory.mktemp("pairing")
    fill = make_diffusers_fill_dit(seed=1)
    t5, clip = make_parity_t5(seed=3), make_parity_clip(seed=4)
    qwen = make_tiny_qwen3(seed=5, num_hidden_layers=2)
    dev, canny = (bfl_fill_state_dict(make_diffusers_fill_dit(in_channels=c)) for c in (64, 128))
    return {
        "fill": save_tensors(bfl_fill_state_dict(fill), root / "flux1-fill-dev.safetensors"),
        "fill diffusers": save_tensors(fill.state_dict(), root / "transformer" / "model.safetensors"),
        "dev": save_tensors(dev, root / "flux1-dev.safetensors"),
        "canny": save_tensors(canny, root / "flux1-canny-dev.safetensors"),
        "klein": write_klein_dit(make_diffusers_dit(seed=3), root / "flux-2-klein-4b.safetensors"),
        "ae": save_tensors(make_diffusers_flux1_vae(seed=2).state_dict(), root / "ae.safetensors"),
        "flux2 vae": write_flux2_vae(random_vae_state_dict(seed=4), root / "flux2-vae.safetensors"),
        "t5": save_tensors(
            {k: v for k, v in t5.state_dict().items() if k != "encoder.embed_tokens.weight"},
            root / "t5xxl_fp16.safetensors",
        ),
        "clip": save_tensors(clip.state_dict(), root / "clip_l.safetensors", prefix="text_model."),
        "qwen": save_tensors(model_tensors(qwen, lm_head=False), root / "qwen_3_4b.safetensors"),
    }


@pytest.mark.parametrize("layout", ["fill", "fill diffusers"])
def test_fill_dit_into_the_flux2_loader(files, layout):
    # names the Fill model and the loader that takes it (not "this pack runs FLUX.2 [klein]")
    with pytest.raises(Flux2Error, match=r"is FLUX.1 Fill \[dev\] \(a FLUX.1 model.*Fill \[dev\] Model Load"):
        flux2_core.load_transformer(files[layout])


@pytest.mark.parametrize(
    ("kind", "message"),
    [("dev", r"FLUX.1 \[dev\] / \[schnell\] / Kontext"), ("canny", r"FLUX.1 Canny / Depth \[dev\]")],
)
def test_other_flux1_dits_are_named(files, kind, message):
    with pytest.raises(Flux2Error, match=message + r", not FLUX.1 Fill \[dev\].*choose flux1-fill-dev"):
        load_fill_transformer(files[kind])
    with pytest.raises(Flux2Error, match=message + r" \(a FLUX.1 model.*does not run"):
        flux2_core.load_transformer(files[kind])


def test_qwen3_as_t5_or_clip(files):
    with pytest.raises(Flux2Error, match=r"qwen_3_4b.* is a language model \(Qwen3.*not a T5 encoder.*t5xxl"):
        load_t5(files["qwen"])
    with pytest.raises(Flux2Error, match=r"is a language model \(Qwen3.*not a CLIP text encoder.*clip_l"):
        load_clip(files["qwen"])
    with pytest.raises(Flux2Error, match=r"qwen_3_4b.* is neither T5-XXL nor CLIP-L.*t5xxl_fp16.*clip_l"):
        text_encoder_kind(files["qwen"])


def test_swapped_t5_and_clip(files):
    with pytest.raises(Flux2Error, match=r"clip_l.* is a CLIP text encoder, not a T5 encoder: choose t5xxl"):
        load_t5(files["clip"])
    with pytest.raises(Flux2Error, match=r"t5xxl_fp16.* is a T5 encoder, not a CLIP text encoder.*clip_l"):
        load_clip(files["t5"])
    assert (text_encoder_kind(files["t5"]), text_encoder_kind(files["clip"])) == ("t5", "clip")


def test_t5_and_clip_into_the_qwen3_loader(files):
    for kind in ("t5", "clip"):
        with pytest.raises(Flux2Error, match=r"is (T5-XXL|CLIP-L), a FLUX.1 text encoder.*mistral_3"):
            flux2_core.load_text_encoder(files[kind])


def test_vaes_of_the_other_family(files):
    with pytest.raises(Flux2Error, match=r"flux2-vae.* is the FLUX.2 VAE \(32 latent channels\).*ae\.safet"):
        load_flux1_vae(files["flux2 vae"])
    with pytest.raises(Flux2Error, match=r"ae.safetensors holds a FLUX.1 .* VAE.*flux2-vae.safetensors"):
        flux2_core.load_vae(files["ae"])
    with pytest.raises(Flux2Error, match="is a diffusion model, not a VAE"):
        load_flux1_vae(files["fill"])


def test_float16_is_refused(files):
    with pytest.raises(Flux2Error, match="does not run in float16.*bfloat16"):
        load_fill_transformer(files["fill"], torch.float16)


def test_encoders_must_fit_the_dit(files):
    model = load_fill_transformer(files["fill"])
    cond = FillConditioning(torch.zeros(1, 512, 4096), torch.zeros(1, 768))  # the real widths: not this DiT's
    fill = FillInputs(torch.zeros(1, 24, 320), (4, 6))
    with pytest.raises(Flux2Error, match=r"reads 32-wide T5 states and a 128-wide CLIP.*4096 and 768"):
        sample_fill(model, cond, fill, FillSettings(seed=0, steps=1))


class RecordingVAE:
    """Stands in for the VAE: keeps what it was asked to encode, returns a zero latent."""

    def __init__(self):
        self.seen: list[torch.Tensor] = []

    def encode(self, pixels, **tiles):
        self.seen.append(pixels.clone())
        return torch.zeros(pixels.shape[0], 16, pixels.shape[-2] // 8, pixels.shape[-1] // 8)


def test_mask_and_image_sizes_are_checked():
    pixels = torch.zeros(1, 3, 64, 96)
    with pytest.raises(Flux2Error, match=r"image \[1, 3, 64, 96\] and the mask \[1, 64, 80\] do not match"):
        fill_inputs(RecordingVAE(), pixels, torch.zeros(64, 80))
    with pytest.raises(Flux2Error, match="is 96x72: FLUX.1 Fill needs sides that are multiples of 16"):
        fill_inputs(RecordingVAE(), torch.zeros(1, 3, 72, 96), torch.zeros(72, 96))


def test_a_white_8bit_mask_hides_every_source_pixel():
    g = torch.Generator().manual_seed(0)
    pixels = torch.rand(1, 3, 64, 96, generator=g) * 2 - 1
    mask = torch.zeros(64, 96)
    mask[8:40, 16:72] = 254 / 255  # "white" read from an 8-bit PNG: 0.996
    mask[48:56, 0:8] = 0.3  # grey below 0.5: kept
    vae = RecordingVAE()
    fill = fill_inputs(vae, pixels, mask)
    (masked,) = vae.seen
    painted = (mask >= 0.5).expand_as(masked[0])
    assert torch.equal(masked[0][painted], torch.zeros(int(painted.sum())))  # exactly 0 (mid grey)
    assert torch.equal(masked[0][~painted], pixels[0][~painted])  # the rest untouched
    channels = fill.tokens[0, :, 64:]
    assert set(channels.unique().tolist()) == {0.0, 1.0}  # binary mask channels (as diffusers)
    assert channels.sum().item() == 32 * 56  # one channel per painted pixel


# ---- quantised Fill DiTs -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fill_sd():
    return bfl_fill_state_dict(make_diffusers_fill_dit(seed=1))


def _forward(model):
    g = torch.Generator().manual_seed(0)
    x, ctx = torch.randn(2, 24, 384, generator=g), torch.randn(2, 7, 32, generator=g)
    pooled = torch.randn(2, 128, generator=g)
    t, guidance = torch.tensor([0.7, 0.3]), torch.tensor([30.0, 30.0])
    with torch.no_grad():
        return model.transformer(x, image_ids(4, 6), t, ctx, CallExtras(pooled=pooled, guidance=guidance))


@pytest.mark.parametrize("form", ["tensor", "legacy"])
def test_fp8_fill_dit_computes_its_dequantised_weights(fill_sd, tmp_path, form):
    path = tmp_path / "flux1-fill-dev-fp8.safetensors"
    expected = write_quantised(fill_sd, path, "float8_e4m3fn", form)  # ``.comfy_quant`` or ``scaled_fp8``
    assert len(expected) == 2 * 8 + 2 * 2  # the block linears: 8 per double block, 2 per single
    model = load_fill_transformer(path)
    layers = dict(linears(model.transformer))
    for key, want in expected.items():
        layer = layers[key.removesuffix(".weight")]
        assert layer.source is not PLAIN and layer.weight.dtype == torch.float8_e4m3fn, key
        assert torch.equal(layer.compute_weight(torch.float32, CPU), want), key
        assert torch.equal(layer.bias, fill_sd[key.replace(".weight", ".bias")].to(torch.bfloat16).float())
    # the plain model holding exactly those weights (the rest as stored: bfloat16)
    plain = {k: expected.get(k, v.to(torch.bfloat16).float()) for k, v in fill_sd.items()}
    reference = load_fill_transformer(save_tensors(plain, tmp_path / "reference.safetensors"))
    got, want = _forward(model), _forward(reference)
    assert (got - want).abs().max().item() < 1e-5  # measured 0.0
    exact = _forward(load_fill_transformer(save_tensors(fill_sd, tmp_path / "float.safetensors")))
    assert ((got - exact).norm() / exact.norm()).item() < 0.1  # fp8 stays near the float model (2.4e-2)


def test_q8_0_gguf_fill_dit_computes_its_dequantised_weights(fill_sd, tmp_path):
    types = {k: ("Q8_0" if v.ndim == 2 else "F32") for k, v in fill_sd.items()}  # city96 keeps BFL names
    held = write_gguf(fill_sd, tmp_path / "flux1-fill-dev-Q8_0.gguf", "flux", types)
    model = load_fill_transformer(tmp_path / "flux1-fill-dev-Q8_0.gguf")
    assert model.config.in_channels == 384
    layers = dict(linears(model.transformer))
    for key in (k for k, t in types.items() if t == "Q8_0"):
        layer = layers[key.removesuffix(".weight")]
        assert layer.weight.dtype == torch.uint8, key  # still the Q8_0 blocks
        assert torch.equal(layer.compute_weight(torch.float32, CPU), held[key]), key
    reference = load_fill_transformer(save_tensors(held, tmp_path / "held.safetensors"))
    got, want = _forward(model), _forward(reference)
    assert (got - want).abs().max().item() < 1e-5  # measured 0.0
    exact = _forward(load_fill_transformer(save_tensors(fill_sd, tmp_path / "float.safetensors")))
    assert ((got - exact).norm() / exact.norm()).item() < 0.02


@pytest.mark.parametrize("form", ["tensor", "legacy"])
def test_fp8_t5_encodes_as_its_dequantised_weights(tmp_path, form):
    # ComfyUI's t5xxl_fp8_e4m3fn_scaled.safetensors: every projection in fp8. transformers' T5 casts its
    # activations to ``wo.weight.dtype``, so ``wo`` is loaded in the compute dtype; the rest stays fp8.
    t5 = make_parity_t5(seed=9)
    sd = {k: v for k, v in t5.state_dict().items() if k != "encoder.embed_tokens.weight"}
    linear = ("q", "k", "v", "o", "wi_0", "wi_1", "wo")  # not the relative-position embedding
    projections = [k.removesuffix(".weight") for k in sd if k.removesuffix(".weight").endswith(linear)]
    path = tmp_path / "t5xxl_fp8_e4m3fn_scaled.safetensors"
    expected = write_quantised(sd, path, "float8_e4m3fn", form, layers=projections, high=torch.float32)
    loaded = load_t5(path)
    layers = dict(linears(loaded.model))
    for key in expected:
        layer = layers[key.removesuffix(".weight")]
        kept = not key.endswith("DenseReluDense.wo.weight")
        assert (layer.weight.dtype == torch.float8_e4m3fn) == kept, key
        assert torch.equal(layer.compute_weight(torch.float32, CPU), expected[key]), key
    reference = make_parity_t5(seed=9)
    reference.load_state_dict({**sd, **expected, "encoder.embed_tokens.weight": sd["shared.weight"]})
    ids = torch.randint(0, 32100, (2, 512), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got = loaded.model(input_ids=ids).last_hidden_state
        want = reference(input_ids=ids).last_hidden_state
    assert (got - want).abs().max().item() < 1e-5


GUIDANCE_30 = torch.tensor([30.0])


def test_fill_guidance_is_embedded_as_1000_g_formed_in_the_compute_dtype():
    # diffusers: guidance.to(dtype) * 1000 -> 30 becomes 29952 in bfloat16 (BFL's guidance_vec likewise)
    from flux2_core.dit.layers import timestep_embedding

    config = Flux1Config(256, 2, depth=1, depth_single_blocks=1, context_in_dim=32, vec_in_dim=16)
    net = Flux1Transformer(config).to(torch.bfloat16).eval()
    seen = []
    net.guidance_in.in_layer.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    x, ctx = torch.zeros(1, 4, 384, dtype=torch.bfloat16), torch.zeros(1, 3, 32, dtype=torch.bfloat16)
    with torch.no_grad():
        net(
            x,
            image_ids(2, 2),
            torch.tensor([0.5]),
            ctx,
            CallExtras(pooled=torch.zeros(1, 16), guidance=torch.tensor([30.0])),
        )
    expected = timestep_embedding(torch.tensor([29952.0]), factor=1.0).to(torch.bfloat16)
    assert torch.equal(seen[0], expected)


def test_a_diffusers_repository_finds_its_own_tokenizers(tmp_path):
    # FLUX.1-Fill-dev's layout: text_encoder/ (CLIP) + tokenizer/, text_encoder_2/ (T5) + tokenizer_2/
    from tiny_flux1 import write_clip_file, write_clip_tokenizer, write_t5_file, write_t5_tokenizer

    from flux2_core.flux1 import load_fill_text_encoder

    repo = tmp_path / "FLUX.1-Fill-dev"
    t5, clip = make_parity_t5(seed=3), make_parity_clip(seed=4)
    write_t5_file(t5, repo / "text_encoder_2" / "model.safetensors")
    write_clip_file(clip, repo / "text_encoder" / "model.safetensors")
    write_clip_tokenizer(repo / "tokenizer")
    write_t5_tokenizer(repo / "tokenizer_2")
    encoder = load_fill_text_encoder(repo / "text_encoder_2", repo / "text_encoder")
    assert len(encoder.t5_tokenizer) >= 32100 and len(encoder.clip_tokenizer) == 49408
    conditioning = encoder.encode(["a bench"])
    assert conditioning.t5.shape == (1, 512, 32) and conditioning.pooled.shape == (1, 128)
    loose = tmp_path / "text_encoders"  # ComfyUI's folder: single files, no tokenizer beside them
    t5_file, clip_file = (
        write_t5_file(t5, loose / "t5xxl_fp16.safetensors"),
        write_clip_file(clip, loose / "clip_l.safetensors"),
    )
    with pytest.raises(Flux2Error, match="no T5 and no CLIP tokenizer"):
        load_fill_text_encoder(t5_file, clip_file)
