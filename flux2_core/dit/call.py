"""What one DiT call carries besides its noisy tokens, their ids, the time and the text: ``CallExtras``,
built by ``call_extras`` for every caller (the FLUX.2 sampler's denoiser, the native-graph bridge, FLUX.1
Fill's sampler, the tiled refine), and read by the DiT where each part is used.

A new per-call option is a field here, its own module (what it computes), the node and the CLI; nothing in
between changes (``docs/architecture.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import Flux2Error
from .attention import GroupedMask
from .control import Control
from .extrapolation import KV_AND_EXTRAPOLATION, PositionExtrapolation, Positions
from .kv_cache import RefKVCache
from .step_cache import FirstBlockCache

REGIONS_AND_REFERENCES = (
    "regional prompts and reference images cannot be combined: remove the references, or the regions (use "
    "one prompt)"
)


@dataclass(frozen=True, eq=False)
class CallExtras:
    """Every optional input of one DiT call, None when unused:

    - ``references``: (tokens [1 or B, R, C], ids [R, 4]) appended after the noisy tokens (plain klein
      models), or ``kv_cache``: the 9B-KV model's reference K/V (``kv_cache.RefKVCache``), spliced in after
      the text (an empty cache is filled: ``encode_reference_kv``);
    - ``reference_bias`` [R]: added to the logits of every query against each reference key, in every block
      (log of each reference's strength: ``steering.reference_strength``);
    - ``regions``: the regional prompts' mask over ``[text; image]``, [L, L] or a ``GroupedMask``
      (``steering.regions``);
    - ``control``: the Fun ControlNet's net, context and strength (``control.Control``);
    - ``positions``: the image tokens' extrapolated RoPE positions (``extrapolation.Positions``);
    - ``step_cache``: this pass's First-Block Cache (``step_cache.FirstBlockCache``);
    - ``guidance`` [B]: the embedded guidance value (FLUX.2 [dev], FLUX.1);
    - ``pooled`` [B, 768]: CLIP's pooled vector (FLUX.1).
    """

    references: tuple[torch.Tensor, torch.Tensor] | None = None
    kv_cache: RefKVCache | None = None
    reference_bias: torch.Tensor | None = None
    regions: torch.Tensor | GroupedMask | None = None
    control: Control | None = None
    positions: Positions | None = None
    step_cache: FirstBlockCache | None = None
    guidance: torch.Tensor | None = None
    pooled: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.regions is not None and (self.references is not None or self.kv_cache is not None):
            raise Flux2Error(REGIONS_AND_REFERENCES)
        if self.kv_cache is not None and self.positions is not None:
            raise Flux2Error(KV_AND_EXTRAPOLATION)


NO_EXTRAS = CallExtras()


def check_extras(extras) -> None:
    """A DiT call's fifth argument is its ``CallExtras`` (the text ids are no longer passed: the model makes
    them)."""
    if not isinstance(extras, CallExtras):
        raise TypeError(
            "a DiT call takes (x, x_ids, t, ctx, extras) with extras a CallExtras (dit.call.call_extras), "
            f"not {type(extras).__name__}: the model makes the text ids; references and guidance go in the "
            "extras"
        )


def call_extras(
    *,
    references: tuple[torch.Tensor, torch.Tensor] | None = None,
    kv_cache: RefKVCache | None = None,
    reference_bias: torch.Tensor | None = None,
    regions: torch.Tensor | GroupedMask | None = None,
    control: Control | None = None,
    extrapolation: PositionExtrapolation | None = None,
    sigma: float = 1.0,
    grid: tuple[int, int] | None = None,
    step_cache: FirstBlockCache | None = None,
    guidance: torch.Tensor | None = None,
    pooled: torch.Tensor | None = None,
) -> CallExtras:
    """The record of one call at noise level ``sigma`` on a latent ``grid`` (rows, columns): the position
    extrapolation resolved for that call, the references' tokens left out where their K/V are cached or
    they are none (and their bias where both are), a control at strength 0 left out (the plain call)."""
    if kv_cache is not None or (references is not None and references[0].shape[1] == 0):
        references = None
    if references is None and kv_cache is None:
        reference_bias = None  # a bias on reference keys that are not there
    if control is not None and not control.strength:
        control = None
    positions = None
    if extrapolation is not None:
        if grid is None:
            raise ValueError("position extrapolation needs the call's latent grid")
        positions = extrapolation.at(sigma, grid)
    return CallExtras(
        references, kv_cache, reference_bias, regions, control, positions, step_cache, guidance, pooled
    )
