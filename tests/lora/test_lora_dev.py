"""LoRAs on FLUX.2 [dev] (the tiny dev DiT, with its guidance embedder) in every trainer layout, against
diffusers' Flux2 LoRA loading (``Flux2LoraLoaderMixin.lora_state_dict`` + ``load_lora_adapter``, what
``Flux2Pipeline.load_lora_weights`` runs) on the same weights, compared on the DiT output.

Where diffusers reads a layout, ours equals it. Where the references disagree (docs/formats-and-lora.md), a
test below pins the reading chosen, by comparing with diffusers on a file that says the same thing in a form
diffusers reads correctly (the alpha multiplied into B, the final layer's halves in diffusers' order, ...).
"""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import save_file
from tiny_dit import bfl_state_dict, make_diffusers_dit, write_bfl_file

from flux2_core.dit.call import CallExtras
from flux2_core.dit.files import load_transformer
from flux2_core.dit.rope import image_ids, text_ids
from flux2_core.errors import Flux2Error
from flux2_core.lora import applied, prepare_lora, read_lora

S = 0.7  # the strength used throughout (diffusers: set_adapters weight)
RANK = 4
TOLERANCE = 1e-5  # max abs difference on the DiT output, float32 on the CPU
T = 5
ADALN = "final_layer.adaLN_modulation.1"
PEFT, KOHYA = (".lora_B.weight", ".lora_A.weight"), (".lora_up.weight", ".lora_down.weight")
# Modules diffusers' kohya converter reads (it drops guidance_in, the modulations and the final adaLN)
KOHYA_READ = ("double_blocks.", "single_blocks.", "img_in", "txt_in", "time_in.", "final_layer.linear")


def _reference():
    return make_diffusers_dit(seed=13, guidance_embeds=True)


@pytest.fixture(scope="module")
def base():
    return bfl_state_dict(_reference())


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    path = write_bfl_file(_reference(), tmp_path_factory.mktemp("dev") / "flux2-dev.safetensors")
    model = load_transformer(path)
    assert model.variant.name == "dev"
    return model.transformer


@pytest.fixture(scope="module")
def modules(base):
    """{BFL module: (B, A)}, a random rank-4 pair for every linear of the dev DiT."""
    g = torch.Generator().manual_seed(21)
    out = {}
    for key, w in sorted(base.items()):
        if w.ndim == 2:
            rows, cols = w.shape
            out[key.removesuffix(".weight")] = (
                torch.randn(rows, RANK, generator=g) * 0.15,
                torch.randn(RANK, cols, generator=g) * 0.15,
            )
    assert {"guidance_in.in_layer", "guidance_in.out_layer", ADALN} <= out.keys()
    return out


def _inputs():
    g = torch.Generator().manual_seed(3)
    return (torch.randn(1, 6, 128, generator=g), torch.randn(1, T, 24, generator=g), torch.tensor([0.6]),
            torch.tensor([3.5]))  # fmt: skip


def _ours(net, lora=None):
    x, ctx, t, guidance = _inputs()
    with torch.no_grad(), applied(net, None, [lora] if lora else []):
        return net(x, image_ids(2, 3), t, ctx, CallExtras(guidance=guidance))


def _diffusers(path, strength=S):
    """diffusers' Flux2 LoRA loading on a fresh copy of the reference, then its forward."""
    from diffusers.loaders.lora_pipeline import Flux2LoraLoaderMixin

    theirs = _reference()
    state_dict, metadata = Flux2LoraLoaderMixin.lora_state_dict(str(path), return_lora_metadata=True)
    assert all("lora" in k for k in state_dict)  # load_lora_weights' own check
    theirs.load_lora_adapter(state_dict, prefix="transformer", metadata=metadata, adapter_name="x")
    theirs.set_adapters(["x"], [strength])
    x, ctx, t, guidance = _inputs()
    with torch.no_grad():
        return theirs(hidden_states=x, encoder_hidden_states=ctx, timestep=t, img_ids=image_ids(2, 3),
                      txt_ids=text_ids(T), guidance=guidance, return_dict=False)[0]  # fmt: skip


