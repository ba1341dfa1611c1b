"""Which layer of the DiT or text encoder each module of a LoRA file belongs to, for every trainer's names.

A LoRA file names its modules the way its trainer saw the model: BFL names (ai-toolkit, ComfyUI, fal,
kohya/musubi with underscores), diffusers names (diffusers/PEFT, DiffSynth, OneTrainer, SimpleTuner's
LyCORIS) or transformers' Qwen3 / Mistral names for the text encoder. Every accepted spelling is generated
forward from the layers the loaded model really has (and from the diffusers names of those layers, through
the same key map the checkpoint loader uses), so no underscore is ever guessed back into a dot. Names the
model lacks but that tell what the LoRA is for (FLUX.1-only modules, blocks beyond this model's depth, the
dev guidance embedder, text-encoder layers that never run) are generated too and marked, so they can be
reported or refused by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from ..ops import linears
from ..weights.keymaps import DIT as DIT_KEYMAP
from ..weights.keymaps import Part

# Tensor-name endings -> what the tensor is. Longest first, so ".lora_B.weight" wins over ".lora_B".
DIT, TE = "diffusion_model", "text_encoder"  # the two components a LoRA changes (``Alias.domain``)

_SUFFIXES = {
    ".lora_up.weight": "up",
    ".lora_down.weight": "down",
    ".lora_B.default.weight": "up",
    ".lora_A.default.weight": "down",
    ".lora_B.weight": "up",
    ".lora_A.weight": "down",
    ".lora_B": "up",
    ".lora_A": "down",
    ".lora_linear_layer.up.weight": "up",
    ".lora_linear_layer.down.weight": "down",
    "_lora.up.weight": "up",
    "_lora.down.weight": "down",
    ".lora.up.weight": "up",
    ".lora.down.weight": "down",
    ".lora_mid.weight": "mid",
    ".alpha": "alpha",
    ".dora_scale": "dora_scale",
    ".lora_magnitude_vector.default.weight": "magnitude",
    ".lora_magnitude_vector.weight": "magnitude",
    ".lora_magnitude_vector": "magnitude",
    **{f".lokr_{p}": f"lokr_{p}" for p in ("w1", "w2", "w1_a", "w1_b", "w2_a", "w2_b", "t2")},
    **{f".hada_{p}": f"hada_{p}" for p in ("w1_a", "w1_b", "w2_a", "w2_b", "t1", "t2")},
    ".diff": "diff",
    ".diff_b": "diff_b",
    ".set_weight": "set_weight",
    ".lora_B.bias": "up_bias",
    ".lora_up.bias": "up_bias",
}
_BY_LENGTH = sorted(_SUFFIXES.items(), key=lambda item: -len(item[0]))


def group_tensors(keys) -> tuple[dict[str, dict[str, str]], list[str]]:
    """{module key: {part: tensor key}} for every tensor with a known ending, and the other tensor keys."""
    modules: dict[str, dict[str, str]] = {}
    unknown = []
    for key in keys:
        for suffix, part in _BY_LENGTH:
            if key.endswith(suffix) and len(key) > len(suffix):
                modules.setdefault(key[: -len(suffix)], {})[part] = key
                break
        else:
            unknown.append(key)
    return modules, unknown


@dataclass(frozen=True)
class Alias:
    """What one module name of a LoRA file means.

    ``placements``: (our layer, part of it filled, part of the foreign delta taken), as in ``keymaps``;
    ``local``: the dotted name the trainer saw (for PEFT's alpha/rank patterns); ``status``: ``ok`` (a layer
    of the given model), ``absent`` (a block this model lacks), ``unused`` (a text-encoder layer that never
    runs), ``flux1`` or ``dev`` (a module only FLUX.1 or FLUX.2 [dev] has).
    """

    domain: str  # DIT or TE
    placements: tuple[tuple[str, Part | None, Part | None], ...]
    family: str
    local: str
    status: str = "ok"


MAX_DOUBLE, MAX_SINGLE = 19, 48  # enough for FLUX.1 (19 + 38) and FLUX.2 [dev] (8 + 48)
FLUX1_DOUBLE, FLUX1_SINGLE = 19, 38

# diffusers' names for the FLUX.2 DiT linears (the keymap turns each into ours).
_DIFFUSERS_DOUBLE = (
    "attn.to_q", "attn.to_k", "attn.to_v", "attn.to_qkv", "attn.add_q_proj", "attn.add_k_proj",
    "attn.add_v_proj", "attn.to_added_qkv", "attn.to_out.0", "attn.to_add_out", "ff.linear_in",
    "ff.linear_out", "ff_context.linear_in", "ff_context.linear_out",
)  # fmt: skip
_DIFFUSERS_SINGLE = ("attn.to_qkv_mlp_proj", "attn.to_out")
_DIFFUSERS_GLOBAL = (
    "x_embedder", "context_embedder", "time_guidance_embed.timestep_embedder.linear_1",
    "time_guidance_embed.timestep_embedder.linear_2", "time_guidance_embed.guidance_embedder.linear_1",
    "time_guidance_embed.guidance_embedder.linear_2", "double_stream_modulation_img.linear",
    "double_stream_modulation_txt.linear", "single_stream_modulation.linear", "norm_out.linear", "proj_out",
)  # fmt: skip

# Modules only FLUX.1 has: BFL and diffusers names.
_FLUX1_BFL = (
    [f"double_blocks.{i}.{s}_mod.lin" for i in range(FLUX1_DOUBLE) for s in ("img", "txt")]
    + [f"single_blocks.{i}.modulation.lin" for i in range(FLUX1_SINGLE)]
    + ["vector_in.in_layer", "vector_in.out_layer"]
)
_FLUX1_DIFFUSERS = (
    [
        f"transformer_blocks.{i}.{m}"
        for i in range(FLUX1_DOUBLE)
        for m in ("norm1.linear", "norm1_context.linear", "ff.net.0.proj", "ff.net.2")
        + ("ff_context.net.0.proj", "ff_context.net.2")
    ]
    + [
        f"single_transformer_blocks.{i}.{m}"
        for i in range(FLUX1_SINGLE)
        for m in ("norm.linear", "proj_mlp", "proj_out", "attn.to_q", "attn.to_k", "attn.to_v")
    ]
    + [f"time_text_embed.{e}.linear_{j}" for e in ("timestep_embedder", "text_embedder") for j in (1, 2)]
    + [f"time_text_embed.guidance_embedder.linear_{j}" for j in (1, 2)]
)

_BFL_FAMILIES = (
    ("diffusion_model.", "BFL / ai-toolkit (diffusion_model.)"),
    ("model.diffusion_model.", "BFL / ComfyUI (model.diffusion_model.)"),
    ("", "bare BFL names"),
    ("base_model.model.", "fal / PEFT on BFL names (base_model.model.)"),
)
_DIFFUSERS_FAMILIES = (
    ("transformer.", "diffusers / PEFT (transformer.)"),
    ("", "DiffSynth / bare diffusers names"),
    ("base_model.model.", "PEFT on diffusers names (base_model.model.)"),
)
_DIFFUSERS_UNDERSCORE_FAMILIES = (
    ("lora_transformer_", "OneTrainer (lora_transformer_)"),
    ("lycoris_", "SimpleTuner LyCORIS (lycoris_)"),
)


def _under(name: str) -> str:
    return name.replace(".", "_")


class _Table(dict):
    def add(self, key: str, alias: Alias) -> None:
        self.setdefault(key, alias)  # the first spelling wins; the test suite checks there are no clashes


def dit_aliases(transformer: nn.Module) -> dict[str, Alias]:
    """Every accepted LoRA module name for the DiT ``transformer`` (and the marked foreign ones)."""
    names = [name for name, _ in linears(transformer)]
    status = dict.fromkeys(names, "ok")
    double = {int(m[1]) for n in names if (m := re.match(r"double_blocks\.(\d+)\.", n))}
    single = {int(m[1]) for n in names if (m := re.match(r"single_blocks\.(\d+)\.", n))}
    d0 = [n.split(".", 2)[2] for n in names if n.startswith("double_blocks.0.")]
    s0 = [n.split(".", 2)[2] for n in names if n.startswith("single_blocks.0.")]
    for i in range(len(double), MAX_DOUBLE):
        status.update(dict.fromkeys((f"double_blocks.{i}.{s}" for s in d0), "absent"))
    for i in range(len(single), MAX_SINGLE):
        status.update(dict.fromkeys((f"single_blocks.{i}.{s}" for s in s0), "absent"))
    for name in ("guidance_in.in_layer", "guidance_in.out_layer"):
        status.setdefault(name, "dev")
    for name in _FLUX1_BFL:
        status.setdefault(name, "flux1")

    table = _Table()
    for name, state in status.items():
        one = ((name, None, None),)
        for prefix, family in _BFL_FAMILIES:
            table.add(prefix + name, Alias(DIT, one, family, name, state))
        table.add(
            "lora_unet_" + _under(name),
            Alias(DIT, one, "kohya / musubi (lora_unet_)", name, state),
        )
        musubi = Alias(DIT, one, "musubi converted (diffusion_model., _attn_)", name, state)
        if "_attn." in name:
            table.add("diffusion_model." + name.replace("_attn.", "_attn_"), musubi)
        table.add("diffusion_model." + _under(name), musubi)

    diffusers = [f"transformer_blocks.{i}.{m}" for i in range(MAX_DOUBLE) for m in _DIFFUSERS_DOUBLE]
    diffusers += [f"single_transformer_blocks.{i}.{m}" for i in range(MAX_SINGLE) for m in _DIFFUSERS_SINGLE]
    for name in [*_DIFFUSERS_GLOBAL, *diffusers, *_FLUX1_DIFFUSERS]:
        placements = tuple(
            (p.target.removesuffix(".weight"), p.into, p.take) for p in DIT_KEYMAP.lookup(name + ".weight")
        )
        state = "flux1" if name in _FLUX1_DIFFUSERS else status.get(placements[0][0])
        if state is None:
            continue  # a layer this model does not have under any name (e.g. a fused to_qkv we keep apart)
        for prefix, family in _DIFFUSERS_FAMILIES:
            table.add(prefix + name, Alias(DIT, placements, family, name, state))
        for prefix, family in _DIFFUSERS_UNDERSCORE_FAMILIES:
            table.add(prefix + _under(name), Alias(DIT, placements, family, name, state))
    return table


# transformers' decoder layer linears, the same names in Qwen3 (klein) and Mistral (dev); TEXT_ENCODER_LAYERS
# covers Qwen3-4B/8B (36) and Mistral Small (40) with room to spare.
QWEN3_LAYER_LINEARS = (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
)  # fmt: skip
TEXT_ENCODER_LAYERS = 64
_TE_DOTTED = (
    ("text_encoder.model.", "diffusers / PEFT text encoder (text_encoder.)"),
    ("text_encoder.", "diffusers / PEFT text encoder (text_encoder.)"),
    ("base_model.model.model.", "PEFT on Qwen3 (base_model.model.)"),
    ("base_model.model.", "PEFT on Qwen3 (base_model.model.)"),
    ("text_encoders.qwen3_4b.transformer.model.", "ComfyUI text encoder"),
    ("text_encoders.qwen3_8b.transformer.model.", "ComfyUI text encoder"),
    ("text_encoders.mistral3_24b.transformer.model.", "ComfyUI text encoder"),
    ("text_encoders.transformer.model.", "ComfyUI text encoder"),  # ComfyUI: without the model's name
    ("model.", "bare Qwen3 names"),
)
_TE_UNDERSCORE = ("lora_te_model_", "lora_te1_model_", "lora_te_", "lora_te1_")


def text_encoder_aliases(text_encoder: nn.Module | None) -> dict[str, Alias]:
    """Every accepted LoRA module name for the text encoder (Qwen3 or Mistral: the same layer names, and
    ComfyUI's ``text_encoders.<model>.transformer.model.`` / ``lora_te_`` spellings of them); layers it never
    built are ``unused``."""
    built = {name for name, _ in linears(text_encoder)} if text_encoder is not None else None
    count = sum(1 for n in built if n.endswith(".self_attn.q_proj")) if built is not None else 27
    table = _Table()
    for i in range(TEXT_ENCODER_LAYERS):
        for module in QWEN3_LAYER_LINEARS:
            name = f"layers.{i}.{module}"
            if built is not None and i < count and name not in built:
                continue
            state = "ok" if i < count else "unused"
            one = ((name, None, None),)
            for prefix, family in _TE_DOTTED:
                table.add(prefix + name, Alias(TE, one, family, name, state))
            for prefix in _TE_UNDERSCORE:
                family = f"kohya text encoder ({prefix.split('_model')[0]}_)"
                table.add(prefix + _under(name), Alias(TE, one, family, name, state))
    return table


def block_of(target: str) -> tuple[str, str | None, int | None]:
    """(group, side, index): ("double", "img", 3), ("single", None, 0), ("other", None, None)."""
    if m := re.match(r"double_blocks\.(\d+)\.(img|txt)_", target):
        return "double", m[2], int(m[1])
    if m := re.match(r"single_blocks\.(\d+)\.", target):
        return "single", None, int(m[1])
    return "other", None, None


# LoRA widths (hidden size, from its shapes) -> the model it was made for.
HIDDEN_NAMES = {3072: "klein 4B", 4096: "klein 9B", 6144: "FLUX.2 [dev]"}
TEXT_WIDTH_NAMES = {
    2560: "Qwen3-4B (klein 4B)",
    4096: "Qwen3-8B (klein 9B)",
    5120: "Mistral Small (FLUX.2 [dev])",
}
KLEIN_4B_BLOCKS = (5, 20)  # a LoRA for a 3072-wide model with more blocks than this is FLUX.1's


def pattern_key(name: str) -> str:
    """A module name with its numbers replaced by N, for grouping report lines by block kind."""
    return re.sub(r"(?<=[._])\d+(?=[._]|$)", "N", name)
