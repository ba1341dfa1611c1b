"""Tiled VAE decoding and encoding: large images in bounded memory.

A tile is a square of ``tile`` pixels; neighbouring tiles share ``overlap`` pixels. Decoding splits the latent
into tiles of ``tile / 16`` cells, decodes one tile at a time and blends the overlaps with a smooth ramp, so
the seams stay invisible; encoding does the same on the pixels and blends the tiles' latents. Only one tile's
activations are alive at a time, beside the float32 result. The VAE's GroupNorms and its mid-block attention
see one tile instead of the whole image, so a tiled result differs slightly from an untiled one everywhere
(not only at the seams); larger tiles are closer.

``tile_size`` None or 0 is automatic: untiled when the untiled estimate fits the memory free on the VAE's
device, otherwise the largest of ``TILE_CHOICES`` whose estimate fits. A negative ``tile_size`` always tiles,
with the automatic size; a positive one is used as it is.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from .. import limits
from ..errors import Flux2Error
from .progress import Meter, Progress

TILE_CHOICES = (1024, 768, 512, 384, 256)  # automatic tile sizes in pixels, largest first
MIN_TILE = 128
DEFAULT_OVERLAP = 64
MAX_TILE = limits.MAX_SIZE


def check_tiling(tile_size: int | None, tile_overlap: int, multiple: int) -> None:
    """Refuse a tile size or overlap the VAE cannot tile with, saying which values work."""
    for name, value in (("tile size", tile_size), ("tile overlap", tile_overlap)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise Flux2Error(f"VAE {name} {value!r} is not a whole number of pixels: use e.g. 512 and 64")
    if tile_overlap < 0 or tile_overlap % multiple:
        raise Flux2Error(
            f"VAE tile overlap {tile_overlap} is not allowed: use 0 or a positive multiple of {multiple} "
            f"pixels (e.g. {DEFAULT_OVERLAP})"
        )
    if tile_size is None or tile_size <= 0:
        return
    if tile_size < MIN_TILE or tile_size > MAX_TILE or tile_size % multiple:
        nearest = min(MAX_TILE, max(MIN_TILE, tile_size // multiple * multiple))
        raise Flux2Error(
            f"VAE tile size {tile_size} is not allowed: use a multiple of {multiple} from {MIN_TILE} to "
            f"{MAX_TILE} pixels (e.g. {nearest}), or 0 for automatic"
        )
    if 2 * tile_overlap >= tile_size:
        raise Flux2Error(
            f"VAE tile overlap {tile_overlap} must be smaller than half the tile size {tile_size}: lower the "
            f"overlap (e.g. {DEFAULT_OVERLAP}) or raise the tile size"
        )


def free_bytes(device: torch.device) -> int | None:
    """Bytes free for activations on ``device``: the driver's free memory plus what PyTorch's CUDA cache holds
    unused (it is reused before the driver is asked), or None when it cannot be told."""
    free = limits.available_memory(device)
    if free is not None and device.type == "cuda":
        try:
            free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        except (RuntimeError, AssertionError):
            pass
    return free


def resolve_tile(
    tile_size: int | None,
    height: int,
    width: int,
    untiled: Callable[[], int],
    tiled: Callable[[int], int],
    free: int | None,
) -> int | None:
    """The tile in pixels a request runs with, or None for untiled (see the module docstring).

    ``untiled()`` and ``tiled(tile)`` are the byte estimates; ``free`` the bytes free (None: unknown, which
    counts as plenty).
    """
    if tile_size is not None and tile_size > 0:
        return None if tile_size >= max(height, width) else tile_size
    forced = tile_size is not None and tile_size < 0
    if not forced and (free is None or untiled() <= free):
        return None
    side = max(height, width)
    choices = [t for t in TILE_CHOICES if t < side] or [min(TILE_CHOICES)]
    for tile in choices:
        if free is None or tiled(tile) <= free:
            return None if tile >= side else tile
    return None if choices[-1] >= side else choices[-1]


def tile_starts(length: int, tile: int, overlap: int) -> list[int]:
    """Start positions of tiles of ``tile`` cells covering ``length`` cells, evenly spread so that neighbours
    share at least ``overlap`` cells (one tile when it covers everything)."""
    if tile >= length:
        return [0]
    stride = tile - overlap
    count = -(-(length - tile) // stride) + 1
    return [round(k * (length - tile) / (count - 1)) for k in range(count)]


def axis_weights(starts: list[int], tile: int, length: int, scale: int) -> list[Tensor]:
    """Per tile, its 1-D blend weight in output units (``scale`` per cell), normalised to sum to 1.

    The weight ramps up smoothly across the cells a tile shares with the previous tile and down across those
    it shares with the next; summing over tiles and dividing makes the blend an exact partition of unity.
    """
    size = min(tile, length) * scale
    weights = []
    for k, start in enumerate(starts):
        w = torch.ones(size, dtype=torch.float64)
        if k > 0:
            ramp = (starts[k - 1] + tile - start) * scale
            w[:ramp] = _smooth_ramp(ramp)
        if k + 1 < len(starts):
            ramp = (start + tile - starts[k + 1]) * scale
            w[size - ramp :] = _smooth_ramp(ramp).flip(0)
        weights.append(w)
    total = torch.zeros(length * scale, dtype=torch.float64)
    for start, w in zip(starts, weights):
        total[start * scale : start * scale + size] += w
    return [(w / total[s * scale : s * scale + size]).float() for s, w in zip(starts, weights)]


def blend_tiles(
    run: Callable[[Tensor], Tensor],
    source: Tensor,
    cells: tuple[int, int],
    tile: int,
    overlap: int,
    in_scale: int,
    out_scale: int,
    out_channels: int,
    device: torch.device,
) -> Tensor:
    """Run ``run`` on overlapping tiles of ``source`` and blend the results into one float32 tensor.

    Positions are in cells (a latent cell: 16 pixels); ``source`` has ``in_scale`` and the result
    ``out_scale`` samples per cell. ``tile`` and ``overlap`` are in cells.
    """
    (rows, cols), batch = cells, source.shape[0]
    out = torch.zeros(batch, out_channels, rows * out_scale, cols * out_scale, device=device)
    ys, xs = tile_starts(rows, tile, overlap), tile_starts(cols, tile, overlap)
    wys = axis_weights(ys, tile, rows, out_scale)
    wxs = axis_weights(xs, tile, cols, out_scale)
    for y, wy in zip(ys, wys):
        for x, wx in zip(xs, wxs):
            piece = source[..., y * in_scale : (y + tile) * in_scale, x * in_scale : (x + tile) * in_scale]
            result = run(piece).float()
            weight = wy.to(device)[:, None] * wx.to(device)[None, :]
            h, w = result.shape[-2:]
            out[..., y * out_scale : y * out_scale + h, x * out_scale : x * out_scale + w] += result * weight
            del result, weight
    return out


def tiled_decode_memory(vae, height: int, width: int, tile: int, overlap: int = DEFAULT_OVERLAP) -> int:
    """Peak bytes of a tiled decode of one ``width x height`` image: one tile's decoder activations, and the
    float32 result three times over (the accumulator, and the checks and copies made of it)."""
    th, tw = min(tile, height), min(tile, width)
    result = vae.config.out_ch * height * width * 4
    return vae.decode_memory(th, tw) + 3 * result + (vae.config.out_ch + 1) * th * tw * 4


def tiled_encode_memory(vae, height: int, width: int, tile: int, overlap: int = DEFAULT_OVERLAP) -> int:
    """Peak bytes of a tiled encode of one ``width x height`` image: one tile's encoder activations and
    pixels, and the float32 latent."""
    th, tw = min(tile, height), min(tile, width)
    latent = vae.latent_channels * (height // vae.downscale) * (width // vae.downscale) * 4
    itemsize = torch.finfo(vae.dtype).bits // 8
    return vae.encode_memory(th, tw) + latent * 2 + vae.config.in_channels * th * tw * itemsize


def decode(
    vae, latent: Tensor, tile_size: int | None, tile_overlap: int, decode_one: Callable,
    progress: Progress | None = None,
) -> Tensor:  # fmt: skip
    """Decode ``latent`` in tiles as ``tile_size`` asks, through ``decode_one(piece, after)`` (the untiled
    decode of a latent piece, returning float32 pixels, ``after(cost)`` called after each decoder stage);
    ``progress`` as ``vae.progress`` says."""
    rows, cols = latent.shape[-2:]
    height, width = rows * vae.downscale, cols * vae.downscale
    return _tiled(
        vae, decode_one, latent, (height, width), tile_size, tile_overlap, (1, vae.downscale),
        vae.config.out_ch,
        lambda: vae.decode_memory(height, width),
        lambda t: tiled_decode_memory(vae, height, width, t, tile_overlap),
        vae.decode_work, progress,
    )  # fmt: skip


def encode(
    vae, pixels: Tensor, tile_size: int | None, tile_overlap: int, encode_one: Callable,
    progress: Progress | None = None,
) -> Tensor:  # fmt: skip
    """Encode ``pixels`` in tiles as ``tile_size`` asks, through ``encode_one(piece, after)`` (the untiled
    encode of a pixel piece to the float32 latent, ``after(cost)`` called after each encoder stage)."""
    height, width = pixels.shape[-2:]
    return _tiled(
        vae, encode_one, pixels, (height, width), tile_size, tile_overlap, (vae.downscale, 1),
        vae.latent_channels,
        lambda: vae.encode_memory(height, width),
        lambda t: tiled_encode_memory(vae, height, width, t, tile_overlap),
        vae.encode_work, progress,
    )  # fmt: skip


def _tiled(
    vae, run, source, size, tile_size, overlap, scales, channels, whole_memory, tiled_memory, work, progress
) -> Tensor:
    """``run`` on the whole of ``source`` or on blended tiles of it, as ``tile_size`` and the free memory say.

    ``size`` is the image's (height, width) in pixels; ``scales`` the samples per latent cell of the source
    and of the result; the memory callables give one image's bytes (untiled, and tiled with a given tile);
    ``work(h, w)`` the stage costs' sum on a source piece of ``h x w`` samples, which ``progress`` counts.
    """
    factor, batch = vae.downscale, source.shape[0]
    check_tiling(tile_size, overlap, factor)
    tile = resolve_tile(
        tile_size,
        *size,
        lambda: whole_memory() * batch,
        lambda t: tiled_memory(t) * batch,
        free_bytes(vae.device),
    )
    meter = None if progress is None else Meter(progress)
    after = None if meter is None else meter.advance
    cells = (size[0] // factor, size[1] // factor)
    if tile is None:
        if meter is not None:
            meter.begin(work(*source.shape[-2:]))
        result = run(source, after)
    else:
        t, o, scale = tile // factor, overlap // factor, scales[0]
        if meter is not None:  # every tile has the same size: the tiles cover the image, none passes its edge
            tiles = len(tile_starts(cells[0], t, o)) * len(tile_starts(cells[1], t, o))
            meter.begin(tiles * work(min(t, cells[0]) * scale, min(t, cells[1]) * scale))
        result = blend_tiles(
            lambda piece: run(piece, after), source, cells, t, o, *scales, channels, vae.device
        )
    if meter is not None:
        meter.end()
    return result


def _smooth_ramp(n: int) -> Tensor:
    """n values rising from near 0 to near 1 (smoothstep at the sample centres); ramp(n) + flipped = 1."""
    t = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    return t * t * (3 - 2 * t)
