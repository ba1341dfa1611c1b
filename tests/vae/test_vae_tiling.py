"""Tiled VAE decoding and encoding (flux2_core.vae.tiling) on tiny random VAEs, CPU float32.

The tiles' GroupNorms and mid-block attention see one tile, not the whole image, so a tiled result differs
from the untiled one everywhere; in a random, untrained VAE that difference is much larger than in the
trained one, so the bounds here are loose on the size of the difference and strict on where it lies (not at
the seams) and on the geometry (exact where one tile covers everything or the map is local).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiny_vae import TINY_VAE, random_vae_state_dict, write_bfl_file

from flux2_core import limits, load_vae
from flux2_core.errors import Flux2Error
from flux2_core.vae import tiling as vae_tiling
from flux2_core.vae.tiling import blend_tiles, resolve_tile, tile_starts

ROOT = Path(__file__).resolve().parents[2]
# TINY_VAE's four levels (so the decoder's receptive field spans several latent cells), every level 32 wide
# to keep the CPU time down.
CHEAP_VAE = replace(TINY_VAE, ch_mult=(1, 1, 1, 1), decoder_ch_mult=(1, 1, 1, 1))


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One CPU thread: on a shared machine several only contend (and the results do not depend on it)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def vae(tmp_path_factory):
    path = write_bfl_file(
        random_vae_state_dict(CHEAP_VAE), tmp_path_factory.mktemp("vae") / "vae.safetensors"
    )
    return load_vae(path)


@pytest.fixture(scope="module")
def latent():
    return torch.randn(1, 128, 16, 16, generator=torch.Generator().manual_seed(0))  # a 256 x 256 image


@pytest.fixture(scope="module")
def untiled(vae, latent):
    return vae.decode(latent)


@pytest.fixture(scope="module")
def image():
    g = torch.Generator().manual_seed(1)
    y, x = torch.meshgrid(torch.linspace(0, 6, 256), torch.linspace(0, 6, 256), indexing="ij")
    smooth = torch.stack([torch.sin(x + y), torch.cos(1.3 * x), torch.sin(0.7 * y - x)])[None]
    return (0.5 * smooth + 0.5 * torch.rand(1, 3, 256, 256, generator=g) - 0.25).clamp(-1, 1)


def test_one_tile_covering_everything_is_the_untiled_result(vae, latent, untiled, image):
    assert torch.equal(vae.decode(latent, tile_size=256), untiled)
    assert torch.equal(vae.decode(latent, tile_size=1024, tile_overlap=0), untiled)
    assert torch.equal(vae.encode(image, tile_size=512), vae.encode(image))
    # the blending itself, with a single tile, is exact too
    blended = blend_tiles(vae._decode_whole, latent, (16, 16), 16, 4, 1, 16, 3, vae.device)
    assert torch.equal(blended, untiled)


def test_blending_is_an_exact_partition_of_unity():
    """A map without context (every cell on its own) tiles exactly: the weights sum to 1 everywhere."""
    x = torch.randn(2, 5, 23, 37, generator=torch.Generator().manual_seed(2))
    up = blend_tiles(lambda t: t.repeat_interleave(16, -1).repeat_interleave(16, -2) * 2, x, (23, 37), 8, 2,
                     1, 16, 5, torch.device("cpu"))  # fmt: skip
    torch.testing.assert_close(
        up, x.repeat_interleave(16, -1).repeat_interleave(16, -2) * 2, atol=1e-6, rtol=0
    )
    pixels = torch.randn(1, 3, 160, 208, generator=torch.Generator().manual_seed(3))
    down = blend_tiles(lambda t: F.avg_pool2d(t, 16), pixels, (10, 13), 6, 2, 16, 1, 3, torch.device("cpu"))
    torch.testing.assert_close(down, F.avg_pool2d(pixels, 16), atol=1e-6, rtol=0)


def test_tile_positions_cover_and_overlap():
    for length, tile, overlap in ((16, 8, 2), (23, 8, 2), (100, 16, 4), (17, 16, 0), (8, 16, 4)):
        starts = tile_starts(length, tile, overlap)
        assert starts[0] == 0 and min(starts[-1] + tile, length) == length
        assert all(b - a <= tile - overlap for a, b in zip(starts, starts[1:]))


def _seam_profile(tiled, untiled, seams):
    """Mean |horizontal step| of (tiled - untiled) at the seam columns, and its median over all columns."""
    diff = tiled - untiled
    steps = (diff[..., 1:] - diff[..., :-1]).abs().mean(dim=(0, 1, 2))
    return max(steps[s - 1].item() for s in seams), steps.median().item()


def test_several_tiles_are_close_to_untiled_and_show_no_seams(vae, latent, untiled):
    scale = untiled.std().item()
    errors = {}
    for tile in (128, 192):
        tiled = vae.decode(latent, tile_size=tile, tile_overlap=32)
        starts = tile_starts(16, tile // 16, 2)
        assert len(starts) > 1
        errors[tile] = (tiled - untiled).abs()
        seams = [s * 16 for s in starts[1:]] + [(s + tile // 16) * 16 for s in starts[:-1]]
        at_seams, typical = _seam_profile(tiled, untiled, seams)
        print(f"tile {tile}: max |tiled - untiled| {errors[tile].max():.3f}, mean {errors[tile].mean():.4f} "
              f"(output std {scale:.3f}); seam step {at_seams:.4f} vs median {typical:.4f}")  # fmt: skip
        # Blended seams add no step: measured 1.02x (tile 128) and 1.2x (192) the typical column.
        assert at_seams < 1.6 * typical
    # Per-tile GroupNorm statistics and attention in a random VAE: measured mean 0.16 / 0.07 x std, max
    # 2.3 / 1.2 x std for tiles of 128 / 192 px; larger tiles come closer.
    assert errors[128].mean() < 0.3 * scale and errors[128].max() < 4 * scale
    assert errors[192].mean() < 0.6 * errors[128].mean()
    # Hard seams (no overlap) are what the profile catches: measured 4.5x the typical column.
    hard = vae.decode(latent, tile_size=128, tile_overlap=0)
    at_seams, typical = _seam_profile(hard, untiled, [128])
    assert at_seams > 2.5 * typical


def test_tiled_encode_is_close_to_untiled(vae, image):
    whole = vae.encode(image)
    tiled = vae.encode(image, tile_size=128, tile_overlap=32)
    assert tiled.shape == whole.shape == (1, 128, 16, 16) and tiled.dtype == torch.float32
    error = (tiled - whole).abs()
    print(f"encode tile 128: max |tiled - untiled| {error.max():.3f}, mean {error.mean():.4f} "
          f"(latent std {whole.std():.3f})")  # fmt: skip
    # measured mean 0.41 x std: a smooth image's tiles have very different GroupNorm statistics
    assert error.mean() < 0.6 * whole.std()


PEAK_SCRIPT = """
import sys, torch
sys.path.insert(0, {root!r})
from flux2_core.vae.autoencoder import AutoEncoder
from flux2_core.vae.blocks import VAEConfig
torch.manual_seed(0)
torch.set_num_threads(1)
config = VAEConfig(ch=8, ch_mult=(1, 1, 1, 1), num_res_blocks=1, decoder_ch=8, decoder_ch_mult=(1, 1, 1, 1),
                   norm_groups=8)
