"""Reference key/value cache of the klein 9B-KV checkpoint.

Reference tokens are modulated at t = 0 and attend only to themselves, so their keys and values in every
block (after QK-norm and RoPE) depend on the reference latents alone: not on the prompt, the noise, the
timestep or the step. ``Flux2Transformer.encode_reference_kv`` computes them once by running the references
on their own; every sampling step, the first included, then runs only text and noisy tokens and splices the
stored K/V in between: ``K = [k_txt, k_ref, k_img]``. A cache can therefore serve any number of runs.
"""

from __future__ import annotations

import torch

from ..errors import Flux2Error


class RefKVLayer:
    """Keys and values of the reference tokens in one block, [B, heads, R, head_dim]."""

    def __init__(self, batch_shared: bool = False) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.batch_shared = batch_shared  # every batch item has the same references: keep one copy

    @property
    def filled(self) -> bool:
        return self.k is not None

    def store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        # Copies, not views: a view would keep the whole K tensor (or a single block's fused linear1 output)
        # alive as long as the cache.
        if self.batch_shared:
            k, v = k[:1], v[:1]
        self.k = k.clone(memory_format=torch.contiguous_format)
        self.v = v.clone(memory_format=torch.contiguous_format)

    def get(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is None or self.v is None:
            raise Flux2Error(
                "the reference KV cache is empty: encode the references' K/V (encode_reference_kv) before "
                "sampling with it"
            )
        if self.k.shape[0] == batch_size:
            return self.k, self.v
        if self.k.shape[0] == 1:
            return self.k.expand(batch_size, -1, -1, -1), self.v.expand(batch_size, -1, -1, -1)
        raise Flux2Error(
            f"the reference KV cache was filled for a batch of {self.k.shape[0]}, not {batch_size}: "
            "encode it again for this batch size"
        )


class RefKVCache:
    """One ``RefKVLayer`` per double and per single block.

    ``batch_shared``: the references are the same for every batch item (the usual case), so one copy of their
    K/V is kept and expanded to any batch size when read.
    """

    def __init__(self, num_double: int, num_single: int, batch_shared: bool = False) -> None:
        self.double = [RefKVLayer(batch_shared) for _ in range(num_double)]
        self.single = [RefKVLayer(batch_shared) for _ in range(num_single)]

    @property
    def layers(self) -> list[RefKVLayer]:
        return self.double + self.single

    @property
    def filled(self) -> bool:
        return all(layer.filled for layer in self.layers)

    @property
    def num_tokens(self) -> int:
        """Reference tokens the cache holds (0 while empty)."""
        first = self.double[0] if self.double else None
        return first.k.shape[2] if first is not None and first.k is not None else 0

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for layer in self.layers for t in (layer.k, layer.v) if t is not None
        )
