"""Regional prompts: a global prompt plus any number of (prompt, mask) regions, joined on the text axis.

Each prompt is encoded on its own; the sampler joins the encodings, ``[global; region 1; region 2; ...]``,
and restricts the joint attention over ``[text; image]`` with one mask, built once per run at latent
resolution and used in every block and step of the positive pass (negative / unconditional passes stay
unmasked). Who attends to whom (a query row against a key column):

- the global prompt's text: itself and every image token (as in a plain run);
- a region's text: itself and the image tokens inside its mask;
- an image token: every image token, the global prompt's text, and the text of each region whose mask holds
  it (with the region's ``strength`` s, as for references, its logits against that text get + log(s)).

Image tokens attend to each other everywhere, across region borders: the regions' content is placed by the
text each image token reads, while the picture stays one coherent image (restricting image-to-image attention
as well leaves visible seams at the borders, and InvokeAI's FLUX.1 rule keeps it whole too). The text of two
prompts never mixes.

With reference images (``dit.call.RegionalMask.with_references``, applied by the DiT): every query (each
prompt's text, every image token) also reads every reference, with the references' strength bias; a
reference token reads the global prompt's text, every image token and every reference, never a region's
text (as an image token outside every region), so no region's prompt reaches the whole picture through the
references. The 9B-KV model's cached reference keys are read the same way and read nothing. Reasons and
the measured leak: ``docs/steering.md``.

Exact cases, by construction: with no global prompt, one region whose mask covers the whole image is the
plain run of its prompt (no mask is formed); a region whose mask is empty at latent resolution (or whose
strength is 0) is left out, so a global prompt plus an empty region is the plain run of the global prompt.
A mask pixel counts for a latent token when at least half of the token's 16 x 16 pixels are white (area
average >= 0.5).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..dit.attention import KeyGroup
from ..dit.call import RegionalMask
from ..errors import Flux2Error
from .reference_strength import check_strength

log = logging.getLogger("flux2_core")


@dataclass(frozen=True, eq=False)  # compared by identity: its fields are tensors
class Region:
    """One region: its prompt's encoding [1, T, C] and its mask [H, W] (1 = the region), any resolution."""

    embeds: torch.Tensor
    mask: torch.Tensor
    strength: float = 1.0

    def __post_init__(self) -> None:
        check_strength(self.strength, "region strength", "leave the region out")
        if self.embeds.ndim != 3 or self.embeds.shape[0] != 1:
            raise Flux2Error(
                f"a region's conditioning has shape {list(self.embeds.shape)}, not [1, tokens, width]: "
                "encode one prompt per region"
            )
        if self.mask.ndim not in (2, 3) or (self.mask.ndim == 3 and self.mask.shape[0] != 1):
            raise Flux2Error(
                f"a region's mask has shape {list(self.mask.shape)}, not [height, width]: give one mask"
            )
        if self.mask.numel() == 0:
            raise Flux2Error(
                f"a region's mask is {self.mask.shape[-1]}x{self.mask.shape[-2]} pixels: give a mask with "
                "the region painted white"
            )


@dataclass(frozen=True, eq=False)
class RegionalPrompt:
    """The global prompt's encoding [1 or B, T0, C] (T0 = 0: none) and the regions, in order."""

    global_embeds: torch.Tensor
    regions: tuple[Region, ...]

    def add(self, region: Region) -> RegionalPrompt:
        if region.embeds.shape[-1] != self.global_embeds.shape[-1]:
            raise Flux2Error(
                f"the region's conditioning is {region.embeds.shape[-1]} wide, the rest "
                f"{self.global_embeds.shape[-1]}: encode every prompt with the same text encoder"
            )
        return RegionalPrompt(self.global_embeds, (*self.regions, region))

    @property
    def has_global(self) -> bool:
        return self.global_embeds.shape[1] > 0

    @property
    def token_counts(self) -> list[int]:
        """The text tokens of each prompt, the global prompt's first (0: none)."""
        return [self.global_embeds.shape[1], *(r.embeds.shape[1] for r in self.regions)]


