"""The command line's progress bars for the VAE's runs, beside the sampling's step bars: a decode or an encode
moves its bar per encoder or decoder stage of each tile (``vae.progress``), in per mille of the work; the
images of a batch, or the references, run one after another on one bar. Like the step bars, shown on a
terminal only."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from tqdm import tqdm

from ..vae.progress import PER_RUN, Progress, split_progress

BAR_FORMAT = "{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]"


@contextlib.contextmanager
def vae_bar(what: str, disable: bool | None = None) -> Iterator[Progress]:
    """A bar named ``what`` for the body's VAE runs, and the progress callback that moves it (its total is
    the one the callback is given: one run's, or ``split_progress``'s for several)."""
    with tqdm(total=PER_RUN, desc=what, bar_format=BAR_FORMAT, disable=disable) as bar:

        def report(done: int, total: int) -> None:
            if bar.total != total:
                bar.total = total
            bar.update(done - bar.n)

        yield report


def decode_each(vae, latents: torch.Tensor, device: torch.device, tiles: dict, what: str = "VAE decode"):
    """``latents`` [B, C, h, w] decoded one image at a time on ``device`` (decoding at full resolution is the
    VAE's memory peak) on one bar: pixels [B, 3, H, W] on the CPU."""
    with torch.inference_mode(), vae_bar(what) as progress:
        parts = split_progress(progress, len(latents))
        return torch.cat(
            [
                vae.decode(item.to(device), **tiles, progress=part).cpu()
                for item, part in zip(latents.split(1), parts)
            ]
        )


def encode(vae, pixels: torch.Tensor, tiles: dict, what: str = "VAE encode") -> torch.Tensor:
    """``vae.encode(pixels, **tiles)`` on a bar: the float32 latent on the CPU."""
    with vae_bar(what) as progress:
        return vae.encode(pixels, **tiles, progress=progress).float().cpu()
