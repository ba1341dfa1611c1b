"""The device memory the suite holds at each stage of a shape, added up from the tensors it holds.

``suite.py --dry-run`` builds every model on the meta device (shapes, no memory) and runs no call, so the
ledger answers before a GPU is lent whether a ``--gpu-real`` run fits the card: each stage's count is the
unique storages of the models alive at that point (a tensor two models share counts once), plus an
allowance for what cannot be held on meta (activations, a load probe's copy in its own process, native
ComfyUI's copy when it is not built). On a GPU the same stages also record ``memory_allocated``, so the
first real run checks the counts.
"""

from __future__ import annotations

import torch

from flux2_core.sampling_checks import ACTIVATION_ROWS

GIB = 2**30
HEADROOM = 0.95  # of the card: the CUDA context, the allocator's rounding and cached blocks take the rest


def tensors_of(obj, depth: int = 2):
    """Every tensor a model, a state dict or a suite implementation (its attributes, two levels) holds."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
    elif isinstance(obj, dict):
        for value in obj.values():
            yield from tensors_of(value, depth)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from tensors_of(value, depth)
    elif depth > 0 and hasattr(obj, "__dict__"):
        for value in vars(obj).values():
            yield from tensors_of(value, depth - 1)


def held_bytes(*objs, device: torch.device | None = None) -> int:
    """The bytes of the unique storages the objects hold (on ``device`` when given)."""
    seen: dict[int, int] = {}
    for obj in objs:
        for t in tensors_of(obj):
            if device is None or t.device == device:
                storage = t.untyped_storage()
                seen[storage._cdata] = storage.nbytes()
    return sum(seen.values())


def step_allowance(config, dtype: torch.dtype, tokens: int) -> int:
    """Activations of the largest step, for whichever implementation runs it: twice our own estimate
    (``sampling_memory``'s rows a token; diffusers' measured peak is up to twice ours)."""
    return 2 * tokens * config.hidden_size * ACTIVATION_ROWS * (torch.finfo(dtype).bits // 8)


def vae_allowance(size: int, dtype: torch.dtype) -> int:
    """A full-width VAE encode or decode of a ``size``² image: about 16 tensors of 128 channels at full
    resolution at its peak."""
    return 16 * 128 * size * size * (torch.finfo(dtype).bits // 8)


class Ledger:
    """Stage by stage, what one shape holds on the device: ``stage(label, *held, extra=...)``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stages: list[dict] = []

    def stage(self, label: str, *held, extra: int = 0, note: str = "") -> None:
        row = {"stage": label, "held_bytes": held_bytes(*held, device=self.device), "extra_bytes": extra}
        row["total_bytes"] = row["held_bytes"] + extra
        if note:
            row["note"] = note
        if self.device.type == "cuda":
            row["allocated_bytes"] = torch.cuda.memory_allocated(self.device)
        self.stages.append(row)

    @property
    def peak(self) -> int:
        return max((s["total_bytes"] for s in self.stages), default=0)

    def lines(self, card_bytes: int) -> list[str]:
        out = []
        for s in self.stages:
            measured = f", {s['allocated_bytes'] / GIB:.1f} GiB allocated" if "allocated_bytes" in s else ""
            note = f" ({s['note']})" if "note" in s else ""
            out.append(
                f"  {s['stage']:<34} {s['held_bytes'] / GIB:6.1f} GiB held + {s['extra_bytes'] / GIB:5.1f} "
                f"GiB allowance = {s['total_bytes'] / GIB:6.1f} GiB{measured}{note}"
            )
        verdict = "fits" if self.peak <= HEADROOM * card_bytes else "DOES NOT FIT"
        out.append(
            f"  peak {self.peak / GIB:.1f} GiB: {verdict} in {HEADROOM:.0%} of {card_bytes / GIB:.0f} GiB"
        )
        return out


def card_bytes(device: torch.device, card_gb: float | None) -> int:
    """The memory to fit in: ``--card-gb`` when given, else the CUDA device's, else 80 GiB (the smaller of
    the large cards the device check is sized for)."""
    if card_gb:
        return int(card_gb * GIB)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return 80 * GIB
