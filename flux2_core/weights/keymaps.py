"""Foreign checkpoint names -> our module names, in one place for loading and for weight patches (LoRA).

A foreign key maps to one or more *placements*: our key, plus optionally which part of a fused tensor of ours
it fills (``into``) and which part of the foreign tensor goes there (``take``). Parts are equal row blocks
along dim 0, so their (offset, size) follow from the real tensor's length. The two reshapes diffusers makes to
the FLUX.2 DiT live here and nowhere else:

- q, k and v are separate tensors in diffusers and one fused ``qkv`` in BFL files: ``to_k`` fills part 1 of 3;
- diffusers' final ``norm_out`` stores (scale; shift) where BFL stores (shift; scale): each half of the
  foreign tensor fills the other half of ours. Missing that swap would load silently and produce garbage.

Loading concatenates the parts; a patch on a foreign layer lands on the rows of ours its placement names.
Keys that no rule matches pass through unchanged (our own names), for the strict load to judge.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    """Block ``index`` of ``count`` row blocks along dim 0: equal ones, or in the proportions ``weights``
    (FLUX.1's single-block ``linear1`` is q, k, v and the MLP in the proportions 1:1:1:4)."""

    index: int
    count: int
    weights: tuple[int, ...] | None = None

    def rows(self, total: int) -> tuple[int, int]:
        """(offset, size) of this block in a tensor of ``total`` rows."""
        weights = self.weights or (1,) * self.count
        unit = total // sum(weights)
        return unit * sum(weights[: self.index]), unit * weights[self.index]


@dataclass(frozen=True)
class Placement:
    """Where (part of) a foreign tensor goes: our key, the part of ours it fills, the part of it taken."""

    target: str
    into: Part | None = None
    take: Part | None = None


class KeyMap:
    """Ordered regex rules ``(pattern, [(target template, into, take), ...])``, matched on the whole key.

    ``renames`` are (pattern, replacement) substitutions applied in order before the rules, all that match
    (several may touch one key); ``{up}`` in a replacement is the reversed index of ``(?P<up>\\d+)``, counted
    over the keys that ``levels`` (one group: the index) matches.
    """

    def __init__(self, rules=(), renames=(), levels: str | None = None):
        self.rules = [(re.compile(p), [(t, None, None)] if isinstance(t, str) else t) for p, t in rules]
        self.renames = [(re.compile(p), r) for p, r in renames]
        self.levels = re.compile(levels) if levels else None

    def up_levels(self, keys: Iterable[str]) -> int:
        if self.levels is None:
            return 0
        return len({m[1] for k in keys if (m := self.levels.match(k))})

    def lookup(self, key: str, up_levels: int = 0) -> list[Placement]:
        for pattern, template in self.renames:
            if match := pattern.search(key):
                groups = match.groupdict()
                if groups.get("up") is not None:
                    groups["up"] = str(up_levels - 1 - int(groups["up"]))
                key = key[: match.start()] + template.format(**groups) + key[match.end() :]
        for pattern, targets in self.rules:
            if match := pattern.fullmatch(key):
                return [Placement(match.expand(t), into, take) for t, into, take in targets]
        return [Placement(key)]


def plan(keys: Iterable[str], keymap: KeyMap, up_levels: int = 0) -> dict[str, list[tuple[str, Placement]]]:
    """Our key -> the foreign keys (with placements) that make it, for every key of a file."""
    out: dict[str, list[tuple[str, Placement]]] = {}
    for key in keys:
        for placement in keymap.lookup(key, up_levels):
            out.setdefault(placement.target, []).append((key, placement))
    return out


def strip_prefix(keys: Iterable[str], prefixes: Iterable[str]) -> dict[str, str]:
    """{short key: file key} without the first of ``prefixes`` that any key carries (keys without it go)."""
    keys = list(keys)
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in keys):
            return {k[len(prefix) :]: k for k in keys if k.startswith(prefix)}
    return {k: k for k in keys}


_B, _D = r"transformer_blocks\.(\d+)\.", r"double_blocks.\1."
_S, _SB = r"single_transformer_blocks\.(\d+)\.", r"single_blocks.\1."


def _qkv(target: str) -> list:
    """q, k and v of one fused projection: three rules' targets."""
    return [[(target, Part(i, 3), None)] for i in range(3)]


_IMG_Q, _IMG_K, _IMG_V = _qkv(_D + "img_attn.qkv.weight")
_TXT_Q, _TXT_K, _TXT_V = _qkv(_D + "txt_attn.qkv.weight")