def _save(path, tensors, metadata=None):
    save_file({k: v.contiguous().clone() for k, v in tensors.items()}, str(path), metadata=metadata)
    return path


def _swap(b):
    first, second = b.chunk(2)
    return torch.cat([second, first])


# ---- the layouts, written from one set of BFL-named pairs ------------------------------------------------


def _bfl(modules, prefix="diffusion_model.", ends=PEFT, alpha=None, keep=lambda name: True):
    tensors = {}
    for name, (b, a) in modules.items():
        if keep(name):
            tensors |= {prefix + name + ends[0]: b, prefix + name + ends[1]: a}
            if alpha is not None:
                tensors[prefix + name + ".alpha"] = torch.tensor(float(alpha))
    return tensors


def _kohya(modules, alpha, keep=lambda name: True):
    tensors = {}
    for name, (b, a) in modules.items():
        if keep(name):
            key = "lora_unet_" + name.replace(".", "_")
            tensors |= {key + ".lora_up.weight": b, key + ".lora_down.weight": a}
            tensors[key + ".alpha"] = torch.tensor(float(alpha))
    return tensors


_DIFFUSERS_GLOBAL = {
    "img_in": "x_embedder",
    "txt_in": "context_embedder",
    "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
    "time_in.out_layer": "time_guidance_embed.timestep_embedder.linear_2",
    "guidance_in.in_layer": "time_guidance_embed.guidance_embedder.linear_1",
    "guidance_in.out_layer": "time_guidance_embed.guidance_embedder.linear_2",
    "double_stream_modulation_img.lin": "double_stream_modulation_img.linear",
    "double_stream_modulation_txt.lin": "double_stream_modulation_txt.linear",
    "single_stream_modulation.lin": "single_stream_modulation.linear",
    "final_layer.linear": "proj_out",
    ADALN: "norm_out.linear",
}
_DIFFUSERS_DOUBLE = {
    "img_attn.proj": "attn.to_out.0",
    "txt_attn.proj": "attn.to_add_out",
    "img_mlp.0": "ff.linear_in",
    "img_mlp.2": "ff.linear_out",
    "txt_mlp.0": "ff_context.linear_in",
    "txt_mlp.2": "ff_context.linear_out",
}


def _diffusers_names(modules):
    """{diffusers module: (B, A)}, the same deltas: q/k/v split (A copied, B cut into thirds), the final
    layer's halves in diffusers' order (scale; shift)."""
    out = {}
    for name, (b, a) in modules.items():
        parts = name.split(".")
        if name in _DIFFUSERS_GLOBAL:
            out[_DIFFUSERS_GLOBAL[name]] = (_swap(b) if name == ADALN else b, a)
        elif parts[0] == "single_blocks":
            what = {"linear1": "attn.to_qkv_mlp_proj", "linear2": "attn.to_out"}[parts[2]]
            out[f"single_transformer_blocks.{parts[1]}.{what}"] = (b, a)
        else:
            block, local = f"transformer_blocks.{parts[1]}.", ".".join(parts[2:])
            if local.endswith("attn.qkv"):
                names = ("to_q", "to_k", "to_v") if local.startswith("img") else (
                    "add_q_proj", "add_k_proj", "add_v_proj")  # fmt: skip
                for piece, rows in zip(names, b.chunk(3)):
                    out[f"{block}attn.{piece}"] = (rows, a)
            else:
                out[block + _DIFFUSERS_DOUBLE[local]] = (b, a)
    return out


def _peft(named, prefix="transformer.", metadata_alpha=None):
    tensors = {}
    for name, (b, a) in named.items():
        tensors |= {f"{prefix}{name}.lora_B.weight": b, f"{prefix}{name}.lora_A.weight": a}
    if metadata_alpha is None:
        return tensors, None
    config = {"r": RANK, "lora_alpha": metadata_alpha, "target_modules": sorted(named), "use_dora": False,
              "use_rslora": False, "lora_dropout": 0.0, "bias": "none",
              "init_lora_weights": True}  # fmt: skip
    return tensors, {"lora_adapter_metadata": json.dumps({f"transformer.{k}": v for k, v in config.items()})}


