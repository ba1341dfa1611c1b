"""A VAE run's progress (flux2_core.vae.progress): the counts a decode or encode reports, plain and tiled,
their weights against the multiply-adds the stages really do, a stop raised from the callback, and the same
pixels and latents with a callback as without."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from tiny_vae import TINY_VAE, random_vae_state_dict
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from flux2_core import split_progress
from flux2_core.flux1.vae import FLUX1_VAE, Flux1AutoEncoder
from flux2_core.vae.autoencoder import FLUX2_VAE, AutoEncoder, vae_from_state_dict
from flux2_core.vae.progress import PER_RUN
from flux2_core.vae.tiling import tile_starts

CHEAP_VAE = replace(TINY_VAE, ch_mult=(1, 1, 1, 1), decoder_ch_mult=(1, 1, 1, 1))


class Stop(BaseException):
    """Like ComfyUI's InterruptProcessingException: a BaseException, which nothing may swallow."""


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def vae():
    return vae_from_state_dict(random_vae_state_dict(CHEAP_VAE))


@pytest.fixture(scope="module")
def latent():
    return torch.randn(2, 128, 12, 10, generator=torch.Generator().manual_seed(0))  # two 160 x 192 images


@pytest.fixture(scope="module")
def image():
    return torch.rand(1, 3, 192, 160, generator=torch.Generator().manual_seed(1)) * 2 - 1


def record(run):
    """(result, [(done, total), ...]) of ``run(progress)``."""
    calls = []
    result = run(lambda done, total: calls.append((done, total)))
    return result, calls


def check_counts(calls, stages: int):
    """0 first, before any work; one call per stage; never down; the total known from the start; the end."""
    assert len(calls) == 1 + stages
    assert calls[0] == (0, PER_RUN) and calls[-1] == (PER_RUN, PER_RUN)
    assert {total for _, total in calls} == {PER_RUN}
    done = [d for d, _ in calls]
    assert done == sorted(done)
    assert len(set(done)) > stages // 2  # it moves, not only at the end


def test_plain_decode_counts_each_decoder_stage_and_gives_the_same_pixels(vae, latent):
    pixels, calls = record(lambda progress: vae.decode(latent, progress=progress))
    stages = len(vae.decoder.stages(24, 20))  # the unpatchified latent's size
    blocks = CHEAP_VAE.num_res_blocks + 1
    assert stages == 1 + 3 + 4 * blocks + 3 + 1  # input convs, mid block, 4 levels' blocks, 3 upsamples, out
    check_counts(calls, stages)
    assert torch.equal(pixels, vae.decode(latent))


def test_tiled_decode_counts_each_stage_of_each_tile_and_gives_the_same_pixels(vae, latent):
    tiling = dict(tile_size=128, tile_overlap=32)  # 8 x 8 cells sharing 2: 2 x 2 tiles over 12 x 10 cells
    pixels, calls = record(lambda progress: vae.decode(latent, **tiling, progress=progress))
    tiles = len(tile_starts(12, 8, 2)) * len(tile_starts(10, 8, 2))
    assert tiles == 4
    check_counts(calls, tiles * len(vae.decoder.stages(16, 16)))
    # each tile is a quarter of the work: its last stage ends at a quarter, a half, ...
    per_tile = len(vae.decoder.stages(16, 16))
    assert [calls[per_tile * k][0] for k in range(1, 5)] == [250, 500, 750, 1000]
    assert torch.equal(pixels, vae.decode(latent, **tiling))


def test_encode_counts_each_encoder_stage_plain_and_tiled_and_gives_the_same_latent(vae, image):
    latent, calls = record(lambda progress: vae.encode(image, progress=progress))
    stages = vae.encoder.stages(192, 160)
    blocks = CHEAP_VAE.num_res_blocks
    assert len(stages) == 1 + 4 * blocks + 3 + 3 + 1  # conv_in, 4 levels' blocks, 3 downsamples, mid, out
    check_counts(calls, len(stages))
    assert torch.equal(latent, vae.encode(image))
    tiling = dict(tile_size=128, tile_overlap=32)  # 2 x 2 tiles again
    tiled, calls = record(lambda progress: vae.encode(image, **tiling, progress=progress))
    check_counts(calls, 4 * len(vae.encoder.stages(128, 128)))
    assert torch.equal(tiled, vae.encode(image, **tiling))


def test_a_stop_raised_by_the_callback_ends_the_run_between_stages(vae, latent):
    calls = []

    def stop_at_the_third(done, total):
        calls.append(done)
        if len(calls) == 3:
            raise Stop()

    with pytest.raises(Stop):
        vae.decode(latent, progress=stop_at_the_third)
    assert len(calls) == 3  # no stage ran after it
    calls.clear()
    with pytest.raises(Stop):
        vae.decode(latent, tile_size=128, tile_overlap=32, progress=stop_at_the_third)
    assert len(calls) == 3


def test_split_progress_counts_runs_one_after_another(vae, latent):
    calls = []
    parts = split_progress(lambda done, total: calls.append((done, total)), 2)
    for item, part in zip(latent.split(1), parts):
        assert torch.equal(vae.decode(item, progress=part), vae.decode(item))
    done = [d for d, _ in calls]
    assert {t for _, t in calls} == {2 * PER_RUN} and done == sorted(done)
    assert done[0] == 0 and PER_RUN in done and done[-1] == 2 * PER_RUN
    assert split_progress(None, 3) == [None, None, None]


def test_the_flux1_vae_reports_too():
    flux1 = Flux1AutoEncoder(replace(FLUX1_VAE, ch=32, decoder_ch=32, z_channels=16, ch_mult=(1, 1, 1, 1),
                                     decoder_ch_mult=(1, 1, 1, 1))).eval()  # fmt: skip
    latent = torch.randn(1, 16, 8, 8, generator=torch.Generator().manual_seed(2))
    pixels, calls = record(lambda progress: flux1.decode(latent, progress=progress))
    check_counts(calls, len(flux1.decoder.stages(8, 8)))
    assert torch.equal(pixels, flux1.decode(latent))


@pytest.mark.parametrize("part", ["encoder", "decoder"])
def test_stage_weights_are_the_multiply_adds_the_stages_do(part):
    """Each stage's weight is its convolutions' and attention's multiply-adds, as PyTorch's flop counter
    counts them (2 flops each) on the real VAE's widths at a small size."""
    model = AutoEncoder(replace(FLUX2_VAE, ch=64, decoder_ch=64)).eval()  # the real shape at half width
    half = getattr(model, part)
    size = (48, 32) if part == "encoder" else (6, 4)
    x = torch.randn(1, half.conv_in.in_channels, *size)
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):  # the counter counts the math kernel's matmuls
        for run, cost in half.stages(*x.shape[-2:]):
            with FlopCounterMode(display=False) as counter:
                x = run(x)
            assert counter.get_total_flops() == 2 * cost, run


def test_the_weights_follow_the_work_of_a_real_size_decode():
    """The full-resolution stages of a 1024 x 1024 decode carry most of the work, so the count does not race
    through the small early stages: 8 of its 20 stages (the mid block and the deepest level) count for under
    a fifth of it (measured on a CPU at 512 x 512: a tenth of the time; counted as stages: two fifths)."""
    model = AutoEncoder(FLUX2_VAE)
    costs = [cost for _, cost in model.decoder.stages(128, 128)]
    assert sum(costs) == model.decode_work(64, 64)
    assert len(costs) == 20 and sum(costs[:8]) < 0.2 * sum(costs)
    assert min(costs) >= 0
