"""The seams later features plug into: weight sources and patches, the key map, lazy loading, the flow loop's
hooks, block hooks and guidance kinds. Each must leave today's results exactly as they are."""

import weakref

import pytest
import torch
from tiny_dit import make_diffusers_dit, write_bfl_file, write_diffusers_folder
from tiny_text import make_tiny_qwen3, model_tensors

from flux2_core import ops, sampling
from flux2_core.dit.call import CallExtras
from flux2_core.dit.files import load_transformer
from flux2_core.dit.rope import image_ids
from flux2_core.errors import Flux2Error
from flux2_core.flow import euler, make_noise, pack, start_from, truncate, unpack
from flux2_core.sampling import SampleRequest, SampleSettings, get_sigmas, sample
from flux2_core.text.encoder import text_encoder_from_state_dict
from flux2_core.vae.latent_format import ScaleShift
from flux2_core.weights import checkpoint
from flux2_core.weights.keymaps import DIT, Part, Placement

B, H, W, T = 2, 3, 4, 7


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("seams")
    dit = make_diffusers_dit(seed=1)
    return {
        "bfl": write_bfl_file(dit, root / "flux-2-klein-4b.safetensors"),
        "diffusers": write_diffusers_folder(dit, root / "repo"),
    }


@pytest.fixture
def inputs():
    g = torch.Generator().manual_seed(5)
    return dict(
        x=torch.randn(B, H * W, 128, generator=g),
        ctx=torch.randn(B, T, 24, generator=g),
        t=torch.tensor([0.6, 0.6]),
    )


def _forward(net, inputs):
    with torch.no_grad():
        return net(inputs["x"], image_ids(H, W), inputs["t"], inputs["ctx"])


class CountingSource:
    """A plain source that counts how often each layer asks for its weight."""

    def __init__(self):
        self.calls: dict[str, int] = {}

    def __call__(self, name, layer):
        counter = self

        class Source:
            def weight(self, layer, dtype, device):
                counter.calls[name] = counter.calls.get(name, 0) + 1
                return ops.PLAIN.weight(layer, dtype, device)

        return Source()


def test_every_dit_linear_computes_through_its_source_bit_identically(files, inputs):
    net = load_transformer(files["bfl"]).transformer
    assert not [m for m in net.modules() if type(m) is torch.nn.Linear]
    before = _forward(net, inputs)
    counting = CountingSource()
    ops.set_sources(net, counting)
    after = _forward(net, inputs)
    assert torch.equal(after, before)
    names = {name for name, _ in ops.linears(net)}
    # 2 embedders + 2 in time_in + 3 modulations + 2 double blocks x 8 + 2 single x 2 + 2 in the final
    # layer: every one, once
    assert set(counting.calls) == names and len(names) == 29
    assert set(counting.calls.values()) == {1}


def test_text_encoder_projections_compute_through_the_seam():
    tensors = model_tensors(make_tiny_qwen3(seed=0))
    encoder = text_encoder_from_state_dict(tensors)
    assert not [m for m in encoder.model.modules() if type(m) is torch.nn.Linear]
    before = encoder.encode(["a red fox"])
    counting = CountingSource()
    ops.set_sources(encoder.model, counting)
    assert torch.equal(encoder.encode(["a red fox"]), before)
    assert len(counting.calls) == 27 * 7  # q, k, v, o, gate, up, down in each of the 27 layers run


def _k_rows_patch(net, layer, strength=0.5):
    """A rank-2 patch addressed by the diffusers name of one block's k projection."""
    (placement,) = DIT.lookup("transformer_blocks.1.attn.to_k.weight")
    assert placement == Placement("double_blocks.1.img_attn.qkv.weight", Part(1, 3), None)
    rows = placement.into.rows(layer.out_features)
    g = torch.Generator().manual_seed(0)
    up, down = torch.randn(rows[1], 2, generator=g), torch.randn(2, layer.in_features, generator=g)
    return ops.LowRankPatch(up, down, strength, rows)