def _baked(modules, factor, keep=lambda name: True):
    """The same pairs with a scale multiplied into B (how an alpha reads in a file without one)."""
    return {n: (b * factor, a) for n, (b, a) in modules.items() if keep(n)}


def _not_adaln(name):
    return name != ADALN


def _kohya_read(name):
    return name.startswith(KOHYA_READ)


def _prepare(net, path, strength=S):
    lora = prepare_lora(read_lora(path), net, strength=strength)
    return lora, _ours(net, lora)


def _differs(a, b):
    return (a - b).abs().max().item() > 1e-3


# ---- layouts diffusers reads: ours equals it --------------------------------------------------------------


@pytest.mark.parametrize("layout", ["ai-toolkit", "fal", "diffusers", "kohya"])
def test_each_layout_equals_diffusers(tmp_path, net, modules, layout):
    metadata = None
    if layout == "ai-toolkit":  # every module but the final adaLN (diffusers swaps its halves: see below)
        tensors = _bfl(modules, keep=_not_adaln)
    elif layout == "fal":
        tensors = _bfl(modules, "base_model.model.", keep=_not_adaln)
    elif layout == "diffusers":  # diffusers' own Flux2 names: time_guidance_embed, the modulations, norm_out
        tensors, metadata = _peft(_diffusers_names(modules), metadata_alpha=8)
    else:  # kohya / musubi with alpha, on the modules diffusers' kohya converter maps
        tensors = _kohya(modules, alpha=2.0, keep=_kohya_read)
    path = _save(tmp_path / f"{layout}.safetensors", tensors, metadata)
    lora, ours = _prepare(net, path)
    report = lora.report
    assert report.matched == report.total and not report.unmatched and report.unmatched_count == 0
    if layout == "diffusers":
        assert "header" in report.alpha
    expected = _diffusers(path)
    torch.testing.assert_close(ours, expected, atol=TOLERANCE, rtol=0)
    assert _differs(ours, _ours(net))  # the LoRA did something, and it came off again
    assert torch.equal(_ours(net), _ours(net))


def test_every_dev_module_is_reached_and_reported(tmp_path, net, modules):
    """guidance_in, time_in, txt_in, img_in, the three modulations and both final-layer linears."""
    path = _save(tmp_path / "all.safetensors", _bfl(modules, alpha=RANK))
    lora = prepare_lora(read_lora(path), net)
    assert lora.report.matched == lora.report.total == len(modules) == lora.report.layers
    patched = set(lora.patches["diffusion_model"])
    for name in ("guidance_in.in_layer", "guidance_in.out_layer", "time_in.in_layer", "time_in.out_layer",
                 "txt_in", "img_in", "double_stream_modulation_img.lin", "double_stream_modulation_txt.lin",
                 "single_stream_modulation.lin", "final_layer.linear", ADALN):  # fmt: skip
        assert name in patched, name
    text = lora.report.text()
    assert "BFL / ai-toolkit (diffusion_model.)" in text and f"{len(modules)} of the file's" in text


# ---- where the references disagree: the reading chosen, pinned ------------------------------------------


def test_final_layer_modulation_is_read_in_bfl_order(tmp_path, net, modules):
    """A BFL-named final adaLN LoRA changes (shift; scale) as BFL stores them (ComfyUI's reading); diffusers
    maps it onto its (scale; shift) rows unswapped. Ours equals diffusers given the halves in its order."""
    one = {ADALN: modules[ADALN], "img_in": modules["img_in"]}
    bfl = _save(tmp_path / "bfl.safetensors", _bfl(one))
    _, ours = _prepare(net, bfl)
    swapped, _ = _peft(_diffusers_names(one))
    torch.testing.assert_close(ours, _diffusers(_save(tmp_path / "d.safetensors", swapped)), atol=TOLERANCE,
                               rtol=0)  # fmt: skip
    assert _differs(ours, _diffusers(bfl))  # diffusers' own reading of the BFL file exchanges the halves


