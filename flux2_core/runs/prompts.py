"""A prompt as a host hands it to a run: its conditioning, the regional prompt it may be, and the FLUX.2 [dev]
Fun ControlNet it may carry, whose context is built only once the run's output size is known."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..dit.control import Flux2ControlNet
from ..errors import Flux2Error
from ..steering.control_image import AppliedControl, control_context, control_output_size
from ..steering.regions import RegionalPrompt
from ..vae.autoencoder import AutoEncoder


@dataclass(frozen=True, eq=False)
class ControlSource:
    """The Fun ControlNet as a prompt carries it: the net, the VAE that encodes its maps, the control map
    [1, 3, H, W] in 0..1 (for the inpaint mode also the mask [H, W], 1 = regenerate, and the picture to
    inpaint [1, 3, H, W]), the strength and the fraction of the steps it acts on (``start`` to ``end``).
    ``applied`` builds its context at a run's output size; ``load_vae`` is what a host does first (move the
    VAE to its device). Checked when made."""

    net: Flux2ControlNet
    vae: AutoEncoder
    control: torch.Tensor | None
    mask: torch.Tensor | None = None
    image: torch.Tensor | None = None
    strength: float = 0.75
    start: float = 0.0
    end: float = 1.0
    load_vae: Callable[[], None] | None = None

    def __post_init__(self) -> None:
        if self.start >= self.end:
            raise Flux2Error(
                f"control start {self.start} is not before its end {self.end}: the control would steer no "
                "step; use start < end"
            )
        if self.image is not None and self.mask is None:
            raise Flux2Error("the inpaint mode needs a mask with its image: connect the mask too")
        for name in ("strength", "start", "end"):
            object.__setattr__(self, name, float(getattr(self, name)))

    def output_size(self) -> tuple[int, int] | None:
        """(width, height) the maps give a run nothing else sizes (``control_output_size``)."""
        return control_output_size(self.control, self.image)

    def applied(self, height: int, width: int) -> AppliedControl:
        """The control at a run's output size: its maps encoded by the VAE into the control context."""
        if self.load_vae is not None:
            self.load_vae()
        with torch.inference_mode():
            context = control_context(self.vae, height, width, self.control, self.mask, self.image)
        return AppliedControl(self.net, context, self.strength, self.start, self.end)


@dataclass(frozen=True, eq=False)
class Prompt:
    """One prompt: its conditioning ``embeds`` [1, T, C] (with ``regions``, the global prompt's: [1, 0, C]
    for none), the ``RegionalPrompt`` it may be, and the ``ControlSource`` it may carry."""

    embeds: torch.Tensor
    regions: RegionalPrompt | None = None
    control: ControlSource | None = None

    def check_negative(self) -> None:
        """A negative prompt is one plain prompt: regions and the ControlNet go on the positive one."""
        if self.regions is not None:
            raise Flux2Error("the negative prompt cannot be regional: connect one FLUX.2 Text Encode to it")
        if self.control is not None:
            raise Flux2Error("connect FLUX.2 [dev] Apply ControlNet to the positive prompt (it steers both)")

    def check_plain(self, what: str, name: str) -> None:
        """Refuse regions and the ControlNet where ``what`` takes a plain prompt (its ``name`` input)."""
        if self.regions is not None or self.control is not None:
            raise Flux2Error(
                f"{what} takes a plain {name} prompt: connect FLUX.2 Text Encode (regional prompts and the "
                "ControlNet run on the FLUX.2 Sampler)"
            )
