"""Reference K/V kept across runs (9B-KV): a bounded store, least recently used first out, by bytes.

The reference K/V depend only on the model's weights, its dtype and device, the reference latents and their
position ids: never on the prompt, the seed, the step, the output size or the batch (a cache of one batch item
serves any batch size and both CFG passes). The key is exactly those inputs; any change of a reference, the
model, the dtype or the device misses. Entries of a model are dropped when the model object goes away, and
entries on a device the model no longer sits on are dropped when it is next used.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Callable

import torch

from .dit.kv_cache import RefKVCache
from .dit.transformer import Flux2Model
from .limits import available_memory
from .references import ReferenceLatents

log = logging.getLogger(__name__)

FREE_MEMORY_SHARE = 0.25  # the store never grows past this share of the device's free memory


class RefKVStore:
    def __init__(self, max_bytes: int | None = None):
        self.max_bytes = max_bytes  # None: a share of the free memory when an entry is added
        self._entries: OrderedDict[tuple, RefKVCache] = OrderedDict()
        self.hits = self.misses = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return sum(cache.nbytes() for cache in self._entries.values())

    def get(self, model: Flux2Model, references: ReferenceLatents, compute: Callable[[], RefKVCache]):
        """(cache, reused): the stored K/V for these references on this model, or ``compute()``'s, stored."""
        net = model.transformer
        self._drop_moved(_model_token(net, self), net.device)
        key = reference_key(model, references, self)
        cache = self._entries.get(key)
        if cache is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return cache, True
        self.misses += 1
        cache = compute()
        self._put(key, cache, net.device)
        return cache, False

    def clear(self) -> None:
        """Drop every entry and reset the hit / miss counts."""
        self._entries.clear()
        self.hits = self.misses = 0

    def forget_model(self, net: torch.nn.Module) -> None:
        """Drop every entry of this model (it is leaving its device)."""
        token = getattr(net, "_kv_store_token", None)
        if token is not None and any(k[0] == token for k in self._entries):
            self.forget(token)
            log.info("reference K/V of a model that left its device dropped")

    def forget(self, token: str) -> None:
        for key in [k for k in self._entries if k[0] == token]:
            del self._entries[key]

    def _drop_moved(self, token: str, device: torch.device) -> None:
        for key in [k for k in self._entries if k[0] == token and k[2] != str(device)]:
            del self._entries[key]

    def _put(self, key: tuple, cache: RefKVCache, device: torch.device) -> None:
        size = cache.nbytes()
        budget = self.max_bytes
        if budget is None:
            free = available_memory(device)
            budget = int(FREE_MEMORY_SHARE * (free + self.nbytes)) if free is not None else size
        if size <= budget:
            while self._entries and self.nbytes + size > budget:
                self._entries.popitem(last=False)
            self._entries[key] = cache
        else:  # the others stay: this one alone would not fit
            log.info(
                "reference K/V of %.2f GB exceed the cache budget of %.2f GB: not kept",
                size / 2**30,
                budget / 2**30,
            )


def reference_key(model: Flux2Model, references: ReferenceLatents, store: RefKVStore) -> tuple:
    net = model.transformer
    digest = hashlib.sha256()
    digest.update(references.tokens.detach().float().cpu().contiguous().numpy().tobytes())
    digest.update(references.ids.to(torch.int64).cpu().contiguous().numpy().tobytes())
    for lora in model.loras:  # LoRAs change the K/V: each set of them has its own entries
        digest.update(f"{lora.name}:{lora.strength}:{id(lora)};".encode())
    return _model_token(net, store), str(net.dtype), str(net.device), digest.hexdigest()


def _model_token(net: torch.nn.Module, store: RefKVStore) -> str:
    """A name for this loaded model, fixed for its life; its entries go when it is garbage collected."""
    token = getattr(net, "_kv_store_token", None)
    if token is None:
        token = uuid.uuid4().hex
        net._kv_store_token = token
        weakref.finalize(net, store.forget, token)
    return token