def test_alpha_in_a_bfl_file_is_honoured(tmp_path, net, modules):
    """diffusers refuses an ``.alpha`` in a ``diffusion_model.`` file; ComfyUI and ours apply alpha/rank."""
    path = _save(tmp_path / "alpha.safetensors", _bfl(modules, alpha=2.0, keep=_not_adaln))
    from diffusers.loaders.lora_pipeline import Flux2LoraLoaderMixin

    with pytest.raises(ValueError):
        Flux2LoraLoaderMixin.lora_state_dict(str(path))
    lora, ours = _prepare(net, path)
    assert lora.report.alpha == f"alpha/rank from .alpha ({lora.report.matched})"
    baked = _bfl(_baked(modules, 2.0 / RANK, _not_adaln))
    torch.testing.assert_close(ours, _diffusers(_save(tmp_path / "baked.safetensors", baked)),
                               atol=TOLERANCE, rtol=0)  # fmt: skip


def test_lora_down_up_under_diffusion_model_is_read(tmp_path, net, modules, caplog):
    """diffusers sends any ``.lora_down`` file to its kohya converter, which loads none of these keys."""
    path = _save(tmp_path / "down.safetensors", _bfl(modules, ends=KOHYA, keep=_not_adaln))
    from diffusers.loaders.lora_pipeline import Flux2LoraLoaderMixin

    with caplog.at_level(logging.WARNING):
        assert Flux2LoraLoaderMixin.lora_state_dict(str(path)) == {}
    _, ours = _prepare(net, path)
    same = _save(tmp_path / "ab.safetensors", _bfl(modules, keep=_not_adaln))
    torch.testing.assert_close(ours, _diffusers(same), atol=TOLERANCE, rtol=0)


def test_bare_diffusers_names_are_read(tmp_path, net, modules):
    """DiffSynth's bare diffusers names: diffusers ignores them (no ``transformer.`` prefix), ComfyUI and ours
    read them as the ``transformer.``-prefixed file."""
    named = _diffusers_names(modules)
    bare, _ = _peft(named, prefix="")
    lora, ours = _prepare(net, _save(tmp_path / "bare.safetensors", bare))
    assert lora.report.family == "DiffSynth / bare diffusers names" and lora.report.matched == len(named)
    prefixed, _ = _peft(named)
    torch.testing.assert_close(ours, _diffusers(_save(tmp_path / "t.safetensors", prefixed)),
                               atol=TOLERANCE, rtol=0)  # fmt: skip


def test_kohya_guidance_modulation_and_final_layer_are_applied(tmp_path, net, modules):
    """diffusers' kohya converter drops ``guidance_in``, the modulations and the final adaLN (with a warning);
    ComfyUI and ours apply them: ours equals diffusers on the same deltas in diffusers' names."""
    path = _save(tmp_path / "kohya.safetensors", _kohya(modules, alpha=8.0))
    lora, ours = _prepare(net, path)
    assert lora.report.matched == len(modules)
    dropped = _diffusers(path)
    torch.testing.assert_close(dropped, _diffusers(_save(tmp_path / "read.safetensors",
                               _kohya(modules, 8.0, _kohya_read))), atol=TOLERANCE, rtol=0)  # fmt: skip
    same, _ = _peft(_diffusers_names(_baked(modules, 8.0 / RANK)))
    torch.testing.assert_close(ours, _diffusers(_save(tmp_path / "same.safetensors", same)), atol=TOLERANCE,
                               rtol=0)  # fmt: skip
    assert _differs(ours, dropped)


def test_alpha_only_in_the_header_is_honoured(tmp_path, net, modules):
    """diffusers' ``lora_adapter_metadata`` (lora_alpha 8, r 4: x2): ComfyUI ignores it, diffusers and ours
    apply it; without the header the same tensors read at x1."""
    named = _diffusers_names({k: v for k, v in modules.items() if k.startswith("double_blocks.0")})
    tensors, header = _peft(named, metadata_alpha=8)
    with_header = prepare_lora(read_lora(_save(tmp_path / "h.safetensors", tensors, header)), net, strength=S)
    without = prepare_lora(read_lora(_save(tmp_path / "n.safetensors", tensors)), net, strength=2 * S)
    torch.testing.assert_close(_ours(net, with_header), _ours(net, without), atol=TOLERANCE, rtol=0)


