"""The command line's FLUX.2 [dev] Fun ControlNet: its flags read and checked, its share of the memory check,
the output size a control map sets, and the control net loaded (streamed with the DiT) for the run."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ..devices.streaming import disable_streaming, enable_streaming, streamed_device_bytes
from ..dit.control import CONTROL_SPEC, check_configs, hint_bytes, load_controlnet
from ..dit.transformer import CONTROL_AND_PARALLEL
from ..errors import Flux2Error
from ..steering.control_image import MAX_CONTROL_STRENGTH, AppliedControl, control_output_size
from ..weights.loading import weight_bytes
from . import inputs
from .parallel import Ranks

# what the flags give: (map [1, 3, H, W] or None, mask [H, W] or None, the picture to inpaint or None)
ControlInputs = tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]


def read_inputs(args: argparse.Namespace, ranks: Ranks) -> ControlInputs | None:
    """--controlnet, --control, --control-strength and --control-mask, checked and read."""
    given = args.control or args.control_mask
    if args.controlnet is None:
        if given:
            raise Flux2Error(
                "--control and --control-mask go with a control net: give it with --controlnet FILE"
            )
        return None
    if not given:
        raise Flux2Error(
            "--controlnet needs a control map (--control IMAGE) or its inpaint mask (--control-mask)"
        )
    if args.control_mask and args.image is None:
        raise Flux2Error("--control-mask inpaints a picture: give it with --image")
    if not 0.0 <= args.control_strength <= MAX_CONTROL_STRENGTH:
        raise Flux2Error(
            f"--control-strength {args.control_strength} is not allowed: use 0 (no control) to "
            f"{MAX_CONTROL_STRENGTH:g} (0.65-0.80 recommended)"
        )
    if ranks.is_parallel:
        raise Flux2Error(CONTROL_AND_PARALLEL)

    def pixels(path):
        return None if path is None else inputs.as_tensor(inputs.open_image(path)).permute(2, 0, 1)[None]

    mask = None if args.control_mask is None else inputs.open_mask(args.control_mask, None)
    return pixels(args.control), mask, pixels(args.image) if args.control_mask else None


def output_size_of(control: ControlInputs | None) -> tuple[int, int] | None:
    """The size the control map (else the picture it inpaints) gives a run that no reference sizes."""
    return None if control is None else control_output_size(control[0], control[2])


def memory(args: argparse.Namespace, config, settings, ref_tokens: int, dtype) -> tuple[int, int, int]:
    """(device bytes, RAM bytes, activation bytes) the --controlnet adds to the memory check: its weights on
    the device, or with --offload stream in RAM and its blocks in flight on the device; its hints. Its width
    and depth are checked against the DiT's from the headers."""
    control, weights, _ = weight_bytes(CONTROL_SPEC, args.controlnet, dtype)
    check_configs(control, config, f"--controlnet {Path(args.controlnet).name}")
    tokens = settings.grid[0] * settings.grid[1] + ref_tokens
    hints = hint_bytes(control, settings.batch_size, tokens, dtype)
    if args.offload != "stream":
        return weights, 0, hints
    return streamed_device_bytes(weights, control.blocks), weights, hints


def load(args: argparse.Namespace, context: torch.Tensor, device, dtype) -> AppliedControl:
    """The control net for this run, beside the DiT: on ``device``, or with --offload stream in RAM with
    its blocks copied in as they run, as the DiT's."""
    keep = device.type != "mps"  # MPS cannot hold float8
    if args.offload == "stream":
        net = load_controlnet(args.controlnet, dtype, "cpu", keep, args.quant_compute)
        enable_streaming(net, device)
    else:
        net = load_controlnet(args.controlnet, dtype, device, keep, args.quant_compute)
    return AppliedControl(net, context, args.control_strength)


def release(control: AppliedControl | None) -> None:
    if control is not None:
        disable_streaming(control.net)
