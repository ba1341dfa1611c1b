"""The FLUX.2 [dev] Fun ControlNet Union (alibaba-pai/FLUX.2-dev-Fun-Controlnet-Union): VACE-style hints.

The model, as VideoX-Fun's ``Flux2ControlTransformer2DModel`` defines it (its release files hold only the
control part, in that model's diffusers names: ``control_img_in.*``, ``control_transformer_blocks.{k}.*``):

- ``control_img_in``: a linear (with bias) from the control context ([B, N, 260]: the control map's latent,
  128 channels; 1 - mask, 4; the masked image's latent, 128) to the model width;
- ``control_transformer_blocks``: K copies of FLUX.2's double block (no modulation of their own: they take the
  main model's double-block modulation and RoPE). Block 0 first adds ``before_proj(c)`` (a linear with bias)
  to the main model's embedded image stream; each block's image output ``c`` feeds the next and
  ``after_proj(c)`` is hint k. The text stream runs through the control blocks too (block k takes block
  k - 1's) and is dropped after them;
- hint k, times the strength, is added to the image stream after main double block ``control_layers[k]``.
  The release has K = 4 for dev's 8 double blocks and ``control_layers`` = every other block from 0
  (VideoX-Fun's default and ``config/flux2/flux2_control.yaml``'s [0, 2, 4, 6]); the files do not store the
  list, so it is ``0, 2, ..., 2 (K - 1)``, checked against the base model's depth.

With reference images in the sequence, the reference pipeline zero-pads the control context over the
reference tokens and the hints land on the whole image stream, references included: so does ``forward``.
Our names: ``control_img_in``, ``double_blocks.{k}`` (BFL block names, through the DiT's key map),
``before_proj``, ``after_proj.{k}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import Flux2Error
from ..hooks import moved
from ..ops import Linear
from ..weights.keymaps import DIT, KeyMap
from ..weights.loading import load_component
from ..weights.plan import ComponentSpec
from .layers import DoubleStreamBlock

CONTROL_CHANNELS = 260  # 128 control latent + 4 mask + 128 inpaint latent
CONTROL_LOADER = "FLUX.2 [dev] Fun ControlNet Loader"


@dataclass(frozen=True)
class ControlConfig:
    hidden_size: int
    num_heads: int
    mlp_hidden_dim: int
    blocks: int
    in_channels: int = CONTROL_CHANNELS

    @property
    def layers(self) -> tuple[int, ...]:
        """The main double blocks after which hints 0, 1, ... are added."""
        return tuple(range(0, 2 * self.blocks, 2))


class Flux2ControlNet(nn.Module):
    def __init__(self, config: ControlConfig):
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        self.control_img_in = Linear(config.in_channels, hidden, bias=True)
        self.double_blocks = nn.ModuleList(
            DoubleStreamBlock(hidden, config.num_heads, config.mlp_hidden_dim) for _ in range(config.blocks)
        )
        self.before_proj = Linear(hidden, hidden, bias=True)
        self.after_proj = nn.ModuleList(Linear(hidden, hidden, bias=True) for _ in range(config.blocks))

    @property
    def layers(self) -> tuple[int, ...]:
        return self.config.layers

    def blocks(self) -> list[nn.Module]:
        """The control blocks in run order: what streaming streams, as the DiT's blocks."""
        return list(self.double_blocks)

    @property
    def device(self) -> torch.device:
        return self.control_img_in.weight.device  # outside the blocks: never streamed

    def hints(self, context, img, txt, img_mod, txt_mod, call) -> list[torch.Tensor]:
        """Hint k for each control block, from the control ``context`` [B, N, 260] and the main model's
        embedded image and text streams (``img`` [B, N, D] after ``img_in``, ``txt`` after ``txt_in``), with
        the main call's ``layers.BlockCall``. They run on this net's device (the inputs moved there when the
        DiT's first block is elsewhere: a block split); each hint is added on the device of the block it
        follows."""
        context, img, txt, img_mod, txt_mod, call = moved(
            (context, img, txt, img_mod, txt_mod, call), self.device
        )
        c = self.before_proj(self.control_img_in(context.to(img.dtype))) + img
        hints = []
        for block, after in zip(self.double_blocks, self.after_proj):
            c, txt = block(c, txt, img_mod, txt_mod, call)
            hints.append(after(c))
        return hints


@dataclass
class Control:
    """A control net applied to one DiT call: its model, the control context of the call's image tokens
    ([B, N, 260], or [1, N, 260] shared by the batch) and the strength."""

    net: Flux2ControlNet
    context: torch.Tensor
    strength: float

    def padded(self, tokens: int) -> torch.Tensor:
        """The context over ``tokens`` image tokens: zeros over the references after the noisy tokens."""
        extra = tokens - self.context.shape[1]
        if extra < 0:
            raise Flux2Error(
                f"the control context covers {self.context.shape[1]} tokens, more than the image's {tokens}"
            )
        if extra == 0:
            return self.context
        pad = self.context.new_zeros(self.context.shape[0], extra, self.context.shape[2])
        return torch.cat([self.context, pad], dim=1)