def test_dora_and_loha_on_the_guidance_embedder(tmp_path, net, base, modules):
    """diffusers strips ``dora_scale`` (a plain LoRA) and refuses LoHa; ours applies both (as ComfyUI): the
    weights equal the formulas merged by hand."""
    name = "guidance_in.in_layer"
    w = base[name + ".weight"]
    b, a = modules[name]
    merged = w + 2.0 / RANK * b @ a
    magnitude = merged.norm(dim=1, keepdim=True) * torch.linspace(0.5, 1.5, w.shape[0])[:, None]
    decomposed = merged * magnitude / (merged.norm(dim=1, keepdim=True) + torch.finfo(torch.float32).eps)
    key = "lora_unet_guidance_in_in_layer"
    dora = {key + ".lora_up.weight": b, key + ".lora_down.weight": a, key + ".alpha": torch.tensor(2.0),
            key + ".dora_scale": magnitude}  # fmt: skip
    lora = prepare_lora(read_lora(_save(tmp_path / "dora.safetensors", dora)), net, strength=S)
    assert "DoRA" in lora.report.kinds
    layer = net.get_submodule(name)
    with applied(net, None, [lora]):
        got = layer.compute_weight(torch.float32, torch.device("cpu"))
    torch.testing.assert_close(got, w + S * (decomposed - w), atol=1e-5, rtol=0)

    g = torch.Generator().manual_seed(8)
    halves = {p: torch.randn(*s, generator=g) * 0.3 for p, s in
              (("w1_a", (w.shape[0], 2)), ("w1_b", (2, w.shape[1])), ("w2_a", (w.shape[0], 2)),
               ("w2_b", (2, w.shape[1])))}  # fmt: skip
    loha = {f"diffusion_model.{name}.hada_{p}": t for p, t in halves.items()}
    loha[f"diffusion_model.{name}.alpha"] = torch.tensor(1.0)
    lora = prepare_lora(read_lora(_save(tmp_path / "loha.safetensors", loha)), net, strength=S)
    with applied(net, None, [lora]):
        got = layer.compute_weight(torch.float32, torch.device("cpu"))
    expected = w + S * 0.5 * (halves["w1_a"] @ halves["w1_b"]) * (halves["w2_a"] @ halves["w2_b"])
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


# ---- LoRAs for the other FLUX.2 models --------------------------------------------------------------------


def _block_pair(hidden, prefix="diffusion_model.double_blocks.0.img_attn.qkv"):
    return {
        prefix + ".lora_B.weight": torch.zeros(3 * hidden, 1),
        prefix + ".lora_A.weight": torch.zeros(1, hidden),
    }


def _no_patches(net):
    return not any(getattr(layer, "patches", None) for layer in net.modules())


@pytest.mark.parametrize("hidden, name", [(3072, "klein 4B"), (4096, "klein 9B")])
def test_a_klein_lora_on_dev_is_refused_with_the_widths(tmp_path, net, hidden, name):
    path = _save(tmp_path / "klein.safetensors", _block_pair(hidden))
    with pytest.raises(Flux2Error) as e:
        prepare_lora(read_lora(path), net)
    message = str(e.value)
    assert f"a LoRA for {name}" in message and f"{hidden} wide" in message, message
    assert "double_blocks.0.img_attn.qkv" in message and f"[{3 * hidden}, {hidden}]" in message, message
    assert "[96, 32]" in message and "trained for FLUX.2 DiT (32 wide" in message, message
    assert _no_patches(net)


def test_a_dev_lora_on_klein_is_refused_with_the_widths(tmp_path):
    klein = load_transformer(
        write_bfl_file(make_diffusers_dit(seed=2), tmp_path / "flux-2-klein-4b.safetensors")
    )
    path = _save(tmp_path / "dev.safetensors", _block_pair(6144))
    with pytest.raises(Flux2Error) as e:
        prepare_lora(read_lora(path), klein.transformer)
    message = str(e.value)
    assert "a LoRA for FLUX.2 [dev]" in message and "6144 wide" in message and "[18432, 6144]" in message
    assert _no_patches(klein.transformer)