# The FLUX.2 DiT. BFL names (also ComfyUI's, once ``model.diffusion_model.`` is stripped) pass through;
# ComfyUI may store the QK-norm weights as ``.weight`` instead of BFL's ``.scale``. A string is one target.
DIT_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "transformer.")
DIT = KeyMap(
    rules=[
        (r"(.*\.(?:query|key)_norm)\.weight", r"\1.scale"),
        (r"x_embedder\.weight", "img_in.weight"),
        (r"context_embedder\.weight", "txt_in.weight"),
        (r"time_guidance_embed\.timestep_embedder\.linear_1\.weight", "time_in.in_layer.weight"),
        (r"time_guidance_embed\.timestep_embedder\.linear_2\.weight", "time_in.out_layer.weight"),
        (r"time_guidance_embed\.guidance_embedder\.linear_1\.weight", "guidance_in.in_layer.weight"),
        (r"time_guidance_embed\.guidance_embedder\.linear_2\.weight", "guidance_in.out_layer.weight"),
        (r"double_stream_modulation_(img|txt)\.linear\.weight", r"double_stream_modulation_\1.lin.weight"),
        (r"single_stream_modulation\.linear\.weight", "single_stream_modulation.lin.weight"),
        (_B + r"attn\.to_q\.weight", _IMG_Q),
        (_B + r"attn\.to_k\.weight", _IMG_K),
        (_B + r"attn\.to_v\.weight", _IMG_V),
        (_B + r"attn\.to_qkv\.weight", _D + "img_attn.qkv.weight"),
        (_B + r"attn\.add_q_proj\.weight", _TXT_Q),
        (_B + r"attn\.add_k_proj\.weight", _TXT_K),
        (_B + r"attn\.add_v_proj\.weight", _TXT_V),
        (_B + r"attn\.to_added_qkv\.weight", _D + "txt_attn.qkv.weight"),
        (_B + r"attn\.norm_q\.weight", _D + "img_attn.norm.query_norm.scale"),
        (_B + r"attn\.norm_k\.weight", _D + "img_attn.norm.key_norm.scale"),
        (_B + r"attn\.norm_added_q\.weight", _D + "txt_attn.norm.query_norm.scale"),
        (_B + r"attn\.norm_added_k\.weight", _D + "txt_attn.norm.key_norm.scale"),
        (_B + r"attn\.to_out\.0\.weight", _D + "img_attn.proj.weight"),
        (_B + r"attn\.to_add_out\.weight", _D + "txt_attn.proj.weight"),
        (_B + r"ff\.linear_in\.weight", _D + "img_mlp.0.weight"),
        (_B + r"ff\.linear_out\.weight", _D + "img_mlp.2.weight"),
        (_B + r"ff_context\.linear_in\.weight", _D + "txt_mlp.0.weight"),
        (_B + r"ff_context\.linear_out\.weight", _D + "txt_mlp.2.weight"),
        (_S + r"attn\.to_qkv_mlp_proj\.weight", _SB + "linear1.weight"),
        (_S + r"attn\.to_out\.weight", _SB + "linear2.weight"),
        (_S + r"attn\.norm_q\.weight", _SB + "norm.query_norm.scale"),
        (_S + r"attn\.norm_k\.weight", _SB + "norm.key_norm.scale"),
        (
            r"norm_out\.linear\.weight",  # (scale; shift) -> (shift; scale)
            [
                ("final_layer.adaLN_modulation.1.weight", Part(1, 2), Part(0, 2)),
                ("final_layer.adaLN_modulation.1.weight", Part(0, 2), Part(1, 2)),
            ],
        ),
        (r"proj_out\.weight", "final_layer.linear.weight"),
    ]
)

# The FLUX.2 VAE: diffusers ``AutoencoderKLFlux2`` names -> BFL names, renames applied in order.
# ``up_blocks.{i}`` is BFL's ``up.{levels - 1 - i}``. ComfyUI's top-level quant convs and a bare decoder's
# post_quant_conv use the first two. diffusers' attention q/k/v/out are Linear [C, C] where BFL has 1x1
# convs [C, C, 1, 1]: the loader adds the trailing unit dims.
VAE_PREFIXES = ("first_stage_model.", "vae.")
VAE = KeyMap(
    renames=[
        (r"^quant_conv\.", "encoder.quant_conv."),
        (r"^post_quant_conv\.", "decoder.post_quant_conv."),
        (r"^(?P<part>encoder|decoder)\.conv_norm_out\.", "{part}.norm_out."),
        (r"^encoder\.down_blocks\.(?P<i>\d+)\.resnets\.", "encoder.down.{i}.block."),
        (r"^encoder\.down_blocks\.(?P<i>\d+)\.downsamplers\.0\.", "encoder.down.{i}.downsample."),
        (r"^decoder\.up_blocks\.(?P<up>\d+)\.resnets\.", "decoder.up.{up}.block."),
        (r"^decoder\.up_blocks\.(?P<up>\d+)\.upsamplers\.0\.", "decoder.up.{up}.upsample."),
        (r"\.mid_block\.resnets\.0\.", ".mid.block_1."),
        (r"\.mid_block\.resnets\.1\.", ".mid.block_2."),
        (r"\.mid_block\.attentions\.0\.", ".mid.attn_1."),
        (r"\.attn_1\.group_norm\.", ".attn_1.norm."),
        (r"\.attn_1\.to_(?P<p>q|k|v)\.", ".attn_1.{p}."),
        (r"\.attn_1\.to_out\.0\.", ".attn_1.proj_out."),
        (r"\.conv_shortcut\.", ".nin_shortcut."),
    ],
    levels=r"decoder\.up_blocks\.(\d+)\.",
)
# A decoder-only file (``small_decoder.safetensors``) stores the decoder's keys without ``decoder.``.
BARE_DECODER = re.compile(r"^(conv_in|conv_out|norm_out|conv_norm_out|mid|mid_block|up|up_blocks)\.")

# Qwen3 text encoders: ComfyUI's all-in-one checkpoints nest them under ``text_encoders.<name>.transformer.``,
# ComfyUI's and HF's files under ``model.``; the rest are transformers' ``Qwen3Model`` names.
QWEN3_ALL_IN_ONE_PREFIXES = ("text_encoders.qwen3_4b.transformer.", "text_encoders.qwen3_8b.transformer.")
QWEN3_PREFIXES = ("model.",)
QWEN3 = KeyMap()

# Mistral Small 3.x (FLUX.2 [dev]): the language model of an HF Mistral3ForConditionalGeneration
# (transformers >= 4.52: model.language_model.*; older saves: language_model.model.*; the vision tower,
# projector and lm_head lie outside these prefixes and are never read), or ComfyUI's single file and a
# text-only HF Mistral (model.*). HF names below the prefix are ours.
MISTRAL_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
MISTRAL = KeyMap()