def regional_cost(
    text_tokens: list[int],
    grid: tuple[int, int],
    hidden: int,
    itemsize: int,
    batch: int = 1,
    ref_tokens: int = 0,
) -> tuple[int, int]:
    """(text tokens of the joined prompts, bytes the grouped attention gathers at once) at ``grid``, from the
    prompts' token counts (the global prompt's first; 0 for none) and the references' tokens before any mask
    is read: the most a run can need. The largest gathers are one group's keys and values (at most every
    token, the references' included) and its queries and output (at most every image token, or every
    reference token: the references' own group), ``hidden`` wide."""
    n_img = grid[0] * grid[1]
    gathered = 2 * (sum(text_tokens) + n_img + ref_tokens) + 2 * max(n_img, ref_tokens)
    return sum(text_tokens), batch * gathered * hidden * itemsize


def latent_region_mask(mask: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """[rows * cols] bool: the latent tokens a pixel mask covers (area average >= 0.5)."""
    m = mask.float().reshape(1, 1, *mask.shape[-2:])
    return (F.interpolate(m, size=grid, mode="area")[0, 0] >= 0.5).flatten()


def regional_plan(prompt: RegionalPrompt, grid: tuple[int, int], dtype, device):
    """(the joined text conditioning [B, T, C], the attention mask over ``[text; image]`` as a
    ``RegionalMask``, or None when the run is a plain one). A call with references extends it over them
    (``RegionalMask.with_references``; the rule is in the module docstring).

    The mask comes factored: the global prompt's text is one group of queries (keys: itself and every image
    token), each region's text another (itself and the image tokens inside its mask), and the image tokens
    fall into one group per set of regions holding them (the global text, the text of those regions, with
    + log(strength) where a strength is not 1, and every image token). Attention then runs group by group on
    those keys: no [L, L] matrix, and no work on the keys a query cannot see."""
    glob = prompt.global_embeds
    kept = []
    for k, region in enumerate(prompt.regions):
        if region.strength == 0:
            continue
        inside = latent_region_mask(region.mask, grid)
        if bool(inside.any()):
            kept.append((region, inside))
        else:
            log.warning(
                "region %d of %d covers no 16 x 16 token at %dx%d (a token is in it when at least half of it "
                "is white): left out", k + 1, len(prompt.regions), grid[1] * 16, grid[0] * 16,
            )  # fmt: skip
    if not kept:
        if not prompt.has_global:
            raise Flux2Error(
                "no prompt is left: every region's mask is empty at this size (or its strength 0) and there "
                "is no global prompt; paint the masks, or connect a global prompt"
            )
        return glob, None
    batch = glob.shape[0]
    texts = [glob] + [r.embeds.to(glob).expand(batch, -1, -1) for r, _ in kept]
    context = torch.cat(texts, dim=1)
    if not prompt.has_global and len(kept) == 1 and bool(kept[0][1].all()) and kept[0][0].strength == 1.0:
        return context, None  # one region over the whole image: the plain run of its prompt
    t0, num_txt = glob.shape[1], context.shape[1]
    image = torch.arange(num_txt, num_txt + grid[0] * grid[1])
    spans, start = [], t0
    for region, _ in kept:
        spans.append(torch.arange(start, start + region.embeds.shape[1]))
        start += region.embeds.shape[1]
    groups = []
    if t0 > 0:
        groups.append(KeyGroup(torch.arange(t0), torch.cat([torch.arange(t0), image])))
    for span, (_, inside) in zip(spans, kept):
        groups.append(KeyGroup(span, torch.cat([span, image[inside]])))
    holders = torch.stack([inside for _, inside in kept], dim=1)  # [image tokens, regions]
    sets, which = torch.unique(holders, dim=0, return_inverse=True)
    for n, held in enumerate(sets.tolist()):
        keys, bias = [torch.arange(t0)], [torch.zeros(t0)]
        for span, (region, _), inside in zip(spans, kept, held):
            if inside:
                keys.append(span)
                bias.append(torch.full((span.numel(),), math.log(region.strength)))
        keys, bias = torch.cat([*keys, image]), torch.cat([*bias, torch.zeros(image.numel())])
        groups.append(KeyGroup(image[which == n], keys, None if bool((bias == 0).all()) else bias.to(dtype)))
    on_device = RegionalMask(num_txt + image.numel(), tuple(groups)).to(device)
    return context, RegionalMask(on_device.length, on_device.groups, num_txt, t0)
