"""Reference preprocessing against diffusers' Flux2ImageProcessor path, packing, ids and the clear errors."""

import numpy as np
import pytest
import torch
from diffusers.pipelines.flux2.image_processor import Flux2ImageProcessor
from PIL import Image

from flux2_core.errors import Flux2Error
from flux2_core.references import ReferenceLatents, prepare_reference, scaled_size


def _image(width, height, seed=0):
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def _diffusers_preprocess(img):
    """The klein pipeline's reference path: check, cap at 1024^2, floor to 16, centre crop, 2x - 1."""
    processor = Flux2ImageProcessor(vae_scale_factor=16, vae_latent_channels=32)
    processor.check_image_input(img)
    if img.size[0] * img.size[1] > 1024 * 1024:
        img = processor._resize_to_target_area(img, 1024 * 1024)
    width, height = img.size[0] // 16 * 16, img.size[1] // 16 * 16
    return processor.preprocess(img, height=height, width=width, resize_mode="crop")


@pytest.mark.parametrize("size", [(96, 64), (100, 75), (1500, 900), (1024, 1024), (70, 500)])
def test_matches_diffusers_preprocessing(size):
    img = _image(*size)
    ours, expected = prepare_reference(img), _diffusers_preprocess(img)
    assert ours.shape == expected.shape and ours.shape[-1] % 16 == 0 and ours.shape[-2] % 16 == 0
    torch.testing.assert_close(ours, expected, atol=1e-6, rtol=0)


def test_tensor_input_without_resize_is_cropped_exactly():
    pixels = torch.rand(75, 100, 3)  # ComfyUI IMAGE layout [H, W, 3]
    out = prepare_reference(pixels)
    assert out.shape == (1, 3, 64, 96)
    torch.testing.assert_close(out[0], pixels.permute(2, 0, 1)[:, 5:69, 2:98] * 2 - 1)


def test_tensor_input_over_the_cap_is_scaled_like_an_image():
    # a smooth 400 x 300 8-bit picture (random 40 x 30 colours, enlarged bicubically), as a float [3, H, W]
    small = Image.fromarray(np.random.default_rng(3).integers(0, 256, (30, 40, 3), dtype=np.uint8))
    picture = small.resize((400, 300), Image.Resampling.BICUBIC)
    pixels = torch.from_numpy(np.array(picture)).permute(2, 0, 1).float() / 255
    out = prepare_reference(pixels, max_pixels=200 * 150)
    # The image path's cap (BFL's cap_pixels, diffusers' _resize_to_target_area): both sides times
    # sqrt(cap / area) = 1/2, truncated, Lanczos; here on each float channel (PIL "F" mode, no 8-bit
    # rounding), clamped to 0..1; then the centre crop to multiples of 16 (150 -> 144 rows from row 3,
    # 200 -> 192 columns from column 4) and 2x - 1.
    lanczos = Image.Resampling.LANCZOS
    channels = [np.asarray(Image.fromarray(c.numpy()).resize((200, 150), lanczos)) for c in pixels]
    scaled = torch.from_numpy(np.stack(channels)).clamp(0, 1)
    assert out.shape == (1, 3, 144, 192)
    assert torch.equal(out[0], scaled[:, 3:147, 4:196] * 2 - 1)
    # the same picture as a PIL image (8-bit Lanczos) gives the same reference, up to 8-bit rounding
    assert (out - prepare_reference(picture, max_pixels=200 * 150)).abs().max() < 1.5 * 2 / 255


def test_pixel_cap_can_be_raised():
    assert scaled_size(2048, 2048, 1024 * 1024) == (1024, 1024)
    assert scaled_size(2048, 2048, 2024 * 2024) == (2024, 2024)
    assert prepare_reference(_image(1200, 1000), max_pixels=4_000_000).shape == (1, 3, 992, 1200)


@pytest.mark.parametrize(
    "size, message",
    [((48, 200), "both sides must be at least 64 px"), ((1000, 100), "aspect ratio over 8:1: crop it")],
)
def test_clear_errors(size, message):
    with pytest.raises(Flux2Error, match=message):
        prepare_reference(_image(*size))


def test_references_pack_in_order_with_time_offsets():
    a, b = torch.randn(1, 128, 2, 3), torch.randn(1, 128, 4, 2)
    refs = ReferenceLatents.from_latents([a]) + ReferenceLatents.from_latents([b])
    assert len(refs) == 2 and refs.num_tokens == 6 + 8
    assert refs.ids[:6, 0].eq(10).all() and refs.ids[6:, 0].eq(20).all()
    assert refs.ids[6:, 1:3].tolist()[:3] == [[0, 0], [0, 1], [1, 0]]  # each reference on its own grid
    torch.testing.assert_close(refs.latents()[1], b)
    assert refs.pixel_size(1) == (32, 64)


def test_interrupt_is_checked_before_each_reference():
    class Stop(BaseException):
        pass

    encoded = []

    class RecordingVAE:
        def encode(self, pixels, **options):
            encoded.append(pixels.shape)
            return torch.zeros(1, 128, pixels.shape[-2] // 16, pixels.shape[-1] // 16)

    def interrupt():
        if len(encoded) == 1:
            raise Stop

    from flux2_core.references import encode_references

    with pytest.raises(Stop):
        encode_references(RecordingVAE(), [_image(64, 64), _image(80, 64)], interrupt=interrupt)
    assert len(encoded) == 1