def test_a_patch_on_a_fused_row_slice_changes_only_those_rows_and_comes_off_exactly(files, inputs):
    net = load_transformer(files["diffusers"]).transformer
    layer = net.double_blocks[1].img_attn.qkv
    stored = layer.weight.detach().clone()
    before = _forward(net, inputs)
    patch = _k_rows_patch(net, layer)
    layer.add_patch("lora", patch)
    patched = layer.compute_weight(torch.float32, torch.device("cpu"))
    offset, size = patch.rows
    assert (offset, size) == (32, 32)  # k of a 32-wide model: the middle third of qkv
    assert torch.equal(patched[:offset], stored[:offset])
    assert torch.equal(patched[offset + size :], stored[offset + size :])
    torch.testing.assert_close(patched[offset : offset + size], stored[32:64] + 0.5 * patch.up @ patch.down)
    assert not torch.equal(_forward(net, inputs), before)
    assert torch.equal(layer.weight, stored)  # the stored weight is never written
    layer.remove_patch("lora")
    assert torch.equal(_forward(net, inputs), before)


def test_a_patch_that_does_not_fit_is_refused(files):
    layer = load_transformer(files["bfl"]).transformer.double_blocks[0].img_attn.qkv
    with pytest.raises(ValueError, match="does not fit"):
        layer.add_patch("bad", ops.LowRankPatch(torch.zeros(40, 2), torch.zeros(2, 32), rows=(80, 40)))


def test_the_final_layer_swap_is_a_placement_of_each_half():
    placements = DIT.lookup("norm_out.linear.weight")
    assert [(p.into, p.take) for p in placements] == [(Part(1, 2), Part(0, 2)), (Part(0, 2), Part(1, 2))]
    assert Part(1, 2).rows(64) == (32, 32)


def test_start_latent_with_the_full_schedule_is_todays_sampler(files, monkeypatch):
    model = load_transformer(files["bfl"])
    settings = SampleSettings(64, 64, 3, 1.0, seed=4)
    ctx = torch.randn(1, T, 24, generator=torch.Generator().manual_seed(1))
    plain = sample(SampleRequest(model, ctx, settings))
    start = torch.randn(1, 128, 4, 4, generator=torch.Generator().manual_seed(2))
    assert torch.equal(sample(SampleRequest(model, ctx, settings, start=start, strength=1.0)), plain)
    # A partial schedule: the tail of the full one (diffusers' get_timesteps: int(3 - 3 * 0.5) = 1 step
    # skipped), started from the start latent noised to its first sigma, x = (1 - s) start + s noise.
    seen = []

    def recording(denoise, x, sigmas, *rest):
        seen.append(list(sigmas))
        return euler(denoise, x, sigmas, *rest)

    monkeypatch.setattr(sampling, "euler", recording)
    half = sample(SampleRequest(model, ctx, settings, start=start, strength=0.5))
    full = get_sigmas(3, 16).tolist()
    assert seen == [full[1:]]
    s = full[1]
    x = (1 - s) * pack(start) + s * pack(make_noise(1, 64, 64, seed=4))
    with torch.no_grad():  # the two remaining Euler steps by hand
        for i in (1, 2):
            v = model.transformer(x, image_ids(4, 4), torch.full((1,), full[i]), ctx)
            x = x + (full[i + 1] - full[i]) * v
    assert torch.equal(half, unpack(x, 4, 4))


def test_truncated_schedule_and_start_noise_follow_the_flow_convention():
    sigmas = get_sigmas(4, 64).tolist()
    assert truncate(sigmas, 1.0) == sigmas and truncate(sigmas, 0.5) == sigmas[2:]
    assert truncate(sigmas, 0.0) == [0.0]  # nothing to do: the start latent comes back
    noise, start = torch.randn(1, 6, 128), torch.randn(1, 6, 128)
    torch.testing.assert_close(start_from(noise, start, 0.25), 0.75 * start + 0.25 * noise)
    assert torch.equal(start_from(noise, None, 0.25), noise)


def test_blend_hook_runs_after_every_step_at_the_new_sigma():
    seen = []

    def blend(x, sigma):
        seen.append(sigma)
        return x.clone().index_fill_(1, torch.tensor([0]), 7.0)  # pin the first token

    x = pack(make_noise(1, 64, 64, seed=0))
    sigmas = [1.0, 0.5, 0.0]
    out = euler(lambda x, s: torch.ones_like(x), x, sigmas, blend=blend)
    assert seen == [0.5, 0.0]
    assert out[0, 0].eq(7.0).all()
    torch.testing.assert_close(out[0, 1:], x[0, 1:] - 1.0)


