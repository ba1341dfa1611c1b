"""What the processes running one DiT exchange: ``LocalComm`` (one process: nothing), ``TensorComm`` and
``SequenceComm`` (Ulysses), with the same methods. The DiT calls them at one place each: around its blocks
(``split_tokens`` / ``gather_tokens``), the bias of the keys (``arrange_keys``), the step cache's statistics
(``sum_image_tokens``), and, under sequence parallelism, around attention (``to_heads`` / ``to_tokens``,
through ``layers.BlockCall``). Tensor parallelism sums the row-parallel layers' partial outputs in hooks on
those layers (``devices.parallel.use_comm``): the blocks never see it. How a run is split across processes,
and how it starts, is ``devices.parallel``'s.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class LocalComm:
    mode = "local"
    exchanges_heads = False  # whether attention trades the sequence for heads (Ulysses)

    def to_heads(self, q, k, v) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """[B, heads, local tokens, D] -> [B, local heads, all tokens, D] (Ulysses), before attention."""
        return q, k, v

    def to_tokens(self, out: torch.Tensor) -> torch.Tensor:
        """The inverse of ``to_heads``, after attention."""
        return out

    def split_tokens(self, txt, img, ids) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This process's text and image tokens (and their ids, ``[text ids; image ids]``)."""
        return txt, img, ids

    def gather_tokens(self, img: torch.Tensor) -> torch.Tensor:
        """Every image token, from this process's ``split_tokens`` share."""
        return img

    def arrange_keys(self, values: torch.Tensor) -> torch.Tensor:
        """A value per token [L] in ``[text; image]`` order -> the order of the keys attention sees after
        ``to_heads`` (per-key attention bias travels with its keys)."""
        return values

    def sum_image_tokens(self, stats: torch.Tensor) -> torch.Tensor:
        """[K, B, local image tokens] per-token statistics -> [K] sums over every real image token of every
        process (the same numbers on all of them)."""
        return stats.flatten(1).sum(1)


LOCAL = LocalComm()


class TensorComm(LocalComm):
    """Tensor parallelism: the row-parallel layers' partial outputs are summed over the group, each in one
    ``all_reduce`` in a hook on the layer (``use_comm``), so the blocks never see it."""

    mode = "tensor"

    def __init__(self, group=None):
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)

    def sum_partials(self, layer: nn.Module, args, out: torch.Tensor) -> torch.Tensor:
        """A row-parallel layer's forward hook: its full output from this process's partial sum."""
        out = out.contiguous()
        dist.all_reduce(out, group=self.group)
        return out

    def sum_image_tokens(self, stats: torch.Tensor) -> torch.Tensor:
        out = stats.flatten(1).sum(1)  # every process holds every token: the sums are world times one's
        dist.all_reduce(out, group=self.group)
        return out


class SequenceComm(LocalComm):
    """Ulysses sequence parallelism (see the module docstring). ``split_tokens`` records the layout of one
    forward (real and padded lengths), which its attentions and ``gather_tokens`` then use."""

    mode = "sequence"
    exchanges_heads = True

    def __init__(self, group=None):
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self._layout: tuple[int, int, int, int] | None = None  # text, image tokens; their shares
        self._keep: torch.Tensor | None = None  # real positions of the gathered sequence (None: no pads)

    def split_tokens(self, txt, img, ids):
        p, num_txt, num_img = self.world, txt.shape[1], img.shape[1]
        tc, ic = -(-num_txt // p), -(-num_img // p)
        self._layout = (num_txt, num_img, tc, ic)
        self._keep = None
        if tc * p != num_txt or ic * p != num_img:  # which places of the gathered sequence are real tokens
            rank, place = torch.arange(p)[:, None], torch.arange(tc + ic)[None]
            real = torch.where(place < tc, rank * tc + place < num_txt, rank * ic + place - tc < num_img)
            self._keep = torch.arange(p * (tc + ic)).view(p, -1)[real].to(img.device)
        ids = torch.cat([self._share(ids[:num_txt], 0, tc), self._share(ids[num_txt:], 0, ic)])
        return self._share(txt, 1, tc), self._share(img, 1, ic), ids

    def _share(self, x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
        """This rank's ``size`` entries of ``x`` along ``dim``, zero-padded past the end of ``x``."""
        start = self.rank * size
        part = x.narrow(dim, min(start, x.shape[dim]), max(0, min(size, x.shape[dim] - start)))
        if part.shape[dim] == size:
            return part
        pad = list(part.shape)
        pad[dim] = size - part.shape[dim]
        return torch.cat([part, part.new_zeros(pad)], dim=dim)

    def arrange_keys(self, values: torch.Tensor) -> torch.Tensor:
        num_txt, _, tc, ic = self._layout
        p = self.world
        txt = _padded(values[:num_txt], tc * p).view(p, tc)
        img = _padded(values[num_txt:], ic * p).view(p, ic)
        out = torch.cat([txt, img], dim=1).reshape(-1)  # rank r's [text share; image share], rank by rank
        return out if self._keep is None else out.index_select(0, self._keep.to(out.device))

    def to_heads(self, q, k, v):
        batch, heads, length, dim = q.shape
        p = self.world
        x = torch.stack([q, k, v]).view(3, batch, p, heads // p, length, dim)
        x = x.permute(2, 0, 1, 3, 4, 5).contiguous()  # [p, 3, B, h/p, L/p, D]: share i goes to rank i
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=self.group)  # share i: rank i's tokens of this rank's heads
        out = out.permute(1, 2, 3, 0, 4, 5).reshape(3, batch, heads // p, p * length, dim)
        if self._keep is not None:
            out = out.index_select(3, self._keep)
        return out[0], out[1], out[2]

    def to_tokens(self, out: torch.Tensor) -> torch.Tensor:
        batch, local_heads, _, dim = out.shape
        p, (_, _, tc, ic) = self.world, self._layout
        length = tc + ic
        if self._keep is not None:
            full = out.new_zeros(batch, local_heads, p * length, dim)
            out = full.index_copy_(2, self._keep, out)
        x = out.reshape(batch, local_heads, p, length, dim).permute(2, 0, 1, 3, 4).contiguous()
        back = torch.empty_like(x)
        dist.all_to_all_single(back, x, group=self.group)  # share i: this rank's tokens of head group i
        return back.permute(1, 0, 2, 3, 4).reshape(batch, p * local_heads, length, dim)

    def sum_image_tokens(self, stats: torch.Tensor) -> torch.Tensor:
        _, num_img, _, ic = self._layout
        real = (self.rank * ic + torch.arange(stats.shape[-1], device=stats.device)) < num_img  # no pads
        out = (stats * real).flatten(1).sum(1)
        dist.all_reduce(out, group=self.group)
        return out

    def gather_tokens(self, img: torch.Tensor) -> torch.Tensor:
        shares = [torch.empty_like(img) for _ in range(self.world)]
        dist.all_gather(shares, img.contiguous(), group=self.group)
        return torch.cat(shares, dim=1)[:, : self._layout[1]]


def _padded(values: torch.Tensor, size: int) -> torch.Tensor:
    """``values`` [n] followed by zeros up to ``size`` (the padded places of a token share)."""
    return torch.cat([values, values.new_zeros(size - values.shape[0])])
