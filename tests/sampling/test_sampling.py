"""Schedule, noise and the Euler/CFG loop, checked against diffusers and against closed forms."""

import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux2.pipeline_flux2_klein import compute_empirical_mu as diffusers_mu
from diffusers.utils.torch_utils import randn_tensor

from flux2_core.configs import VARIANTS, Flux2Config
from flux2_core.dit.call import NO_EXTRAS
from flux2_core.dit.transformer import Flux2Model
from flux2_core.errors import Flux2Error
from flux2_core.sampling import (
    SampleRequest,
    SampleSettings,
    compute_empirical_mu,
    get_sigmas,
    make_noise,
    pack,
    sample,
    unpack,
)


@pytest.mark.parametrize("seq_len, steps", [(4096, 4), (1024, 4), (4096, 50), (16384, 4), (64, 1), (300, 28)])
def test_sigmas_match_diffusers_scheduler(seq_len, steps):
    scheduler = FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential")
    mu = diffusers_mu(seq_len, steps)
    assert compute_empirical_mu(seq_len, steps) == pytest.approx(mu, abs=1e-12)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    torch.testing.assert_close(get_sigmas(steps, seq_len), scheduler.sigmas.float(), atol=1e-6, rtol=0)


def test_worked_schedule_values():
    # BFL's get_schedule (black-forest-labs/flux2 src/flux2/sampling.py: compute_empirical_mu, then
    # generalized_time_snr_shift on linspace(1, 0)) run for 1024^2 (4096 tokens) and 512^2 (1024 tokens) at
    # 4 steps, and its mu for 1024^2 at 50 steps and 2048^2 (16384 tokens, over 4300: the linear branch) at 4,
    # rounded to 5 decimals.
    torch.testing.assert_close(
        get_sigmas(4, 4096), torch.tensor([1.0, 0.96738, 0.90814, 0.76720, 0.0]), atol=1e-5, rtol=0
    )
    torch.testing.assert_close(
        get_sigmas(4, 1024), torch.tensor([1.0, 0.95809, 0.88398, 0.71750, 0.0]), atol=1e-5, rtol=0
    )
    assert compute_empirical_mu(4096, 50) == pytest.approx(2.02335, abs=1e-5)
    assert compute_empirical_mu(16384, 4) == pytest.approx(3.22999, abs=1e-5)


def test_noise_is_the_cpu_float32_generator_convention():
    noise = make_noise(2, 64, 96, seed=42)
    assert noise.shape == (2, 128, 4, 6) and noise.dtype == torch.float32
    expected = randn_tensor(
        (2, 128, 4, 6), generator=torch.Generator("cpu").manual_seed(42), dtype=torch.float32
    )
    torch.testing.assert_close(noise, expected, atol=0, rtol=0)


def test_pack_unpack_roundtrip():
    latent = torch.randn(2, 128, 3, 5)
    tokens = pack(latent)
    assert tokens.shape == (2, 15, 128)
    torch.testing.assert_close(tokens[0, 5 + 2], latent[0, :, 1, 2])  # row-major
    torch.testing.assert_close(unpack(tokens, 3, 5), latent)


class ConstantVelocity(torch.nn.Module):
    """A stand-in DiT: v = c for the text with first value 1, v = -c for the other; counts its calls."""

    def __init__(self, context_in_dim=24):
        super().__init__()
        self.config = Flux2Config(32, 2, 1, 1, context_in_dim)
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.c = torch.linspace(-1, 1, 128)
        self.calls = 0
        self.seen_refs = []
        self.block = torch.nn.Identity()  # one "block", so per-block hooks have somewhere to run

    device = property(lambda self: self.weight.device)
    dtype = property(lambda self: self.weight.dtype)

    def blocks(self):
        return [self.block]

    def forward(self, x, x_ids, t, ctx, extras=NO_EXTRAS):
        self.calls += 1
        self.seen_refs.append(None if extras.references is None else extras.references[0].shape[1])
        sign = self.block(ctx[:, :1, :1])
        return sign * self.c.expand_as(x)


def _model(variant="distilled", net=None):
    net = net or ConstantVelocity()
    return Flux2Model(net, VARIANTS[variant], "test model")


def test_euler_is_exact_on_a_constant_field():
    model = _model()
    settings = SampleSettings(width=64, height=96, steps=3, guidance=1.0, seed=7, batch_size=2)
    out = sample(SampleRequest(model, torch.ones(1, 5, 24), settings))
    expected = make_noise(2, 96, 64, seed=7) - model.transformer.c[None, :, None, None]
    torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
    assert model.transformer.calls == 3


