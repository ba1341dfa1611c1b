"""The progress of a VAE run, for a host's progress bar: ``progress(done, total)`` calls.

A run (one ``AutoEncoder.decode`` or ``encode`` call, tiled or not) counts ``PER_RUN`` units. Its work is
known before it starts: the encoder's or decoder's stages (``blocks.Stage``: a resnet block, the attention,
an up- or downsampling, the input and output convs), for every tile, each weighed by its multiply-adds, so the
count moves about evenly in time (the full-resolution stages are the slow ones). ``progress(0, PER_RUN)``
comes first, before any work, then one call after every stage, the last one ``(PER_RUN, PER_RUN)``; ``done``
never goes down. The callback may raise to stop the run (a host's cancel): the exception goes up unchanged,
between two stages. The stages are the modules' own calls in their own order, so a run with a callback gives
the same pixels and latents, bit for bit, as one without.

Several runs one after another (the images of a batch, decoded one at a time) share one bar through
``split_progress``.
"""

from __future__ import annotations

from collections.abc import Callable

Progress = Callable[[int, int], None]
"""``progress(done, total)``: ``done`` units of ``total`` are finished."""

PER_RUN = 1000  # units one run counts, whatever its size: per mille


class Meter:
    """Turns a run's stage costs into ``progress`` calls: ``begin(total_cost)``, then ``advance(cost)``
    after each stage (the costs adding up to ``total_cost``)."""

    def __init__(self, progress: Progress):
        self.progress = progress
        self.total = self.done = 0

    def begin(self, total_cost: int) -> None:
        self.total, self.done = max(total_cost, 1), 0
        self.progress(0, PER_RUN)

    def advance(self, cost: int) -> None:
        self.done = min(self.done + cost, self.total)
        self.progress(PER_RUN * self.done // self.total, PER_RUN)

    def end(self) -> None:
        """Report the whole run done (the stages' costs may round short of it, or be 0)."""
        if self.done < self.total:
            self.advance(self.total - self.done)


def split_progress(progress: Progress | None, count: int) -> list[Progress | None]:
    """One callback per run of ``count`` runs made one after another, reporting to ``progress`` as one
    count of ``count * PER_RUN`` (run k's units after run k - 1's); ``count`` Nones without ``progress``."""
    if progress is None:
        return [None] * count

    def part(k: int) -> Progress:
        return lambda done, total: progress(k * total + done, count * total)

    return [part(k) for k in range(count)]
