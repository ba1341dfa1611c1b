"""Refusing a LoRA made for another model, with a message that says which model it is for.

The rules run in order over a ``match.Matches`` and the first that applies raises: a FLUX.1 LoRA, a FLUX.2
[dev] LoRA on klein (it names the guidance embedder), shapes of another FLUX.2 size (klein 4B, klein 9B or
dev, told by the width one block reads; or of another text encoder), blocks this model lacks, and a file
of which nothing matched (incomplete, or for another model). All of them run before any patch is built.
Modules that match nothing while others do are reported, not refused.
"""

from __future__ import annotations

from collections import Counter

from torch import nn

from ..errors import Flux2Error
from ..ops import linears
from .keys import DIT, HIDDEN_NAMES, KLEIN_4B_BLOCKS, TE, TEXT_WIDTH_NAMES
from .match import Matches
from .report import model_hidden, model_name


def refuse(name: str, found: Matches, transformer: nn.Module, text_encoder: nn.Module | None) -> None:
    """Raise the first refusal that applies to ``found``; return when the LoRA is for this model."""
    for rule in (_flux1_layers, _dev_layers, _wrong_shapes, _too_deep, _nothing_matched):
        error = rule(name, found, transformer, text_encoder)
        if error is not None:
            raise error


def _flux1_layers(name, found, transformer, text_encoder) -> Flux2Error | None:
    if found.flux1:
        return Flux2Error(
            f"{name} is a FLUX.1 LoRA (it has FLUX.1-only layers such as {found.flux1[0]}): FLUX.1 LoRAs "
            f"do not work on FLUX.2; use a LoRA trained for {_model(transformer)}"
        )
    return None


def _dev_layers(name, found, transformer, text_encoder) -> Flux2Error | None:
    if found.dev:
        return Flux2Error(
            f"{name} is a FLUX.2 [dev] LoRA (it has the guidance embedder, {found.dev[0]}, which klein "
            "lacks): use a LoRA trained for FLUX.2 [klein]"
        )
    return None


def _wrong_shapes(name, found, transformer, text_encoder) -> Flux2Error | None:
    dit = [m[1:] for m in found.mismatched if m[0] == DIT]
    if dit:
        return wrong_size(name, dit, transformer)
    te = [m[1:] for m in found.mismatched if m[0] == TE]
    return wrong_text_encoder(name, te, text_encoder) if te else None


def _too_deep(name, found, transformer, text_encoder) -> Flux2Error | None:
    return too_deep(name, found.absent, found.aliases, transformer) if found.absent else None


def _nothing_matched(name, found, transformer, text_encoder) -> Flux2Error | None:
    if found.fits or found.te_off or found.unused:
        return None
    if found.incomplete:
        return Flux2Error(
            f"{name} is incomplete: every LoRA module lacks one of its halves (e.g. {found.incomplete[0]} "
            "has no up/B or no down/A matrix); the file is damaged, download it again"
        )
    return Flux2Error(
        f"none of the {len(found.adapters)} LoRA modules of {name} (e.g. {sorted(found.adapters)[0]}) "
        f"matches a layer of {_model(transformer)}: it is a LoRA for another model; use a LoRA trained for "
        f"{_model(transformer)}"
    )


def not_a_lora(name: str, tensors: dict) -> Flux2Error:
    what = (
        "it looks like a model checkpoint" if any(k.endswith(".weight") for k in tensors) else "it is empty"
    )
    if tensors and not any(k.endswith(".weight") for k in tensors):
        what = f"it holds other tensors (e.g. {sorted(tensors)[0]})"
    return Flux2Error(
        f"{name} is not a LoRA: it has no LoRA weights (lora_up/lora_down, lora_A/lora_B, LoKr, LoHa or "
        f".diff tensors); {what}. Load a LoRA file here, and model checkpoints with the model loaders"
    )


def wrong_size(name: str, mismatched: list, transformer) -> Flux2Error:
    """Which model a LoRA whose shapes do not fit was made for, from the width its layers read."""
    hidden = model_hidden(transformer)
    layers = dict(linears(transformer))
    widths = Counter(
        got[1]
        for _, target, _, got in mismatched
        if target in layers and layers[target].in_features == hidden
    )
    key, target, expected, got = mismatched[0]
    width = widths.most_common(1)[0][0] if widths else hidden
    evidence = next(  # one block whose widths show it: the file's change and the layer, both [out, in]
        ((k, t, e, g) for k, t, e, g in mismatched if t in layers and layers[t].in_features == hidden
         and g[1] == width and t.startswith(("double_blocks.", "single_blocks."))),
        mismatched[0],
    )  # fmt: skip
    flux1 = any(
        (t.endswith("linear1") and g[0] == 7 * width) or (t.endswith("mlp.0") and g[0] == 4 * width)
        for _, t, _, g in mismatched
    )
    model = HIDDEN_NAMES.get(hidden) or model_name(transformer)
    if flux1:
        return Flux2Error(
            f"{name} is a FLUX.1 LoRA (its {target} shapes are FLUX.1's): FLUX.1 LoRAs do not work on "
            f"FLUX.2; use a LoRA trained for {model}"
        )
    if width == hidden:
        return Flux2Error(
            f"{name} does not fit this model: its change to {target} ({key}) is {list(got)} but the layer is "
            f"{list(expected)}; use a LoRA trained for {model_name(transformer)}"
        )
    made_for = HIDDEN_NAMES.get(width, f"a {width}-wide model")
    key, target, expected, got = evidence
    return Flux2Error(
        f"{name} is a LoRA for {made_for} (its layers are {width} wide: its change to {target} is "
        f"{list(got)}, where this model's layer is {list(expected)}), but the loaded model is {model} "
        f"({hidden} wide): use a LoRA trained for {model}, or load the {made_for} model"
    )


def wrong_text_encoder(name: str, mismatched: list, text_encoder) -> Flux2Error:
    key, target, expected, got = mismatched[0]
    width = next((g[1] for _, t, _, g in mismatched if t.endswith("q_proj")), got[1])
    ours = next(layer.in_features for n, layer in linears(text_encoder) if n.endswith("q_proj"))
    made_for = TEXT_WIDTH_NAMES.get(width, f"a {width}-wide text encoder")
    connected = TEXT_WIDTH_NAMES.get(ours, f"{ours} wide")
    return Flux2Error(
        f"{name} has text-encoder weights for {made_for}, but the connected text encoder is {connected} "
        f"({target}: {list(got)} vs {list(expected)}): use a LoRA trained for the model you loaded"
    )


def _model(transformer) -> str:
    return HIDDEN_NAMES.get(model_hidden(transformer)) or model_name(transformer)


def too_deep(name: str, keys: list[str], aliases: dict, transformer) -> Flux2Error:
    target = aliases[keys[0]].placements[0][0]
    double, single = len(transformer.double_blocks), len(transformer.single_blocks)
    deeper = (  # the block's own shapes were never compared: klein 9B (4096) and FLUX.1 (3072) both fit
        "a model with more blocks (klein 9B, FLUX.1 or FLUX.2 [dev])"
        if model_hidden(transformer) == 3072 and (double, single) == KLEIN_4B_BLOCKS
        else "a deeper model"
    )
    return Flux2Error(
        f"{name} changes {target} ({keys[0]}), but {model_name(transformer)} has only {double} double and "
        f"{single} single blocks: it is a LoRA for {deeper}; use a LoRA trained for this model"
    )
