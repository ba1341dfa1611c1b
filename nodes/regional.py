"""Flux2KleinRegionalPrompt: a prompt for a part of the picture, chained onto a global prompt or onto earlier
regions (``flux2_core.steering.regions`` has the rule)."""

from __future__ import annotations

from ..flux2_core import MAX_REFERENCE_STRENGTH, Flux2Error, Region, RegionalPrompt
from . import sockets, types
from .aliases import KLEIN
from .sockets import io

STRENGTH_TOOLTIP = (
    "How much the image inside the mask follows this region's prompt: its attention logits against the "
    "region's text get + log(strength). 1 is plain, 0 leaves the region out."
)


class Flux2KleinRegionalPrompt(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="Flux2KleinRegionalPrompt",
            search_aliases=[*KLEIN, "regional", "region", "area prompt", "mask prompt", "区域提示词"],
            display_name="FLUX.2 Regional Prompt",
            category="flux2_klein/conditioning",
            description=(
                "Puts a prompt into one part of the picture: the region's text reaches only the image inside "
                "its mask, and that image reads it. Chain several onto a global prompt (which the whole "
                "picture reads); the FLUX.2 Sampler joins them. Reference images work with regions: the "
                "whole picture reads them, and they read no region's prompt. The negative prompt stays one "
                "plain prompt."
            ),
            inputs=[
                sockets.Conditioning.Input("region", tooltip="The region's prompt, from FLUX.2 Text Encode."),
                io.Mask.Input(
                    "mask", tooltip="Where the region is: white = the region (any size; it is scaled)."
                ),
                sockets.Conditioning.Input(
                    "conditioning",
                    optional=True,
                    tooltip="The conditioning so far: a global prompt (FLUX.2 Text Encode) or earlier "
                    "regions. Without it this region starts the chain, with no global prompt.",
                ),
                io.Float.Input(
                    "strength",
                    optional=True,
                    default=1.0,
                    min=0.0,
                    max=MAX_REFERENCE_STRENGTH,
                    step=0.05,
                    tooltip=STRENGTH_TOOLTIP,
                ),  # fmt: skip
            ],
            outputs=[
                sockets.Conditioning.Output(
                    display_name="conditioning",
                    tooltip="The regions so far, for the sampler's positive input or another Regional "
                    "Prompt.",
                )
            ],
        )

    @classmethod
    def execute(
        cls, region: types.KleinConditioning, mask, conditioning=None, strength: float = 1.0
    ) -> io.NodeOutput:
        return io.NodeOutput(add_region(region, mask, conditioning, strength))


def add_region(
    region: types.KleinConditioning, mask, conditioning, strength: float
) -> types.KleinConditioning:
    if region.regions is not None:
        raise Flux2Error(
            "the region input takes one prompt's encoding (FLUX.2 Text Encode), not a regional "
            "conditioning: connect the chain to the conditioning input"
        )
    if mask.ndim == 3 and mask.shape[0] != 1:
        raise Flux2Error(f"the region's mask holds {mask.shape[0]} masks: give one mask per region")
    if conditioning is not None and conditioning.width != region.width:
        raise Flux2Error(
            f"the region's prompt was encoded by {region.encoder_name}, the conditioning so far by "
            f"{conditioning.encoder_name}: encode every prompt with the same text encoder"
        )
    controls = {id(c): c for c in (region.control, conditioning and conditioning.control) if c is not None}
    if len(controls) > 1:
        raise Flux2Error(
            "the region and the conditioning so far each carry a FLUX.2 [dev] ControlNet: apply the "
            "ControlNet once, to the last Regional Prompt's conditioning"
        )
    added = Region(region.embeds, mask.reshape(mask.shape[-2:]).float().cpu(), strength)
    if conditioning is None:
        chain = RegionalPrompt(region.embeds.new_zeros(1, 0, region.width), (added,))
    elif conditioning.regions is None:
        chain = RegionalPrompt(conditioning.embeds, (added,))
    else:
        chain = conditioning.regions.add(added)
    control = next(iter(controls.values()), None)  # a pending ControlNet steers the whole picture: kept
    return types.KleinConditioning(
        chain.global_embeds, region.encoder_name, region.width, regions=chain, control=control
    )