def hint_bytes(config: ControlConfig, batch: int, tokens: int, dtype: torch.dtype) -> int:
    """The device memory a controlled call holds beyond the plain one: the K hints over its ``tokens`` image
    tokens (all computed before the first main block and kept until theirs), and the control context.
    The control blocks' own working memory is that of one double block, inside the plain call's peak."""
    itemsize = torch.finfo(dtype).bits // 8
    return batch * tokens * (config.blocks * config.hidden_size + config.in_channels) * itemsize


# diffusers names of the control part -> ours; the block bodies then follow the DiT's key map
_CONTROL_RENAMES = [
    (r"^control_transformer_blocks\.0\.before_proj\.", "before_proj."),
    (r"^control_transformer_blocks\.(?P<k>\d+)\.after_proj\.", "after_proj.{k}."),
    (r"^control_transformer_blocks\.", "transformer_blocks."),
]
CONTROL = KeyMap(rules=[(p.pattern, t) for p, t in DIT.rules], renames=_CONTROL_RENAMES)


def control_config(shapes: dict[str, tuple[int, ...]], name: str) -> ControlConfig:
    """Every size of the control net, from tensor shapes (head_dim is the QK-norm width)."""
    needed = (
        "control_img_in.weight",
        "double_blocks.0.img_attn.norm.query_norm.scale",
        "double_blocks.0.img_mlp.2.weight",
    )
    missing = [k for k in needed if k not in shapes]
    if missing:
        raise Flux2Error(
            f"{name} lacks {', '.join(missing)}: it is not a complete FLUX.2 Fun ControlNet file"
        )
    hidden, channels = shapes["control_img_in.weight"]
    head_dim = shapes["double_blocks.0.img_attn.norm.query_norm.scale"][0]
    blocks = len({m[1] for k in shapes if (m := re.match(r"double_blocks\.(\d+)\.", k))})
    if channels != CONTROL_CHANNELS:
        raise Flux2Error(
            f"{name} takes {channels}-channel control context where the Fun ControlNet Union takes "
            f"{CONTROL_CHANNELS}: it is another kind of control model"
        )
    return ControlConfig(hidden, hidden // head_dim, shapes["double_blocks.0.img_mlp.2.weight"][1], blocks)


def identify_control(names: dict[str, str], checkpoint) -> None:
    keys = set(names)
    if "control_img_in.weight" in keys:
        return
    if keys & {"double_stream_modulation_img.lin.weight", "x_embedder.weight", "img_in.weight"}:
        what = "a FLUX.2 diffusion model (klein or dev)"
        if any(k.startswith(("double_blocks.0.img_mod.", "vector_in.")) for k in keys):
            what = "a FLUX.1 model"
        raise Flux2Error(
            f"{checkpoint.name} is {what}, not a control net: load it with the FLUX.2 Model Loader (or the "
            f"FLUX.1 Fill loader); the {CONTROL_LOADER} takes FLUX.2-dev-Fun-Controlnet-Union*.safetensors"
        )
    raise Flux2Error(
        f"{checkpoint.name} is not a FLUX.2 [dev] Fun ControlNet file (it has no control_img_in): use "
        "FLUX.2-dev-Fun-Controlnet-Union(-2602).safetensors from alibaba-pai/FLUX.2-dev-Fun-Controlnet-Union"
    )


def check_pairing(control: Flux2ControlNet, dit, what: str = "the control net") -> None:
    """A control net fits FLUX.2 [dev]'s width and depth; with klein it is refused with what it is for."""
    check_configs(control.config, dit.config, what)


def check_configs(control: ControlConfig, config, what: str = "the control net") -> None:
    """``check_pairing`` from the two configs (the files' headers: before anything is loaded)."""
    if not config.guidance_embed:
        raise Flux2Error(
            f"{what} is the FLUX.2 [dev] Fun ControlNet, which only steers FLUX.2 [dev]: load "
            "flux2-dev.safetensors (or its fp8 / GGUF versions) as the model; klein has no ControlNet (use a "
            "RefControl LoRA on klein base for pose or depth)"
        )
    layers = control.layers
    if control.hidden_size != config.hidden_size or layers[-1] >= config.depth:
        raise Flux2Error(
            f"{what} is {control.hidden_size} wide with hints for double blocks {list(layers)}, but "
            f"the model is {config.hidden_size} wide with {config.depth} double blocks: use the control net "
            "made for this model"
        )


CONTROL_SPEC = ComponentSpec(
    what="control net",
    component="controlnet",
    keymap=CONTROL,
    config=lambda shapes, checkpoint: control_config(shapes, checkpoint.name),
    build=Flux2ControlNet,
    describe=lambda c: f"FLUX.2 [dev] Fun ControlNet Union ({c.blocks} blocks, hints after {list(c.layers)})",
    identify=identify_control,
    int8_matmul=True,
)


def load_controlnet(
    path: str | Path,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    keep_quantized: bool = True,
    quant_compute: str = "auto",
) -> Flux2ControlNet:
    """Load a Fun ControlNet Union file (first release or 2602) in the compute ``dtype``; quantised layers
    stay quantised as in the DiT (``load_transformer``)."""
    return load_component(CONTROL_SPEC, path, dtype, device, keep_quantized, quant_compute).module