def test_true_cfg_combines_two_passes():
    model = _model("base")
    settings = SampleSettings(width=64, height=64, steps=2, guidance=4.0, seed=1)
    out = sample(SampleRequest(model, torch.ones(1, 5, 24), settings, negative=-torch.ones(1, 5, 24)))
    # v = v_u + g (v_c - v_u) = -c + 4 (2c) = 7c over a total sigma drop of 1
    expected = make_noise(1, 64, 64, seed=1) - 7 * model.transformer.c[None, :, None, None]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=0)
    assert model.transformer.calls == 4


def test_base_model_with_guidance_needs_a_negative():
    with pytest.raises(Flux2Error, match="needs a negative conditioning"):
        sample(SampleRequest(_model("base"), torch.ones(1, 5, 24), SampleSettings(64, 64, 2, 4.0, 0)))


def test_distilled_model_ignores_guidance_with_a_warning(caplog):
    model = _model()
    sample(
        SampleRequest(
            model, torch.ones(1, 5, 24), SampleSettings(64, 64, 2, 3.0, 0), negative=torch.ones(1, 5, 24)
        )
    )
    assert model.transformer.calls == 2 and "ignored" in caplog.text


def test_wrong_text_encoder_is_named():
    model = _model(net=ConstantVelocity(context_in_dim=12288))
    model.name = "klein 9B"
    with pytest.raises(
        Flux2Error, match="klein 9B needs Qwen3-8B: 12288-wide conditioning, this conditioning gives 7680"
    ):
        sample(SampleRequest(model, torch.ones(1, 5, 7680), SampleSettings(64, 64, 2, 1.0, 0)))


@pytest.mark.parametrize("width, height", [(1000, 1024), (1024, 48), (0, 64)])
def test_impossible_sizes(width, height):
    with pytest.raises(Flux2Error, match="multiple of 16 of at least 64"):
        sample(SampleRequest(_model(), torch.ones(1, 5, 24), SampleSettings(width, height, 2, 1.0, 0)))


def test_interrupt_hook_stops_the_run():
    class Stop(BaseException):
        pass

    net = ConstantVelocity()

    def interrupt():
        raise Stop

    with pytest.raises(Stop):
        sample(
            SampleRequest(
                _model(net=net), torch.ones(1, 5, 24), SampleSettings(64, 64, 2, 1.0, 0), interrupt=interrupt
            )
        )
    assert net.calls == 1  # stopped inside the first forward, before its block
    assert not net.block._forward_pre_hooks  # removed even when interrupted


def test_prompt_count_must_match_batch():
    with pytest.raises(Flux2Error, match="holds 2 prompts but the batch size is 3"):
        sample(SampleRequest(_model(), torch.ones(2, 5, 24), SampleSettings(64, 64, 1, 1.0, 0, batch_size=3)))


def test_noise_equals_native_comfyui_prepare_noise():
    # ComfyUI's comfy.sample.prepare_noise: generator = torch.manual_seed(seed), then one
    # torch.randn(latent.size(), dtype=float32, layout=strided, generator=generator, device="cpu") at once.
    generator = torch.manual_seed(1234)
    native = torch.randn(
        (3, 128, 5, 4), dtype=torch.float32, layout=torch.strided, generator=generator, device="cpu"
    )
    torch.testing.assert_close(make_noise(3, 80, 64, seed=1234), native, atol=0, rtol=0)


def test_memory_estimate_counts_the_kv_cache_of_every_reference_token_in_every_block():
    from flux2_core.configs import KLEIN_9B
    from flux2_core.dit.transformer import Flux2Transformer
    from flux2_core.references import ReferenceLatents
    from flux2_core.sampling import estimate_memory

    with torch.device("meta"):
        net = Flux2Transformer(KLEIN_9B).to(torch.bfloat16)
    one_ref = ReferenceLatents.from_latents([torch.zeros(1, 128, 64, 64)])  # a 1024^2 reference: 4096 tokens
    settings = SampleSettings(1024, 1024, 4, 1.0, 0)
    plain = estimate_memory(Flux2Model(net, VARIANTS["distilled"], "klein 9B"), settings, one_ref)
    kv = estimate_memory(Flux2Model(net, VARIANTS["kv"], "klein 9B"), settings, one_ref)
    # K and V of each of the 4096 reference tokens, 4096 wide, in each of klein 9B's 8 + 24 blocks (configs.py
    # KLEIN_9B), in bfloat16: what diffusers' Flux2KVCache (transformer_flux2.py) holds, one
    # Flux2KVLayerCache per double and single block
    assert kv - plain == 2 * 4096 * 4096 * 32 * 2
    assert 1e9 < plain < 4e9  # activations for 512 + 4096 + 4096 tokens
