"""Fixtures of the FLUX.2 node tests: the fake host with the tiny model files (one per test module, so the
host modules live in sys.modules only while that module's tests run), the pack imported under it, its nodes
and the tiny models loaded through the loader nodes."""

from __future__ import annotations

import sys

import pytest
from comfy_stubs import FakeHost, load_pack, pack_nodes, unload_pack
from klein_nodes import write_models


@pytest.fixture(scope="module")
def fake_host(tmp_path_factory):
    host = FakeHost(tmp_path_factory.mktemp("comfy_models"))
    write_models(host)
    with host.installed():
        try:
            yield host
        finally:
            unload_pack()


@pytest.fixture(scope="module")
def pack(fake_host):
    return load_pack()


@pytest.fixture
def host(fake_host):
    fake_host.reset()
    yield fake_host
    fake_host.reset()


@pytest.fixture(scope="module")
def nodes(pack):
    return pack_nodes(pack).classes


@pytest.fixture(scope="module")
def Flux2Error(pack):
    return sys.modules[f"{pack.__name__}.flux2_core.errors"].Flux2Error


@pytest.fixture(scope="module")
def loaded(nodes, fake_host):
    """Tiny model, text encoder and VAE through the loader nodes, with two encoded prompts."""
    (model,) = nodes["Flux2KleinModelLoader"].execute("klein_tiny.safetensors", "auto")
    (encoder,) = nodes["Flux2KleinTextEncoderLoader"].execute("qwen_tiny.safetensors")
    (vae,) = nodes["Flux2KleinVAELoader"].execute("flux2_tiny_vae.safetensors")
    (positive,) = nodes["Flux2KleinTextEncode"].execute(encoder, "a red apple on a table")
    (negative,) = nodes["Flux2KleinTextEncode"].execute(encoder, "")
    return dict(model=model, encoder=encoder, vae=vae, positive=positive, negative=negative)


@pytest.fixture(scope="module")
def dev(nodes, fake_host):
    """The tiny dev DiT (found by its guidance embedder) and the tiny Mistral (by its shapes), via the
    nodes."""
    (model,) = nodes["Flux2KleinModelLoader"].execute("flux2_dev_tiny.safetensors", "auto")
    (encoder,) = nodes["Flux2KleinTextEncoderLoader"].execute("mistral_tiny.safetensors")
    (positive,) = nodes["Flux2KleinTextEncode"].execute(encoder, "a red apple on a table")
    return dict(model=model, encoder=encoder, positive=positive)
