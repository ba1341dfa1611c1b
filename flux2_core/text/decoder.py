"""The decoder-only language models FLUX.2 reads its text conditioning from (Qwen3, Mistral Small), built
through transformers on the meta device and cut to the layers whose hidden states are used."""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from ..errors import Flux2Error
from ..ops import adopt_linears


def build_decoder(config_cls, model_cls, shape, num_layers: int, **extra) -> torch.nn.Module:
    """A ``model_cls`` of ``num_layers`` layers from the sizes of ``shape`` (read from the file), with the
    final norm replaced by an identity (the last hidden state used must be the raw residual stream, not the
    normed one) and every projection computing through ``ops.Linear``. ``extra``: the family's own config."""
    config = config_cls(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
        rope_theta=shape.rope_theta,
        rms_norm_eps=shape.rms_norm_eps,
        tie_word_embeddings=False,
        use_cache=False,
        attn_implementation="sdpa",
        **extra,
    )
    with torch.device("meta"):
        model = model_cls(config)
    model.norm = torch.nn.Identity()
    return adopt_linears(model)


LAYER_KEY = re.compile(r"^layers\.(\d+)\.")


def layers_wanted(layers_run: int) -> Callable[[str], bool]:
    """The keys a decoder cut to ``layers_run`` layers loads: the token embeddings and layers 0 ..
    layers_run - 1. The final norm, the later layers and ``lm_head`` are left in the file on purpose."""

    def wanted(key: str) -> bool:
        return key == "embed_tokens.weight" or bool((m := LAYER_KEY.match(key)) and int(m[1]) < layers_run)

    return wanted


def attention_sizes(shapes: dict, head_dim: int, what: str, mismatch: str = "") -> tuple[int, int, int]:
    """(query heads, key/value heads, MLP width) of a decoder from its first layer's shapes; ``mismatch``
    ends the message when the projections are not whole heads of ``head_dim``."""
    attn = "layers.0.self_attn."
    try:
        q_rows, k_rows = shapes[attn + "q_proj.weight"][0], shapes[attn + "k_proj.weight"][0]
        intermediate_size = shapes["layers.0.mlp.gate_proj.weight"][0]
    except KeyError as e:
        raise Flux2Error(f"{what} lacks {e.args[0]}: the file is incomplete, download it again") from None
    if q_rows % head_dim or k_rows % head_dim:
        raise Flux2Error(
            f"{what}: q/k projections ({q_rows}, {k_rows} rows) are not whole heads of {head_dim}{mismatch}"
        )
    return q_rows // head_dim, k_rows // head_dim, intermediate_size


def rope_theta(config: dict, default: float) -> float:
    """``rope_theta`` of a config.json (transformers 5 nests it in ``rope_parameters``)."""
    rope = config.get("rope_parameters") or {}
    return float(config.get("rope_theta") or rope.get("rope_theta") or default)