def test_embedded_guidance_reaches_the_model(tmp_path):
    path = write_bfl_file(make_diffusers_dit(seed=2, guidance_embeds=True), tmp_path / "dev.safetensors")
    model = load_transformer(path)
    assert model.variant.name == "dev" and model.variant.guidance == "embedded"
    ctx = torch.randn(1, T, 24, generator=torch.Generator().manual_seed(3))
    settings = SampleSettings(64, 64, 2, 3.5, seed=5)
    got = sample(SampleRequest(model, ctx, settings))
    # The same two Euler steps by hand, the value 3.5 given to the model's guidance embedder.
    sigmas = get_sigmas(2, 16).tolist()
    x = pack(make_noise(1, 64, 64, seed=5))
    with torch.no_grad():
        for i in range(2):
            t = torch.full((1,), sigmas[i])
            v = model.transformer(x, image_ids(4, 4), t, ctx, CallExtras(guidance=torch.full((1,), 3.5)))
            x = x + (sigmas[i + 1] - sigmas[i]) * v
    assert torch.equal(got, unpack(x, 4, 4))
    assert not torch.equal(sample(SampleRequest(model, ctx, SampleSettings(64, 64, 2, 1.5, seed=5))), got)


def test_guidance_kind_must_fit_the_weights(tmp_path, files):
    dev = write_bfl_file(make_diffusers_dit(seed=2, guidance_embeds=True), tmp_path / "dev.safetensors")
    with pytest.raises(Flux2Error, match="embeds the guidance value .* choose variant 'dev'"):
        load_transformer(dev, variant="distilled")
    with pytest.raises(Flux2Error, match="no guidance embedder"):
        load_transformer(files["bfl"], variant="dev")
    net = load_transformer(dev).transformer
    with pytest.raises(Flux2Error, match="give a guidance value"):
        net(torch.zeros(1, 4, 128), image_ids(2, 2), torch.tensor([0.5]), torch.zeros(1, T, 24))


def test_loading_reads_one_tensor_at_a_time(files, monkeypatch):
    """The file is never held whole next to the model: each tensor read is cast and placed before the next
    read (a fused q/k/v waits for its three parts). bf16 -> fp32, so every placed tensor is a fresh copy."""
    path = files["bfl"].with_name("bf16.safetensors")
    from safetensors.torch import load_file, save_file

    save_file({k: v.to(torch.bfloat16) for k, v in load_file(files["bfl"]).items()}, path)
    alive_at_read, reads = [], []
    original = checkpoint._read_tensor  # every read of a tensor's bytes goes through it

    def counting_read(*args, **kwargs):
        alive_at_read.append(sum(ref() is not None for ref in reads))
        tensor = original(*args, **kwargs)
        reads.append(weakref.ref(tensor))
        return tensor

    monkeypatch.setattr(checkpoint, "_read_tensor", counting_read)
    model = load_transformer(path, dtype=torch.float32)
    assert model.transformer.dtype == torch.float32
    assert len(reads) == len(model.transformer.state_dict())  # every tensor read exactly once
    assert max(alive_at_read) <= 1

    reads.clear(), alive_at_read.clear()
    load_transformer(files["diffusers"], dtype=torch.bfloat16)  # q, k, v held together, never more
    assert len(reads) > 40 and max(alive_at_read) <= 2


def test_flux1_latent_format_round_trips():
    fmt = ScaleShift(scale=0.5, shift=0.1)
    z = torch.randn(1, 16, 4, 4)
    torch.testing.assert_close(fmt.from_latent(fmt.to_latent(z)), z)
    torch.testing.assert_close(fmt.to_latent(z), (z - 0.1) * 0.5)


def test_the_loading_pipeline_attaches_the_specs_sources(files, inputs):
    from dataclasses import replace

    from flux2_core.dit.files import DIT_SPEC
    from flux2_core.weights.loading import load_component

    counting = CountingSource()
    spec = replace(DIT_SPEC, sources=lambda name, layer, ckpt: counting(name, layer))
    net = load_component(spec, files["bfl"], torch.float32).module
    assert torch.equal(_forward(net, inputs), _forward(load_transformer(files["bfl"]).transformer, inputs))
    assert len(counting.calls) == 29
