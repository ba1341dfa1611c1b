"""Applying prepared LoRAs to a model for the length of a run, and removing them exactly afterwards.

A LoRA's patches are added to the layers' patch lists under an owner name (never written into the stored
weights), so removing the owner restores every layer exactly and models with and without the LoRA share
one copy of the weights.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
from collections.abc import Iterator, Sequence

from torch import nn

from ..errors import Flux2Error
from ..ops import WeightPatch, linears
from .keys import DIT, TE

log = logging.getLogger(__name__)

_OWNERS = itertools.count()


def attach(module: nn.Module, patches: dict[str, list[WeightPatch]], owner: str) -> None:
    """Add ``patches`` (layer name -> patches) to ``module``'s layers under ``owner`` (all or none)."""
    module = unwrap(module)
    layers = dict(linears(module))
    try:
        for target, items in patches.items():
            if target not in layers:
                raise Flux2Error(
                    f"the LoRA patches {target}, which this model does not have: prepare the LoRA for the "
                    "model it is applied to"
                )
            for i, patch in enumerate(items):
                try:
                    layers[target].add_patch(f"{owner}/{i}", patch)
                except ValueError as e:
                    raise Flux2Error(
                        f"{e}: the LoRA was prepared for another model; prepare it again"
                    ) from None
    except BaseException:
        detach(module, owner)
        raise


def detach(module: nn.Module, owner: str) -> None:
    """Remove every patch ``owner`` added to ``module``; the layers compute exactly as before."""
    for _, layer in linears(unwrap(module)):
        layer.remove_patches(owner)


@contextlib.contextmanager
def applied(transformer: nn.Module, text_encoder: nn.Module | None, loras: Sequence) -> Iterator[None]:
    """Apply ``loras`` (``Lora`` objects) in order for the body of the ``with``, then remove them, whatever
    the body raises."""
    if text_encoder is None:
        for lora in loras:
            if lora.patches.get(TE):
                log.warning("%s: text encoder patches not applied (no text encoder given)", lora.name)
    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(transformer, DIT, loras))
        if text_encoder is not None:
            stack.enter_context(patched(text_encoder, TE, loras))
        yield


@contextlib.contextmanager
def patched(module: nn.Module, domain: str, loras: Sequence) -> Iterator[None]:
    """Apply only the ``domain`` part ("diffusion_model" or "text_encoder") of ``loras`` to ``module`` for the
    body of the ``with``; nothing to apply costs nothing."""
    parts = [lora for lora in loras if lora.patches.get(domain)]
    if not parts:
        yield
        return
    module = unwrap(module)
    owners = []
    try:
        for lora in parts:
            owners.append(f"lora{next(_OWNERS)}")
            attach(module, lora.patches[domain], owners[-1])
        yield
    finally:
        for owner in reversed(owners):
            detach(module, owner)


def unwrap(obj):
    """Our module inside a Flux2Model (``.transformer``) or a TextEncoder (``.model``), or ``obj`` itself."""
    if obj is None or isinstance(obj, nn.Module):
        return obj
    for attr in ("transformer", "model"):
        if isinstance(inner := getattr(obj, attr, None), nn.Module):
            return inner
    raise TypeError(f"expected a torch module, a Flux2Model or a TextEncoder, got {type(obj).__name__}")
