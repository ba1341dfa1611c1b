"""The FLUX.2 loader nodes: patchers, dtype and variant, paths outside the model folders."""

from __future__ import annotations

import sys

import pytest
import torch


def test_loaders_wrap_the_core_modules_in_patchers(loaded, fake_host):
    model, encoder, vae = loaded["model"], loaded["encoder"], loaded["vae"]
    assert model.patcher.model.module is model.core.transformer
    assert encoder.patcher.model.module is encoder.encoder.model
    assert vae.patcher.model.module is vae.vae
    assert model.core.variant.name == "distilled" and model.core.transformer.dtype == torch.float32
    assert model.patcher.size == sum(t.nbytes for t in model.core.transformer.state_dict().values())


def test_loader_dtype_and_variant_choice(nodes):
    (model,) = nodes["Flux2KleinModelLoader"].execute("klein_tiny.safetensors", "kv", weight_dtype="bfloat16")
    assert model.core.variant.name == "kv" and model.core.transformer.dtype == torch.bfloat16
    (base,) = nodes["Flux2KleinModelLoader"].execute("klein_tiny_base.safetensors", "auto")
    assert base.core.variant.name == "base"


def test_a_name_with_dotdot_is_never_opened(nodes, pack, monkeypatch, Flux2Error):
    loaders = sys.modules[f"{pack.__name__}.nodes.loaders"]
    opened = []
    monkeypatch.setattr(loaders, "load_transformer", lambda path, **kw: opened.append(path))
    with pytest.raises(Flux2Error, match="not a file"):
        nodes["Flux2KleinModelLoader"].execute("../outside.safetensors", "auto")
    with pytest.raises(Flux2Error, match="not a file"):
        nodes["Flux2KleinVAELoader"].execute("../diffusion_models/klein_tiny.safetensors")
    assert opened == []
