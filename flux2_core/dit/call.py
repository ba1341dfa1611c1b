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
from .attention import GroupedMask, KeyGroup
from .control import Control
from .extrapolation import KV_AND_EXTRAPOLATION, PositionExtrapolation, Positions
from .kv_cache import RefKVCache
from .step_cache import FirstBlockCache

UNPLACED_REFERENCES = (
    "this regional mask does not say which text the references may read: build it with "
    "steering.regions.regional_plan (a RegionalMask) to sample regions together with references"
)


@dataclass(frozen=True, eq=False)
class RegionalMask(GroupedMask):
    """The regional prompts' mask over a call's ``[text; image]`` (``steering.regions.regional_plan``): a
    ``GroupedMask`` that also knows its ``text`` tokens (the joined prompts) and the first ``global_text`` of
    them, the global prompt's (0: none), which every image token reads.

    With references, ``with_references`` gives the mask over ``[text; image; references]`` by the rule of
    ``docs/steering.md``: every query (the global prompt's text, each region's text, every image token)
    reads every reference key, with the references' bias; a reference token reads the global prompt's text,
    every image token and every reference, never a region's text, as an image token outside every region
    does. A region's text is then read by the image inside its mask alone, as without references."""

    text: int = 0
    global_text: int = 0

    def with_references(self, count: int, bias: torch.Tensor | None, cached: bool) -> GroupedMask:
        """The mask over the ``length + count`` tokens ``[text; image; references]`` (the references in that
        order whatever their place in the call): every group reads the references (``bias`` [count] on them,
        None: 0); unless ``cached`` (the 9B-KV model's references are keys only, computed on their own), the
        references form one more group of queries."""
        if count == 0:
            return self
        length = self.length + count
        refs = torch.arange(self.length, length)
        like = next((g.bias for g in self.groups if g.bias is not None), bias)
        dtype = torch.float32 if like is None else like.dtype
        on_refs = torch.zeros(count, dtype=dtype) if bias is None else bias.to("cpu", dtype)

        def biased(own: torch.Tensor | None, keys: int) -> torch.Tensor | None:
            """A group's bias over its keys and then the references' (None: 0 on all of them)."""
            if own is None and bias is None:
                return None
            own = torch.zeros(keys, dtype=dtype) if own is None else own.to("cpu", dtype)
            return torch.cat([own, on_refs])

        groups = []
        for g in self.groups:
            keys = torch.arange(self.length) if g.keys is None else g.keys.cpu()
            groups.append(KeyGroup(g.queries.cpu(), torch.cat([keys, refs]), biased(g.bias, keys.numel())))
        if not cached:
            keys = torch.cat([torch.arange(self.global_text), torch.arange(self.text, self.length)])
            groups.append(KeyGroup(refs, torch.cat([keys, refs]), biased(None, keys.numel())))
        return GroupedMask(length, tuple(groups))


@dataclass(frozen=True, eq=False)
class CallExtras:
    """Every optional input of one DiT call, None when unused:

    - ``references``: (tokens [1 or B, R, C], ids [R, 4]) appended after the noisy tokens (plain klein
      models), or ``kv_cache``: the 9B-KV model's reference K/V (``kv_cache.RefKVCache``), spliced in after
      the text (an empty cache is filled: ``encode_reference_kv``);
    - ``reference_bias`` [R]: added to the logits of every query against each reference key, in every block
      (log of each reference's strength: ``steering.reference_strength``);
    - ``regions``: the regional prompts' mask over ``[text; image]``, a ``RegionalMask``
      (``steering.regions``; with references too, the DiT extends it over them: ``RegionalMask``), or, without
      references, any [L, L] mask or ``GroupedMask``;
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
        referenced = self.references is not None or self.kv_cache is not None
        if referenced and self.regions is not None and not isinstance(self.regions, RegionalMask):
            raise Flux2Error(UNPLACED_REFERENCES)
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
    they are none (and their bias where both are), a control at strength 0 left out (the plain call). A
    regional mask goes with references as it is: the DiT places them in it (``RegionalMask``)."""
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
