"""Block streaming: run a DiT whose weights do not fit on the GPU, keeping most of them in CPU memory.

``enable_streaming(transformer, device, resident_bytes)`` keeps the model's small parts (embedders,
modulation, final layer, norms) and as many whole blocks as fit in ``resident_bytes`` on the device (the
residency plan: ``residency.plan_residency``, pure arithmetic on the blocks' sizes); the linear weights of
every other block live in CPU memory (one page-locked arena per model: ``host_memory``) and are copied to the
device right before their block runs (the next one's copy under way on a side CUDA stream while the current
block computes), then dropped. A 9B DiT (18 GB in bf16) then needs about three blocks of weights (2-3 GB) on
top of the resident part. Streamed weights are taken out of the module's parameters and buffers, so
``module.to(device)`` (which ComfyUI's model patcher calls), ``state_dict()`` and parameter counts see the
resident part only. Each streamed layer computes through its original weight source on device copies of its
stored tensors, so every storage format and LoRA patch computes exactly what it computes resident
(bit-identical). ``disable_streaming`` puts every tensor back into the module, on its original device. On a
CPU device the same path runs with plain copies and no streams.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

import torch
from torch import nn

from ..errors import STREAM_AND_COMPILE, Flux2Error
from ..hooks import set_weight_mover, weight_mover
from ..ops import Linear, linears
from .block_buffer import Slot, layout, slot_views
from .host_memory import HostArena, registrar
from .residency import ResidencyPlan, plan_residency

log = logging.getLogger(__name__)


# Streamed blocks on the device at once: the one computing, the next arriving, the last one being freed.
BLOCKS_IN_FLIGHT = 3


class _OnDevice:
    """What the original source reads of a streamed layer: its stored tensors on the compute device, every
    other attribute (sizes, patches) from the layer itself."""

    def __init__(self, layer: Linear, tensors: dict[str, torch.Tensor]):
        self.weight = tensors.pop("weight")
        self._buffers = tensors
        self._layer = layer

    def __getattr__(self, name: str):
        return getattr(self._layer, name)


class StreamedWeight:
    """The weight source of a streamed linear layer: its original source, fed with device copies of the
    tensors this source keeps in CPU memory for it."""

    def __init__(self, inner, block: _Block, slots: list[Slot], param: nn.Parameter):
        self.inner = inner
        self.block = block
        self.slots = slots
        self.param = param  # the layer's weight parameter, its data in the block's CPU buffer
        self.span = (slots[0].offset, slots[-1].offset + slots[-1].nbytes)

    def __repr__(self) -> str:
        return f"StreamedWeight({self.inner!r})"

    def tensors(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The layer's stored tensors on ``device``: from its block's copy while the block runs, else copied
        for this one call."""
        return self.block.streamer.tensors(self, _normal(device))

    def weight(self, layer: Linear, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        return self.inner.weight(_OnDevice(layer, self.tensors(device)), dtype, device)

    def linear(self, layer: Linear, x: torch.Tensor) -> torch.Tensor | None:
        own = getattr(self.inner, "linear", None)
        return None if own is None else own(_OnDevice(layer, self.tensors(x.device)), x)


@dataclass(eq=False)
class _Block:
    """One streamed block: its layers' tensors packed in one CPU buffer, and its device copy while in use."""

    streamer: BlockStreamer
    position: int  # in run order
    host: torch.Tensor  # uint8, the packed stored tensors of every streamed layer
    pinned: bool
    layers: list[tuple[Linear, StreamedWeight]] = field(default_factory=list)
    copy: torch.Tensor | None = None  # the device copy of ``host``
    ready: torch.cuda.Event | None = None  # recorded on the side stream when ``copy`` has arrived


class BlockStreamer:
    """The streaming of a transformer's blocks, as its residency plan says.

    ``resident_blocks`` / ``streamed_blocks``: block indices in run order (``transformer.blocks()``);
    ``streamed_bytes``: the weights kept in CPU memory; ``resident_bytes``: what stays in the module (and on
    the device); ``working_bytes``: the most the streamed copies take on the device during a forward;
    ``device_bytes``: streamed weights on the device right now (0 between forwards).
    """

    def __init__(self, transformer: nn.Module, device: torch.device, plan: ResidencyPlan):
        self.transformer = transformer
        self.device = device
        self.plan = plan
        self.resident_blocks, self.streamed_blocks = plan.resident, plan.streamed
        self.resident_bytes, self.streamed_bytes = plan.resident_bytes, plan.streamed_bytes
        self.home: torch.device | None = None  # where the module was, when enabling moved it
        self._blocks: dict[int, _Block] = {}  # position -> streamed block
        self._next: dict[int, _Block] = {}  # position (-1: before the first block) -> next streamed block
        self._active: _Block | None = None  # the streamed block running now
        self._live: set[_Block] = set()  # blocks holding a device copy
        self._done: deque = deque()  # compute-stream events, one per finished streamed block
        self._side: dict[torch.device, torch.cuda.Stream] = {}
        self._handles: list = []
        self.arena: HostArena | None = None  # the CPU memory of the streamed blocks

    def __repr__(self) -> str:
        return (
            f"BlockStreamer({len(self.resident_blocks)} blocks resident, {len(self.streamed_blocks)} "
            f"streamed: {self.resident_bytes / 2**20:.0f} MiB resident, {self.streamed_bytes / 2**20:.0f} "
            f"MiB streamed, to {self.device})"
        )

    @property
    def working_bytes(self) -> int:
        """The most device memory the streamed copies take during a forward (three blocks: the one computing,
        the next one arriving, the last one until the device is done with it): add it to a run's memory."""
        return BLOCKS_IN_FLIGHT * max((b.host.numel() for b in self._blocks.values()), default=0)

    @property
    def device_bytes(self) -> int:
        return sum(b.copy.numel() for b in self._live if b.copy is not None)

    def release(self) -> None:
        """Drop every device copy now (after an interrupted run, or before the device memory is needed)."""
        self._drop_all()
        while self._done:
            self._done.popleft().synchronize()

    # --- the copies -------------------------------------------------------------------------------------

    def tensors(self, weight: StreamedWeight, device: torch.device) -> dict[str, torch.Tensor]:
        block = weight.block
        if block is self._active:
            self._enter(block, device)  # a no-op when the block's copy is already waited for
            return slot_views(block.copy, weight.slots, 0)
        lo, hi = weight.span  # a layer called outside its block: a copy for this call only
        return slot_views(
            block.host[lo:hi].to(device, copy=True, non_blocking=block.pinned), weight.slots, lo
        )

    def _start(self, block: _Block, device: torch.device) -> None:
        """Begin copying ``block`` to ``device`` (on the side stream for CUDA) unless it is there already."""
        if block.copy is not None and block.copy.device == device:
            return
        self._drop(block)
        if device.type == "cuda":
            side = self._side.get(device)
            if side is None:
                side = self._side[device] = torch.cuda.Stream(device)
            with torch.cuda.stream(side):
                copy = torch.empty(block.host.shape, dtype=torch.uint8, device=device)
                copy.copy_(block.host, non_blocking=block.pinned)
                block.ready = torch.cuda.Event()
                block.ready.record(side)
        else:
            copy = block.host.to(device, copy=True)
        block.copy = copy
        self._live.add(block)

    def _enter(self, block: _Block, device: torch.device) -> None:
        """Make the compute stream wait for ``block``'s copy (starting it now if it was not prefetched)."""
        self._start(block, device)
        if block.ready is not None:
            compute = torch.cuda.current_stream(device)
            compute.wait_event(block.ready)
            block.copy.record_stream(compute)  # freed only once the compute stream is past its use
            block.ready = None

    def _drop_all(self) -> None:
        for block in list(self._live):
            self._drop(block)
        self._active = None

    def _drop(self, block: _Block) -> None:
        block.copy, block.ready = None, None
        self._live.discard(block)

    # --- the hooks --------------------------------------------------------------------------------------

    def _before(self, position: int, args: tuple) -> None:
        device = next((_normal(a.device) for a in args if isinstance(a, torch.Tensor)), self.device)
        block, upcoming = self._blocks.get(position), self._next.get(position)
        for stale in [b for b in self._live if b is not block and b is not upcoming]:
            self._drop(stale)  # left by an interrupted block or a forward that stopped early
        if block is not None:
            self._enter(block, device)
            self._active = block
        if upcoming is not None and upcoming is not block:
            while len(self._done) > 1:  # the host at most two blocks ahead: at most three copies exist
                self._done.popleft().synchronize()
            self._start(upcoming, device)

    def _after(self, position: int) -> None:
        block = self._blocks.get(position)
        if block is None:
            return
        if block.copy is not None and block.copy.device.type == "cuda":
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(block.copy.device))
            self._done.append(done)
        if self._active is block:
            self._active = None
        self._drop(block)

    def _hook(self, blocks: list[nn.Module], first: nn.Module | None, last: nn.Module | None = None) -> None:
        if last is not None:  # no block runs after it: drop the copies of a step that stopped early
            self._handles.append(last.register_forward_pre_hook(lambda m, args: self._drop_all()))
        for position, module in enumerate(blocks):
            self._handles.append(
                module.register_forward_pre_hook(lambda m, args, p=position: self._before(p, args))
            )
            if position in self._blocks:
                self._handles.append(module.register_forward_hook(lambda m, a, o, p=position: self._after(p)))
        if first is not None:  # the first streamed block's copy starts while the inputs are embedded
            self._handles.append(first.register_forward_pre_hook(lambda m, args: self._before(-1, args)))

    # --- taking weights out and putting them back ---------------------------------------------------------

    def take(self, lock=None) -> None:
        """Move the streamed blocks' stored tensors out of the module into one CPU arena (page-locked through
        ``lock``, a ``host_memory`` registrar, when given), chain their prefetch and hook every block."""
        blocks = list(self.transformer.blocks())
        layouts = {p: layout(_streamable(blocks[p])) for p in self.streamed_blocks}
        self.arena = HostArena([size for _, size in layouts.values()], lock)
        for k, position in enumerate(self.streamed_blocks):  # each block's tensors go once its copy is in
            self._stream(position, layouts.pop(position)[0], self.arena.block(k))
        self.arena.pin()
        for k, block in enumerate(self._blocks.values()):
            block.pinned = self.arena.pinned(k)
        self._next = {
            position: self._blocks[upcoming] for position, upcoming in self.plan.next_streamed.items()
        }
        first, last = (
            getattr(self.transformer, "img_in", None),
            getattr(self.transformer, "final_layer", None),
        )
        self._hook(blocks, first, last)

    def _stream(self, position: int, plans: list, host: torch.Tensor) -> None:
        """Move the stored tensors ``plans`` lays out (``layout``) into ``host`` and out of the module."""
        block = _Block(self, position, host, pinned=False)
        for layer, stored, slots in plans:
            views = slot_views(host, slots, 0)
            for role, tensor in stored.items():
                views[role].copy_(tensor)
            param = layer._parameters["weight"]
            param.data = views.pop("weight")
            weight = StreamedWeight(layer.source, block, slots, param)
            layer._parameters["weight"] = None  # out of the module: .to(), state_dict and sizes skip it
            for role in views:
                layer._buffers[role] = None
            layer.source = weight
            block.layers.append((layer, weight))
        self._blocks[position] = block

    def _restore(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self.release()
        for side in self._side.values():  # no copy may still read the host memory about to be unlocked
            side.synchronize()
        for block in self._blocks.values():
            for layer, weight in block.layers:
                views = slot_views(block.host, weight.slots, 0)
                for slot in weight.slots:  # weights from the CPU stay in the arena: nothing is copied
                    tensor = views[slot.role]
                    if slot.home.type != "cpu":
                        tensor = tensor.to(slot.home, copy=True)
                    if slot.role == "weight":
                        weight.param.data = tensor
                        layer._parameters["weight"] = weight.param
                    else:
                        layer._buffers[slot.role] = tensor
                layer.source = weight.inner
        self._blocks.clear()
        self._next.clear()
        if self.arena is not None:
            self.arena.unpin()


def streamed_device_bytes(total: int, blocks: int, resident: int = 0) -> int:
    """From the file's numbers alone, the most a streamed model of ``total`` weight bytes in ``blocks``
    blocks holds on the device: ``resident`` bytes kept there, plus the blocks in flight."""
    in_flight = BLOCKS_IN_FLIGHT * total // max(blocks, 1)
    return min(total, resident + in_flight)


def enable_streaming(
    transformer: nn.Module,
    device: torch.device | str,
    resident_bytes: int = 0,
    pin: bool | None = None,
    move: bool = True,
) -> BlockStreamer:
    """Stream the blocks of ``transformer`` (anything with ``blocks()`` in run order) to ``device``.

    ``resident_bytes`` is the budget of weights that stay on the device, as stored: the parts outside the
    blocks and the blocks' small tensors (norms) always stay and count first, then blocks are kept whole, in
    run order, while they fit; every other block is streamed (0 streams every block). The streamed weights
    move to CPU memory, page-locked when ``device`` is a CUDA device and ``pin`` is not False (``pin=False``:
    ordinary memory, slower copies). ``move`` moves the resident part to ``device`` now; a host that moves
    the module itself (ComfyUI's model patcher) passes False. Streamed copies always go to the device the
    block's input is on. Enabling again replaces the previous setting.
    """
    disable_streaming(transformer)
    if any(getattr(b, "_compiled_call_impl", None) is not None for b in transformer.blocks()):
        raise Flux2Error(STREAM_AND_COMPILE)
    device = _normal(device)
    if pin is None:
        pin = device.type == "cuda"
    heavy = [
        sum(t.nbytes for _, layer in linears(b) for t in _stored(layer).values())
        for b in transformer.blocks()
    ]
    total = sum(t.nbytes for t in transformer.parameters()) + sum(t.nbytes for t in transformer.buffers())
    streamer = BlockStreamer(transformer, device, plan_residency(heavy, total, resident_bytes))
    streamer.take(registrar() if pin else None)
    set_weight_mover(transformer, streamer)
    if move:
        streamer.home = _module_device(transformer)
        transformer.to(device)
    log.info("%r", streamer)
    return streamer


def disable_streaming(transformer: nn.Module) -> None:
    """Put every streamed tensor back into its layer, on the device it came from, with its original source;
    a module that ``enable_streaming`` moved goes back where it was. Does nothing if nothing is streamed."""
    streamer = streamer_of(transformer)
    if streamer is None:
        return
    streamer._restore()
    set_weight_mover(transformer, None)
    if streamer.home is not None:
        transformer.to(streamer.home)


def streamer_of(transformer: nn.Module) -> BlockStreamer | None:
    """The streamer ``enable_streaming`` registered on ``transformer`` (through the hooks seam), or None."""
    return mover if isinstance(mover := weight_mover(transformer), BlockStreamer) else None


def _streamable(block: nn.Module) -> list[tuple[Linear, dict[str, torch.Tensor]]]:
    """Each linear layer of ``block`` that streaming moves, with its stored tensors."""
    return [(layer, stored) for _, layer in linears(block) if (stored := _stored(layer))]


def _stored(layer: Linear) -> dict[str, torch.Tensor]:
    """What a layer's source reads and streaming moves: the weight and the buffers (scales), not the bias."""
    weight = layer._parameters.get("weight")
    if weight is None or isinstance(layer.source, StreamedWeight):
        return {}
    return {"weight": weight.data} | {k: v for k, v in layer._buffers.items() if v is not None}


def _module_device(module: nn.Module) -> torch.device:
    device = getattr(module, "device", None)
    if isinstance(device, torch.device):
        return device
    return next((p.device for p in module.parameters()), torch.device("cpu"))


def _normal(device: torch.device | str) -> torch.device:
    """``device`` with its index ("cuda" -> "cuda:0"), so copies are matched to the device they are on."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device
