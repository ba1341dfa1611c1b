"""The one exception type the core raises for problems a user can fix, and the out-of-memory type of the
installed torch.

Every message names what is wrong and what to do about it, so the command line and the ComfyUI nodes can show
it as it is, without a traceback.
"""

from __future__ import annotations

import torch


class Flux2Error(ValueError):
    """A bad file, a wrong model pairing or an impossible setting; the message says how to fix it."""


STREAM_AND_COMPILE = (
    "torch.compile and block streaming cannot be combined (streaming swaps the blocks' weights under the "
    "compiled code): use one of them (--compile or --offload stream), loading the model again"
)


def out_of_memory_type(torch_module=torch) -> type[BaseException]:
    """``torch.OutOfMemoryError`` (torch 2.5 and later), else ``torch.cuda.OutOfMemoryError`` (2.4), which
    the later one is an alias of."""
    found = getattr(torch_module, "OutOfMemoryError", None)
    return found if found is not None else torch_module.cuda.OutOfMemoryError


# Resolved once: an ``except`` clause naming an attribute the installed torch lacks would itself raise an
# AttributeError on every exception passing through it, interrupts included.
OutOfMemory = out_of_memory_type()