vae = AutoEncoder(config).eval()
for p in vae.parameters():
    torch.nn.init.normal_(p, std=0.1)
latent = torch.randn(1, 128, 128, 128)  # a 2048 x 2048 image

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field))

def peak(**tiling):
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets the high-water mark VmHWM to the current resident size
    before = status("VmRSS:")
    pixels = vae.decode(latent, **tiling)
    del pixels
    return status("VmHWM:") - before

vae.decode(latent[..., :2, :2])
estimates = vae.decode_memory(2048, 2048, 256, 32), vae.decode_memory(2048, 2048)
print(peak(tile_size=256, tile_overlap=32), peak(), *estimates)
"""


def test_tiled_decode_peak_memory_is_a_small_fraction():
    code = PEAK_SCRIPT.format(root=str(ROOT))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    tiled, untiled, tiled_estimate, estimate = map(int, result.stdout.split())
    print(f"2048^2 decode peak: untiled +{untiled / 2**20:.0f} MB, 256-px tiles +{tiled / 2**20:.0f} MB "
          f"(estimates {estimate / 2**20:.0f} / {tiled_estimate / 2**20:.0f} MB)")  # fmt: skip
    assert tiled < 0.25 * untiled  # measured 141-155 of ~950 MB: one tile's maps plus the float32 image
    assert tiled_estimate < 0.25 * estimate  # 162 of 1024 MB


def test_automatic_mode_tiles_only_when_memory_is_short(vae, monkeypatch):
    calls = []

    def decode_whole(x, after=None):  # records the pieces decoded, without decoding
        calls.append(tuple(x.shape[-2:]))
        return torch.zeros(x.shape[0], 3, 16 * x.shape[-2], 16 * x.shape[-1])

    monkeypatch.setattr(vae, "_decode_whole", decode_whole)
    latent = torch.zeros(1, 128, 64, 64)  # 1024 x 1024
    for free in (2**40, None):  # plenty, or unknown: untiled
        monkeypatch.setattr(limits, "available_memory", lambda device, free=free: free)
        calls.clear()
        vae.decode(latent, tile_size=0)
        assert calls == [(64, 64)]
    small = vae.decode_memory(1024, 1024, 512) + 1  # room for 512-px tiles, not 768
    assert vae.decode_memory(1024, 1024, 768) > small
    monkeypatch.setattr(limits, "available_memory", lambda device: small)
    calls.clear()
    vae.decode(latent)
    assert len(calls) == 9 and set(calls) == {(32, 32)}  # 3 x 3 tiles of 512 px
    monkeypatch.setattr(limits, "available_memory", lambda device: 2**40)
    calls.clear()
    vae.decode(latent, tile_size=-1)  # negative: always tiled, at the largest tile smaller than the image
    assert len(calls) == 4 and set(calls) == {(48, 48)}


def test_resolve_tile_choices():
    untiled, tiled = (lambda: 100), (lambda t: t // 8)
    assert resolve_tile(None, 2048, 2048, untiled, tiled, free=100) is None
    assert resolve_tile(0, 2048, 2048, untiled, tiled, free=99) == 768  # the largest listed tile that fits
    assert resolve_tile(0, 2048, 2048, untiled, tiled, free=1) == 256  # none fits: the smallest
    assert resolve_tile(-1, 2048, 2048, untiled, tiled, free=None) == 1024
    assert resolve_tile(-1, 512, 512, untiled, tiled, free=None) == 384  # a tile smaller than the image
    assert resolve_tile(640, 512, 512, untiled, tiled, free=0) is None  # one tile covers it
    assert resolve_tile(320, 512, 512, untiled, tiled, free=0) == 320


def test_memory_estimates_follow_the_tile(vae):
    assert vae.decode_memory(2048, 2048, 512) < vae.decode_memory(2048, 2048) / 8
    assert vae.encode_memory(2048, 2048, 512) < vae.encode_memory(2048, 2048) / 8
    assert vae.decode_memory(512, 512, 1024) == vae.decode_memory(512, 512) == vae.decode_memory(512, 512, 0)
    assert vae_tiling.tiled_decode_memory(vae, 2048, 2048, 256) == vae.decode_memory(2048, 2048, 256)


@pytest.mark.parametrize(
    ("tile", "overlap", "message"),
    [
        (100, 16, "tile size 100 is not allowed"),
        (200, 16, "multiple of 16"),
        (128, 64, "smaller than half the tile size"),
        (512, -16, "tile overlap -16 is not allowed"),
        (512, 8, "tile overlap 8"),
        (9000, 64, "at most|to 8192"),
        (256.0, 64, "whole number"),
    ],
)
def test_bad_tile_arguments_are_refused(vae, latent, image, tile, overlap, message):
    with pytest.raises(Flux2Error, match=message):
        vae.decode(latent, tile_size=tile, tile_overlap=overlap)
    with pytest.raises(Flux2Error, match=message):
        vae.encode(image, tile_size=tile, tile_overlap=overlap)
