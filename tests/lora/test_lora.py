"""LoRA files of every trainer layout on the tiny DiT and Qwen3: weights, outputs, diffusers parity, errors.

Expected weights are merged by hand here (W + s * alpha/r * B @ A on the right rows), never through the
product's key map or patch classes.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file
from tiny_dit import bfl_state_dict, make_diffusers_dit, write_bfl_file
from tiny_text import make_tiny_qwen3, write_comfy_file

from flux2_core.dit.files import load_transformer
from flux2_core.dit.rope import image_ids, text_ids
from flux2_core.errors import Flux2Error
from flux2_core.lora import applied, attach, detach, parse_block_strengths, prepare_lora, read_lora
from flux2_core.text.encoder import load_text_encoder

CPU = torch.device("cpu")
H, MLP = 32, 96  # tiny DiT width and MLP width
B, NX, T = 1, 6, 5
S = 0.7  # the strength used throughout
KOHYA, PEFT = (".lora_up.weight", ".lora_down.weight"), (".lora_B.weight", ".lora_A.weight")


@pytest.fixture(scope="module")
def reference():
    return make_diffusers_dit(seed=1)


@pytest.fixture(scope="module")
def base(reference):
    return bfl_state_dict(reference)


@pytest.fixture(scope="module")
def net(reference, tmp_path_factory):
    path = write_bfl_file(reference, tmp_path_factory.mktemp("dit") / "flux-2-klein-4b.safetensors")
    return load_transformer(path).transformer


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    tiny = make_tiny_qwen3(seed=0)
    return load_text_encoder(write_comfy_file(tiny, tmp_path_factory.mktemp("te") / "qwen_3_4b.safetensors"))


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(3)
    return torch.randn(B, NX, 128, generator=g), torch.randn(B, T, 24, generator=g), torch.tensor([0.6])


def _forward(net, inputs):
    x, ctx, t = inputs
    with torch.no_grad():
        return net(x, image_ids(2, 3), t, ctx)


def _write(tmp_path, tensors, name="lora.safetensors", metadata=None):
    path = tmp_path / name
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)
    return read_lora(path)


def _pair(rows, cols, rank=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, rank, generator=g) * 0.3, torch.randn(rank, cols, generator=g) * 0.3


def _halves(key, up, down, ends=KOHYA):
    return {key + ends[0]: up, key + ends[1]: down}


def _weight(module, name):
    return module.get_submodule(name).compute_weight(torch.float32, CPU)


def _untouched(net, base, names):
    for name in names:
        assert torch.equal(_weight(net, name), base[name + ".weight"]), name


# key, (up ending, down ending), alpha (None: no .alpha tensor); the layer is in TARGETS or the key itself
FAMILIES = [
    ("diffusion_model.double_blocks.0.img_attn.qkv", PEFT, None),
    ("diffusion_model.single_blocks.1.linear1", KOHYA, None),
    ("model.diffusion_model.double_blocks.1.img_mlp.0", PEFT, None),
    ("double_blocks.1.txt_mlp.0", PEFT, None),
    ("base_model.model.double_blocks.0.txt_attn.proj", PEFT, None),
    ("lora_unet_double_blocks_0_img_attn_qkv", KOHYA, 4.0),
    ("lora_unet_single_blocks_0_linear2", KOHYA, None),
    ("lora_unet_final_layer_adaLN_modulation_1", KOHYA, 1.0),
    ("lora_unet_double_stream_modulation_txt_lin", KOHYA, 3.0),
    ("diffusion_model.double_blocks.0.img_attn_qkv", PEFT, None),
    ("diffusion_model.double_blocks.1.txt_attn_proj", PEFT, None),
    ("diffusion_model.double_blocks_0_img_attn_proj", PEFT, None),
    ("transformer.proj_out", PEFT, None),
    ("transformer.transformer_blocks.1.ff_context.linear_out", PEFT, None),
    ("single_transformer_blocks.0.attn.to_out", (".lora_B.default.weight", ".lora_A.default.weight"), None),
    ("transformer_blocks.0.attn.to_add_out", PEFT, None),
    ("lora_transformer_time_guidance_embed_timestep_embedder_linear_1", KOHYA, 1.0),
    ("lora_transformer_double_stream_modulation_img_linear", KOHYA, 4.0),
    ("lora_transformer_single_stream_modulation_linear", KOHYA, None),
    ("lora_transformer_single_transformer_blocks_1_attn_to_qkv_mlp_proj", KOHYA, 2),
    ("lora_transformer_context_embedder", KOHYA, None),
    ("diffusion_model.img_in", (".lora.up.weight", ".lora.down.weight"), None),
    ("diffusion_model.txt_in", ("_lora.up.weight", "_lora.down.weight"), None),
    ("transformer.x_embedder", (".lora_linear_layer.up.weight", ".lora_linear_layer.down.weight"), None),
    ("diffusion_model.double_blocks.1.img_mlp.2", (".lora_B", ".lora_A"), None),
    ("diffusion_model.time_in.out_layer", PEFT, None),
]  # fmt: skip
TARGETS = {
    "diffusion_model.double_blocks.0.img_attn_qkv": "double_blocks.0.img_attn.qkv",
    "diffusion_model.double_blocks.1.txt_attn_proj": "double_blocks.1.txt_attn.proj",
    "diffusion_model.double_blocks_0_img_attn_proj": "double_blocks.0.img_attn.proj",
    "lora_unet_double_blocks_0_img_attn_qkv": "double_blocks.0.img_attn.qkv",
    "lora_unet_single_blocks_0_linear2": "single_blocks.0.linear2",
    "lora_unet_final_layer_adaLN_modulation_1": "final_layer.adaLN_modulation.1",
    "lora_unet_double_stream_modulation_txt_lin": "double_stream_modulation_txt.lin",
    "transformer.proj_out": "final_layer.linear",
    "transformer.transformer_blocks.1.ff_context.linear_out": "double_blocks.1.txt_mlp.2",
    "single_transformer_blocks.0.attn.to_out": "single_blocks.0.linear2",
    "transformer_blocks.0.attn.to_add_out": "double_blocks.0.txt_attn.proj",
    "lora_transformer_time_guidance_embed_timestep_embedder_linear_1": "time_in.in_layer",
    "lora_transformer_double_stream_modulation_img_linear": "double_stream_modulation_img.lin",
    "lora_transformer_single_stream_modulation_linear": "single_stream_modulation.lin",
    "lora_transformer_single_transformer_blocks_1_attn_to_qkv_mlp_proj": "single_blocks.1.linear1",
    "lora_transformer_context_embedder": "txt_in",
    "transformer.x_embedder": "img_in",
}


def _target(key):
    return TARGETS.get(key) or key.removeprefix("model.").removeprefix("diffusion_model.").removeprefix(
        "base_model.model."
    )


@pytest.mark.parametrize("key, ends, alpha", FAMILIES, ids=[f[0] for f in FAMILIES])
def test_each_family_patches_its_layer(tmp_path, net, base, key, ends, alpha):
    up_end, down_end = ends
    target = _target(key)
    w = base[target + ".weight"]
    up, down = _pair(w.shape[0], w.shape[1], rank=2)
    tensors = {key + up_end: up, key + down_end: down}
    if alpha is not None:
        tensors[key + ".alpha"] = torch.tensor(float(alpha))
    lora = prepare_lora(_write(tmp_path, tensors), net, strength=S)
    assert lora.report.matched == lora.report.total == 1 and lora.report.layers == 1
    expected = w + S * ((alpha or 2) / 2) * (up @ down)
    with applied(net, None, [lora]):
        torch.testing.assert_close(_weight(net, target), expected, atol=1e-6, rtol=0)
    _untouched(net, base, [target])


def test_diffusers_split_qkv_with_per_chunk_alphas_lands_on_rows(tmp_path, net, base):
    tensors, expected = {}, base["double_blocks.1.img_attn.qkv.weight"].clone()
    for i, (c, alpha) in enumerate(zip("qkv", (1.0, 4.0, 8.0))):
        up, down = _pair(H, H, rank=2, seed=i)
        key = f"lora_transformer_transformer_blocks_1_attn_to_{c}"
        tensors |= {
            key + ".lora_up.weight": up,
            key + ".lora_down.weight": down,
            key + ".alpha": torch.tensor(alpha),
        }
        expected[i * H : (i + 1) * H] += S * alpha / 2 * (up @ down)
    txt = base["double_blocks.1.txt_attn.qkv.weight"].clone()
    up, down = _pair(H, H, seed=9)
    tensors |= {"transformer.transformer_blocks.1.attn.add_v_proj.lora_B.weight": up}
    tensors |= {"transformer.transformer_blocks.1.attn.add_v_proj.lora_A.weight": down}
    txt[2 * H :] += S * up @ down
    lora = prepare_lora(_write(tmp_path, tensors), net, strength=S)
    assert lora.report.matched == 4 and lora.report.layers == 2
    with applied(net, None, [lora]):
        torch.testing.assert_close(_weight(net, "double_blocks.1.img_attn.qkv"), expected, atol=1e-6, rtol=0)
        torch.testing.assert_close(_weight(net, "double_blocks.1.txt_attn.qkv"), txt, atol=1e-6, rtol=0)


def test_kohya_split_qkv_block_diagonal_up(tmp_path, net, base):
    ups, downs = zip(*(_pair(H, H, rank=2, seed=i) for i in range(3)))
    up, down = torch.block_diag(*ups), torch.cat(downs)  # [3H, 6], [6, H]
    key = "lora_unet_double_blocks_0_txt_attn_qkv"
    tensors = {
        key + ".lora_up.weight": up,
        key + ".lora_down.weight": down,
        key + ".alpha": torch.tensor(3.0),
    }
    expected = base["double_blocks.0.txt_attn.qkv.weight"] + S * 3.0 / 6 * torch.cat(
        [u @ d for u, d in zip(ups, downs)]
    )
    with applied(net, None, [prepare_lora(_write(tmp_path, tensors), net, strength=S)]):
        torch.testing.assert_close(_weight(net, "double_blocks.0.txt_attn.qkv"), expected, atol=1e-6, rtol=0)


def test_norm_out_halves_are_swapped(tmp_path, net, base):
    up, down = _pair(2 * H, H)
    tensors = {
        "transformer.norm_out.linear.lora_B.weight": up,
        "transformer.norm_out.linear.lora_A.weight": down,
    }
    delta = up @ down  # diffusers rows: (scale; shift); ours: (shift; scale)
    expected = base["final_layer.adaLN_modulation.1.weight"] + S * torch.cat([delta[H:], delta[:H]])
    with applied(net, None, [prepare_lora(_write(tmp_path, tensors), net, strength=S)]):
        torch.testing.assert_close(
            _weight(net, "final_layer.adaLN_modulation.1"), expected, atol=1e-6, rtol=0
        )


def _lokr_expected(w1, w2, scale):
    return S * scale * torch.kron(w1, w2)


@pytest.mark.parametrize("layout", ["full", "factored", "lycoris_ff", "bare"])
def test_lokr(tmp_path, net, base, layout):
    g = torch.Generator().manual_seed(4)
    if layout == "lycoris_ff":
        key, target, (a, b) = "lycoris_transformer_blocks_0_ff_linear_in", "double_blocks.0.img_mlp.0", (4, 2)
    elif layout == "bare":
        key, target, (a, b) = "double_blocks.0.img_attn.qkv", "double_blocks.0.img_attn.qkv", (4, 4)
    else:
        key, target, (a, b) = "diffusion_model.single_blocks.0.linear2", "single_blocks.0.linear2", (4, 8)
    w = base[target + ".weight"]
    w1 = torch.randn(a, b, generator=g) * 0.3
    rows, cols = w.shape[0] // a, w.shape[1] // b
    tensors = {key + ".lokr_w1": w1, key + ".alpha": torch.tensor(8.0)}
    if layout == "factored":
        w2a, w2b = torch.randn(rows, 2, generator=g) * 0.3, torch.randn(2, cols, generator=g) * 0.3
        tensors |= {key + ".lokr_w2_a": w2a, key + ".lokr_w2_b": w2b}
        expected = w + _lokr_expected(w1, w2a @ w2b, 8.0 / 2)
    else:
        w2 = torch.randn(rows, cols, generator=g) * 0.3
        tensors[key + ".lokr_w2"] = w2
        expected = w + _lokr_expected(w1, w2, 1.0)  # full factors: alpha is not used
    lora = prepare_lora(_write(tmp_path, tensors), net, strength=S)
    assert lora.report.kinds == ["LoKr"] and lora.report.matched == 1
    with applied(net, None, [lora]):
        torch.testing.assert_close(_weight(net, target), expected, atol=1e-6, rtol=0)


def test_loha_and_full_diff(tmp_path, net, base):
    g = torch.Generator().manual_seed(5)
    key = "diffusion_model.single_blocks.0.linear2"
    w1a, w1b = torch.randn(H, 2, generator=g), torch.randn(2, H + MLP, generator=g)
    w2a, w2b = torch.randn(H, 2, generator=g), torch.randn(2, H + MLP, generator=g)
    diff = torch.randn(H, 24, generator=g) * 0.1
    tensors = {f"{key}.hada_{n}": t for n, t in zip(("w1_a", "w1_b", "w2_a", "w2_b"), (w1a, w1b, w2a, w2b))}
    tensors |= {key + ".alpha": torch.tensor(1.0), "diffusion_model.txt_in.diff": diff}
    lora = prepare_lora(_write(tmp_path, tensors), net, strength=S)
    assert lora.report.kinds == ["LoHa", "full delta"]
    with applied(net, None, [lora]):
        expected = base[key[16:] + ".weight"] + S * 0.5 * (w1a @ w1b) * (w2a @ w2b)
        torch.testing.assert_close(_weight(net, "single_blocks.0.linear2"), expected, atol=1e-5, rtol=0)
        torch.testing.assert_close(
            _weight(net, "txt_in"), base["txt_in.weight"] + S * diff, atol=1e-6, rtol=0
        )


@pytest.mark.parametrize("form", ["dora_scale_rows", "dora_scale_columns", "peft_magnitude"])
def test_dora(tmp_path, net, base, form):
    target = "double_blocks.0.img_mlp.0"  # [192, 32]
    w = base[target + ".weight"]
    up, down = _pair(*w.shape, rank=4)
    if form == "peft_magnitude":
        key, names = "transformer.transformer_blocks.0.ff.linear_in", (".lora_B.weight", ".lora_A.weight")
    else:
        key, names = "lora_unet_double_blocks_0_img_mlp_0", (".lora_up.weight", ".lora_down.weight")
    tensors = {key + names[0]: up, key + names[1]: down}
    merged = w + (2.0 / 4 if form != "peft_magnitude" else 1.0) * up @ down
    if form == "dora_scale_columns":
        magnitude = merged.norm(dim=0, keepdim=True) * 1.3  # [1, in]
        decomposed = merged * magnitude / (merged.norm(dim=0, keepdim=True) + torch.finfo(torch.float32).eps)
    else:
        magnitude = (
            merged.norm(dim=1, keepdim=True) * torch.linspace(0.5, 1.5, w.shape[0])[:, None]
        )  # [out, 1]
        decomposed = merged * magnitude / (merged.norm(dim=1, keepdim=True) + torch.finfo(torch.float32).eps)
    if form == "peft_magnitude":
        tensors[key + ".lora_magnitude_vector"] = magnitude.flatten()
    else:
        tensors |= {key + ".dora_scale": magnitude, key + ".alpha": torch.tensor(2.0)}
    lora = prepare_lora(_write(tmp_path, tensors), net, strength=S)
    assert "DoRA" in lora.report.kinds
    with applied(net, None, [lora]):
        torch.testing.assert_close(_weight(net, target), w + S * (decomposed - w), atol=1e-5, rtol=0)
    _untouched(net, base, [target])


def _mixed_lora(base):
    """A LoRA over many layer kinds, with its hand-merged checkpoint (BFL names)."""
    tensors, merged = {}, {k: v.clone() for k, v in base.items()}
    for i, (key, target, alpha) in enumerate(
        [
            ("lora_unet_double_blocks_0_img_attn_qkv", "double_blocks.0.img_attn.qkv", 4.0),
            ("lora_unet_double_blocks_1_txt_mlp_0", "double_blocks.1.txt_mlp.0", 1.0),
            ("lora_unet_single_blocks_0_linear1", "single_blocks.0.linear1", 2.0),
            ("lora_unet_single_blocks_1_linear2", "single_blocks.1.linear2", 2.0),
            ("lora_unet_img_in", "img_in", 2.0),
            ("lora_unet_final_layer_linear", "final_layer.linear", 2.0),
        ]
    ):
        w = base[target + ".weight"]
        up, down = _pair(*w.shape, seed=10 + i)
        tensors |= {
            key + ".lora_up.weight": up,
            key + ".lora_down.weight": down,
            key + ".alpha": torch.tensor(alpha),
        }
        merged[target + ".weight"] = w + S * alpha / 2 * up @ down
    return tensors, merged


def test_outputs_equal_a_hand_merged_checkpoint_and_detach_is_exact(tmp_path, net, base, inputs):
    tensors, merged = _mixed_lora(base)
    save_file(merged, str(tmp_path / "merged.safetensors"))
    expected = _forward(load_transformer(tmp_path / "merged.safetensors").transformer, inputs)
    before = _forward(net, inputs)
    lora = prepare_lora(_write(tmp_path, tensors), net, strength=S)
    with applied(net, None, [lora]):
        torch.testing.assert_close(_forward(net, inputs), expected, atol=1e-5, rtol=0)
    assert torch.equal(_forward(net, inputs), before)
    attach(net, lora.patches["diffusion_model"], "mine")
    assert not torch.equal(_forward(net, inputs), before)
    detach(net, "mine")
    assert torch.equal(_forward(net, inputs), before)


def test_applied_detaches_when_the_body_raises(tmp_path, net, base, inputs):
    before = _forward(net, inputs)
    lora = prepare_lora(_write(tmp_path, _mixed_lora(base)[0]), net)
    for error in (RuntimeError("boom"), KeyboardInterrupt()):
        with pytest.raises(type(error)):
            with applied(net, None, [lora, lora]):
                raise error
        assert not any(layer.patches for layer in net.modules() if hasattr(layer, "patches"))
        assert torch.equal(_forward(net, inputs), before)


def test_several_loras_add_up(tmp_path, net, base):
    target, key = "double_blocks.0.img_attn.proj", "diffusion_model.double_blocks.0.img_attn.proj"
    ups_downs = [_pair(H, H, seed=s) for s in (1, 2)]
    files = [
        _write(tmp_path, _halves(key, u, d, PEFT), f"{i}.safetensors") for i, (u, d) in enumerate(ups_downs)
    ]
    loras = [prepare_lora(f, net, strength=st) for f, st in zip(files, (0.5, -1.5))]
    expected = (
        base[target + ".weight"]
        + 0.5 * ups_downs[0][0] @ ups_downs[0][1]
        - 1.5 * ups_downs[1][0] @ ups_downs[1][1]
    )
    with applied(net, None, loras):
        torch.testing.assert_close(_weight(net, target), expected, atol=1e-6, rtol=0)


def test_matches_diffusers_peft_with_header_alphas(tmp_path, base, net, inputs):
    """The same PEFT file in diffusers (load_lora_adapter) and ours: header lora_alpha/r and alpha_pattern."""
    from diffusers.loaders.lora_pipeline import Flux2LoraLoaderMixin

    modules = {
        "transformer_blocks.0.attn.to_q": (H, H),
        "transformer_blocks.0.attn.to_k": (H, H),
        "transformer_blocks.1.attn.add_v_proj": (H, H),
        "transformer_blocks.1.attn.to_out.0": (H, H),
        "transformer_blocks.0.ff.linear_in": (2 * MLP, H),
        "single_transformer_blocks.0.attn.to_qkv_mlp_proj": (3 * H + 2 * MLP, H),
        "single_transformer_blocks.1.attn.to_out": (H, H + MLP),
        "norm_out.linear": (2 * H, H),
        "proj_out": (128, H),
        "double_stream_modulation_img.linear": (6 * H, H),
    }
    tensors = {}
    for i, (name, (rows, cols)) in enumerate(modules.items()):
        up, down = _pair(rows, cols, rank=4, seed=20 + i)
        tensors |= {f"transformer.{name}.lora_A.weight": down, f"transformer.{name}.lora_B.weight": up}
    config = {
        "r": 4,
        "lora_alpha": 8,
        "alpha_pattern": {"transformer_blocks.0.attn.to_k": 2},
        "rank_pattern": {},
    }
    config |= {"target_modules": list(modules), "use_dora": False, "use_rslora": False, "lora_dropout": 0.0}
    config |= {"bias": "none", "init_lora_weights": True}
    header = {"lora_adapter_metadata": json.dumps({f"transformer.{k}": v for k, v in config.items()})}
    lora = _write(tmp_path, tensors, "peft.safetensors", header)

    theirs = make_diffusers_dit(seed=1)
    state_dict, metadata = Flux2LoraLoaderMixin.lora_state_dict(
        str(tmp_path / "peft.safetensors"), return_lora_metadata=True
    )
    theirs.load_lora_adapter(state_dict, prefix="transformer", metadata=metadata)
    x, ctx, t = inputs
    with torch.no_grad():
        expected = theirs(hidden_states=x, encoder_hidden_states=ctx, timestep=t, img_ids=image_ids(2, 3),
                          txt_ids=text_ids(T), return_dict=False)[0]  # fmt: skip
    ours = prepare_lora(lora, net)
    assert ours.report.matched == len(modules) and "header" in ours.report.alpha
    with applied(net, None, [ours]):
        torch.testing.assert_close(_forward(net, inputs), expected, atol=2e-5, rtol=0)
    assert not torch.allclose(_forward(net, inputs), expected, atol=1e-3)  # the LoRA did something


def test_block_strengths(tmp_path, net, base):
    layers = {
        "lora_unet_double_blocks_0_img_attn_qkv": "double_blocks.0.img_attn.qkv",
        "lora_unet_double_blocks_0_txt_attn_qkv": "double_blocks.0.txt_attn.qkv",
        "lora_unet_single_blocks_1_linear1": "single_blocks.1.linear1",
        "lora_unet_single_blocks_0_linear2": "single_blocks.0.linear2",
        "lora_unet_img_in": "img_in",
    }
    tensors, deltas = {}, {}
    for i, (key, target) in enumerate(layers.items()):
        up, down = _pair(*base[target + ".weight"].shape, seed=30 + i)
        tensors |= {key + ".lora_up.weight": up, key + ".lora_down.weight": down}
        deltas[target] = up @ down
    text = "double=1.0, single.0-11=0.5, double.img.0=0, other=0, single.0=2"
    lora = prepare_lora(_write(tmp_path, tensors), net, block_strengths=text)
    assert (
        lora.report.multipliers["double.img"] == "0 x0, 1 x1"
        and lora.report.multipliers["single"] == "0 x2, 1 x0.5"
    )
    assert "block strengths" in lora.report.text()
    with applied(net, None, [lora]):
        _untouched(net, base, ["double_blocks.0.img_attn.qkv", "img_in"])
        for target, m in (
            ("double_blocks.0.txt_attn.qkv", 1.0),
            ("single_blocks.1.linear1", 0.5),
            ("single_blocks.0.linear2", 2.0),
        ):
            expected = base[target + ".weight"] + m * deltas[target]
            torch.testing.assert_close(_weight(net, target), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "text, bad",
    [("double.img.3", "double.img.3"), ("double=1, foo=1", "foo=1"), ("other.2=1", "other.2=1"),
     ("single.5-2=1", "single.5-2=1"), ("double=abc", "double=abc"), ("single=inf", "single=inf")],
)  # fmt: skip
def test_block_strength_syntax_errors(text, bad):
    with pytest.raises(Flux2Error, match="block strength") as e:
        parse_block_strengths(text)
    assert repr(bad) in str(e.value) or bad.split("=")[0] in str(e.value)
    assert parse_block_strengths("single=0; single.1=2").multiplier("single", None, 1) == 2.0
    assert parse_block_strengths(None).multiplier("double", "img", 0) == 1.0


def _te_lora():
    q_up, q_down = _pair(32, 32, seed=40)  # layers.0 q_proj: [heads * head_dim, E]
    d_up, d_down = _pair(32, 64, seed=41)  # layers.3 mlp.down_proj: [E, intermediate]
    v_up, v_down = _pair(16, 32, seed=42)  # layers.1 v_proj: [kv_heads * head_dim, E]
    u_up, u_down = _pair(64, 32, seed=43)
    tensors = {
        "lora_te_model_layers_0_self_attn_q_proj.lora_up.weight": q_up,
        "lora_te_model_layers_0_self_attn_q_proj.lora_down.weight": q_down,
        "lora_te_model_layers_0_self_attn_q_proj.alpha": torch.tensor(4.0),
        "text_encoder.model.layers.3.mlp.down_proj.lora_B.weight": d_up,
        "text_encoder.model.layers.3.mlp.down_proj.lora_A.weight": d_down,
        "base_model.model.model.layers.1.self_attn.v_proj.lora_B.weight": v_up,
        "base_model.model.model.layers.1.self_attn.v_proj.lora_A.weight": v_down,
        "lora_te1_model_layers_27_mlp_up_proj.lora_up.weight": u_up,  # layer 28 of 28: never run
        "lora_te1_model_layers_27_mlp_up_proj.lora_down.weight": u_down,
    }
    expected = {
        "layers.0.self_attn.q_proj": 2.0 * q_up @ q_down,
        "layers.3.mlp.down_proj": d_up @ d_down,
        "layers.1.self_attn.v_proj": v_up @ v_down,
    }
    return tensors, expected


def test_text_encoder_lora(tmp_path, net, base, encoder):
    tensors, expected = _te_lora()
    up, down = _pair(H, 128)
    tensors |= {"lora_unet_img_in.lora_up.weight": up, "lora_unet_img_in.lora_down.weight": down}
    te = encoder.model
    originals = {name: _weight(te, name) for name in expected}
    before = encoder.encode(["a fox"])
    lora = prepare_lora(_write(tmp_path, tensors), net, encoder, strength=S)
    report = lora.report
    assert report.text_encoder_matched == 3 and report.matched == 1 and report.total == 5
    assert report.unused_layers == ["lora_te1_model_layers_N_mlp_up_proj"]
    with applied(net, te, [lora]):
        for name, delta in expected.items():
            torch.testing.assert_close(_weight(te, name), originals[name] + S * delta, atol=1e-6, rtol=0)
        assert not torch.allclose(encoder.encode(["a fox"]), before, atol=1e-4)
    assert torch.equal(encoder.encode(["a fox"]), before)

    alone = prepare_lora(_write(tmp_path, tensors), net, None, strength=S)
    assert "text encoder keys not applied (no text encoder connected)" in alone.report.text()
    assert "text_encoder" not in alone.patches and alone.report.matched == 1


def test_report_counts_unmatched_and_incomplete(tmp_path, net, base):
    up, down = _pair(3 * H, H)
    tensors = {"lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": up}
    tensors |= {"lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": down}
    for i in range(2):  # a module this model does not have, in two blocks
        tensors |= {f"lora_unet_double_blocks_{i}_img_foo.lora_up.weight": torch.zeros(H, 2)}
        tensors |= {f"lora_unet_double_blocks_{i}_img_foo.lora_down.weight": torch.zeros(2, H)}
    tensors["lora_unet_single_blocks_0_linear2.lora_down.weight"] = torch.zeros(2, H + MLP)  # no up half
    tensors["some_random_tensor"] = torch.zeros(3)
    report = prepare_lora(_write(tmp_path, tensors), net).report
    assert (report.total, report.matched, report.layers) == (4, 1, 1)
    assert report.unmatched == ["lora_unet_double_blocks_N_img_foo (x2)"]
    assert report.incomplete == ["lora_unet_single_blocks_N_linear2"]
    assert report.family == "kohya / musubi (lora_unet_)" and report.kinds == ["LoRA"]
    assert report.ignored_tensors == ["some_random_tensor"]
    assert report.unmatched_count == 2
    lines = report.text().splitlines()
    assert lines[1].startswith("  diffusion model: 1 of the file's 4 modules applied here (1 layers)")
    assert "  not matched (2 modules): lora_unet_double_blocks_N_img_foo (x2)" in lines


def _refused(tmp_path, net, tensors, *needles, text_encoder=None):
    with pytest.raises(Flux2Error) as e:
        prepare_lora(_write(tmp_path, tensors), net, text_encoder)
    for needle in needles:
        assert needle in str(e.value), str(e.value)


def test_other_model_sizes_are_refused_by_name(tmp_path, net):
    def qkv(hidden):
        return {
            "diffusion_model.double_blocks.0.img_attn.qkv.lora_B.weight": torch.zeros(3 * hidden, 1),
            "diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight": torch.zeros(1, hidden),
        }

    _refused(tmp_path, net, qkv(4096), "klein 9B", "4096 wide", "32 wide")
    _refused(tmp_path, net, qkv(3072), "klein 4B")
    _refused(tmp_path, net, qkv(6144), "FLUX.2 [dev]")
    _refused(tmp_path, net, qkv(48), "48-wide")
    odd = _halves("lora_unet_double_blocks_0_img_attn_qkv", torch.zeros(2 * H, 1), torch.zeros(1, H))
    _refused(tmp_path, net, odd, "does not fit", "[64, 32]", "[96, 32]")
    deep = {"lora_unet_double_blocks_7_img_attn_proj.lora_up.weight": torch.zeros(H, 1)}
    deep["lora_unet_double_blocks_7_img_attn_proj.lora_down.weight"] = torch.zeros(1, H)
    _refused(tmp_path, net, deep, "double_blocks.7", "only 2 double")


def test_flux1_and_dev_loras_are_refused(tmp_path, net):
    zeros = torch.zeros
    _refused(
        tmp_path,
        net,
        _halves("lora_unet_double_blocks_0_img_mod_lin", zeros(6 * H, 1), zeros(1, H)),
        "FLUX.1",
    )
    proj_mlp = "transformer.single_transformer_blocks.0.proj_mlp"
    _refused(tmp_path, net, _halves(proj_mlp, zeros(4 * H, 1), zeros(1, H), PEFT), "FLUX.1")
    linear1 = "diffusion_model.single_blocks.0.linear1"  # FLUX.1's linear1 is 7 H tall, FLUX.2's 9 H
    _refused(tmp_path, net, _halves(linear1, zeros(7 * H, 1), zeros(1, H), PEFT), "FLUX.1")
    guidance = "diffusion_model.guidance_in.in_layer"
    _refused(tmp_path, net, _halves(guidance, zeros(H, 1), zeros(1, 256), PEFT), "FLUX.2 [dev]")


def test_text_encoder_of_another_size_is_refused(tmp_path, net, encoder):
    tensors = {"lora_te_model_layers_0_self_attn_q_proj.lora_up.weight": torch.zeros(4096, 1)}
    tensors["lora_te_model_layers_0_self_attn_q_proj.lora_down.weight"] = torch.zeros(1, 4096)
    _refused(tmp_path, net, tensors, "Qwen3-8B (klein 9B)", text_encoder=encoder)


def test_files_that_are_not_loras_are_refused(tmp_path, net, base):
    _refused(tmp_path, net, dict(base), "not a LoRA", "model checkpoint")
    sdxl = {"lora_unet_down_blocks_0_attentions_0_proj_in.lora_up.weight": torch.zeros(4, 1)}
    sdxl["lora_unet_down_blocks_0_attentions_0_proj_in.lora_down.weight"] = torch.zeros(1, 4)
    _refused(tmp_path, net, sdxl, "another model", "lora_unet_down_blocks_0_attentions_0_proj_in")
    only_a = {"diffusion_model.img_in.lora_A.weight": torch.zeros(1, 128)}
    _refused(tmp_path, net, only_a, "incomplete")


def test_unreadable_and_pickle_files_are_refused(tmp_path):
    good = tmp_path / "good.safetensors"
    save_file({"x.lora_A.weight": torch.zeros(64, 64)}, str(good))
    (tmp_path / "cut.safetensors").write_bytes(good.read_bytes()[:200])
    (tmp_path / "junk.safetensors").write_bytes(b"\x00garbage" * 10)
    for name in ("cut.safetensors", "junk.safetensors"):
        with pytest.raises(Flux2Error, match="could not be read"):
            read_lora(tmp_path / name)
    for name in ("style.ckpt", "style.pt", "style.bin"):
        (tmp_path / name).write_bytes(b"\x80\x02}q\x00.")
        with pytest.raises(Flux2Error, match="pickle"):
            read_lora(tmp_path / name)
    with pytest.raises(Flux2Error, match="does not exist"):
        read_lora(tmp_path / "missing.safetensors")


def test_split_qkv_pieces_take_their_blocks_multiplier(tmp_path, net, base):
    tensors, expected = {}, base["double_blocks.1.img_attn.qkv.weight"].clone()
    for i, c in enumerate("qkv"):
        up, down = _pair(H, H, seed=50 + i)
        tensors |= _halves(f"transformer.transformer_blocks.1.attn.to_{c}", up, down, PEFT)
        expected[i * H : (i + 1) * H] += 0.25 * up @ down
    lora = prepare_lora(_write(tmp_path, tensors), net, block_strengths="double.img.1=0.25, double.txt=0")
    with applied(net, None, [lora]):
        torch.testing.assert_close(_weight(net, "double_blocks.1.img_attn.qkv"), expected, atol=1e-6, rtol=0)
