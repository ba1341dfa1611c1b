"""Tiled refinement: an enlarged image refined by klein in tiles, without seams and in any tile order.

One latent canvas and one noise field for the whole picture (the noise of a plain run at the canvas size).
At every step every tile is denoised as an img2img edit of its window: its noisy tokens are the canvas's
window, its reference (reference 1, time offset 10) is the same window of the encoded enlarged image, so the
reference is pixel-aligned with the tile at tile resolution on klein's 16-pixel grid. Both sit at tile-local
positions starting at 0, as in a plain edit at the tile's size (the positions the model knows). The tiles'
velocities are blended where they overlap with smooth weights that sum to 1 at every cell (raised-cosine
ramps over the overlap, divided by their sum), and only then is the Euler step taken on the canvas. So
there are no seams to hide and nothing depends on the order of the tiles (the weighted sum is formed in one
fixed order); no colour matching is needed either: every tile is steered by the image's own pixels and no
tile is pasted over another.

The schedule is BFL's for the tile's token count (the size the model denoises at each call); one tile that
covers the canvas is a plain img2img of the image with itself as reference 1, bit for bit, and denoise 0
returns the encoded image.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..configs import FLUX2
from ..denoiser import Flux2Denoiser
from ..dit.transformer import Flux2Model
from ..errors import Flux2Error
from ..flow import StepCallback, euler, make_noise, pack, skipped_steps, start_from, truncate, unpack
from ..limits import MAX_SIZE, check_request
from ..references import ReferenceLatents
from ..sampling import (
    NAN_CAUSES,
    SampleRequest,
    SampleSettings,
    check_conditioning,
    encode_reference_kv,
    estimate_memory,
    get_sigmas,
)
from ..sampling import model_run as _model_run
from ..sampling_checks import check_finite, check_strength

DEFAULT_TILE, DEFAULT_OVERLAP = 1024, 128
MIN_TILE = 256
CANVAS_COPIES = 6  # canvas-sized float32 latents held at once: x, noise, source, the blend, the tiles' output


@dataclass(frozen=True)
class TileGrid:
    """The tiles of a canvas of ``shape`` (rows, columns) tokens: windows of at most ``tile`` tokens a side
    sharing at least ``overlap`` with their neighbours, spread evenly."""

    shape: tuple[int, int]
    tile: int
    overlap: int

    @property
    def spans(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        return _spans(self.shape[0], self.tile, self.overlap), _spans(self.shape[1], self.tile, self.overlap)

    def windows(self) -> list[tuple[slice, slice]]:
        rows, cols = self.spans
        return [(slice(*r), slice(*c)) for r in rows for c in cols]

    def weights(self) -> list[torch.Tensor]:
        """Each window's blend weights [h, w] float32: raised-cosine ramps over the overlap at inner edges,
        divided by their sum over the tiles (so they sum to 1 at every cell; one tile: exactly 1)."""
        (height, width), ramp = self.shape, self.overlap
        raw = [
            _profile(rows, height, ramp)[:, None] * _profile(cols, width, ramp)[None]
            for rows, cols in self.windows()
        ]
        total = torch.zeros(self.shape, dtype=torch.float64)
        for (rows, cols), w in zip(self.windows(), raw):
            total[rows, cols] += w
        return [(w / total[rows, cols]).float() for (rows, cols), w in zip(self.windows(), raw)]


def tile_grid(width: int, height: int, tile_size: int, tile_overlap: int) -> TileGrid:
    """The grid of ``tile_size`` px tiles sharing ``tile_overlap`` px over a ``width x height`` canvas."""
    m = FLUX2.size_multiple
    if not isinstance(tile_size, int) or tile_size % m or not MIN_TILE <= tile_size <= MAX_SIZE:
        raise Flux2Error(
            f"tile size {tile_size} px is not allowed: use a multiple of {m} from {MIN_TILE} to {MAX_SIZE} "
            f"(e.g. {DEFAULT_TILE}, klein's native size)"
        )
    if not isinstance(tile_overlap, int) or tile_overlap < 0 or tile_overlap % m:
        raise Flux2Error(f"tile overlap {tile_overlap} px is not allowed: use a multiple of {m}, 0 or more")
    if tile_size < 2 * tile_overlap:
        raise Flux2Error(
            f"tile size {tile_size} px is smaller than twice the tile overlap {tile_overlap} px: use a tile "
            f"of at least {2 * tile_overlap} px or an overlap of at most {tile_size // 2} px"
        )
    return TileGrid((height // m, width // m), tile_size // m, tile_overlap // m)


def _spans(length: int, tile: int, overlap: int) -> list[tuple[int, int]]:
    if length <= tile:
        return [(0, length)]
    count = math.ceil((length - overlap) / (tile - overlap))
    return [(s, s + tile) for s in (round(i * (length - tile) / (count - 1)) for i in range(count))]


def _profile(span: slice, length: int, ramp: int) -> torch.Tensor:
    """1 inside, rising over ``ramp`` cells from an inner edge (never 0: the blend divides by the sum)."""
    start, stop = span.start, span.stop
    weights = torch.ones(stop - start, dtype=torch.float64)
    if ramp:
        rise = 0.5 - 0.5 * torch.cos(math.pi * (torch.arange(ramp, dtype=torch.float64) + 0.5) / ramp)
        if start > 0:
            weights[:ramp] = rise
        if stop < length:
            weights[-ramp:] = torch.minimum(weights[-ramp:], rise.flip(0))
    return weights


@dataclass(frozen=True, eq=False)
class TiledRefine:
    """One tiled refinement of ``source`` (the enlarged image's latent [1, 128, H/16, W/16]) by ``model``:
    the prompt ``positive`` (and ``negative`` with true CFG), ``steps`` of the schedule of which the last
    ``strength`` run, the ``seed`` of the canvas's noise, tiles of ``tile_size`` px sharing ``tile_overlap``
    px. Checked whole when made."""

    model: Flux2Model
    positive: torch.Tensor
    source: torch.Tensor
    steps: int
    strength: float
    seed: int
    tile_size: int = DEFAULT_TILE
    tile_overlap: int = DEFAULT_OVERLAP
    negative: torch.Tensor | None = None
    guidance: float = 1.0
    callback: StepCallback | None = None
    interrupt: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if self.source.ndim != 4 or self.source.shape[:2] != (1, FLUX2.latent_channels):
            raise Flux2Error(
                f"the image's latent has shape {list(self.source.shape)}, not [1, 128, height/16, width/16]: "
                "refine one image at a time, encoded by the FLUX.2 VAE"
            )
        check_strength(self.strength, "denoise")
        check_request(self.width, self.height, self.steps, self.guidance, self.seed, 1)
        grid = tile_grid(self.width, self.height, self.tile_size, self.tile_overlap)
        check_conditioning(self.model, self.positive)
        if skipped_steps(self.steps, self.strength) < self.steps:  # denoise 0 runs no step: the image as is
            self.tile_request(grid.windows()[0])  # the negative prompt, the variant's references

    @property
    def width(self) -> int:
        return self.source.shape[-1] * FLUX2.size_multiple

    @property
    def height(self) -> int:
        return self.source.shape[-2] * FLUX2.size_multiple

    @property
    def grid(self) -> TileGrid:
        return tile_grid(self.width, self.height, self.tile_size, self.tile_overlap)

    def tile_request(self, window: tuple[slice, slice], kv_cache=None) -> SampleRequest:
        """The plain img2img request of one tile: its window of the image as start and as reference 1."""
        crop = self.source[..., window[0], window[1]]
        m = FLUX2.size_multiple
        settings = SampleSettings(
            crop.shape[-1] * m, crop.shape[-2] * m, self.steps, self.guidance, self.seed
        )
        return SampleRequest(
            self.model, self.positive, settings, negative=self.negative, start=crop, strength=self.strength,
            references=ReferenceLatents.from_latents([crop]), kv_cache=kv_cache,
        )  # fmt: skip


def tiled_memory(request: TiledRefine) -> int:
    """Rough peak bytes beyond the weights: one tile's run (with its reference) plus the canvas's latents;
    the tile's part does not grow with the canvas."""
    rows, cols = (min(side, request.grid.tile) for side in request.grid.shape)
    settings = SampleSettings(cols * FLUX2.size_multiple, rows * FLUX2.size_multiple, 1, request.guidance, 0)
    canvas = request.source[0].numel() * 4 * CANVAS_COPIES
    return estimate_memory(request.model, settings, rows * cols) + canvas


def tiled_refine(request: TiledRefine, order: list[int] | None = None) -> torch.Tensor:
    """The refined latent [1, 128, H/16, W/16] (float32, CPU). ``order``: the order the tiles run in at each
    step (default row by row); any order gives the same result."""
    model, grid = request.model, request.grid
    windows, weights = grid.windows(), grid.weights()
    order = list(range(len(windows))) if order is None else list(order)
    if sorted(order) != list(range(len(windows))):
        raise Flux2Error(f"the tile order {order} is not an order of the {len(windows)} tiles")
    device = model.transformer.device
    largest = max((w[0].stop - w[0].start) * (w[1].stop - w[1].start) for w in windows)
    schedule = get_sigmas(request.steps, largest).tolist()
    sigmas = truncate(schedule, request.strength)
    if len(sigmas) == 1:  # no step runs
        return request.source.float().cpu().clone()
    noise = pack(make_noise(1, request.height, request.width, request.seed)).to(device)
    source = pack(request.source.float()).to(device)
    whole = len(windows) == 1
    weights = [w.to(device) for w in weights]

    def velocity(x: torch.Tensor, sigma: float) -> torch.Tensor:
        canvas = unpack(x, *grid.shape)
        found = {}
        for k in order:
            rows, cols = windows[k]
            tokens = x if whole else pack(canvas[..., rows, cols])
            found[k] = unpack(
                _tile_velocity(request, windows[k], schedule)(tokens, sigma), *_size(windows[k])
            )
        blended = torch.zeros_like(canvas)
        for k, (rows, cols) in enumerate(windows):  # one fixed order of the sum, whatever ran first
            blended[..., rows, cols] += weights[k] * found.pop(k)
        return pack(blended)

    x = start_from(noise, source, sigmas[0])
    report = None
    if request.callback is not None:
        report = lambda step, total, x0: request.callback(step, total, unpack(x0, *grid.shape))  # noqa: E731
    with _model_run(model, request.interrupt):
        x = euler(velocity, x, sigmas, report)
    check_finite(x, NAN_CAUSES)
    return unpack(x, *grid.shape).cpu()


def _size(window: tuple[slice, slice]) -> tuple[int, int]:
    return window[0].stop - window[0].start, window[1].stop - window[1].start


def _tile_velocity(request: TiledRefine, window, schedule) -> Flux2Denoiser:
    """One tile's denoiser for this call (built per call, so nothing of a tile stays between tiles)."""
    plain = request.tile_request(window)
    kv_cache = None
    if request.model.variant.kv_cache:
        kv_cache = encode_reference_kv(request.model, plain.references)
    return Flux2Denoiser(plain, schedule, kv_cache)
