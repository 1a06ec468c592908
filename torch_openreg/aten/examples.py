"""Examples of the Python registration forms: an operator with its own kernel, a per-operator
route to the boxed fallback, and a fallthrough.

They sit beside the global fallback (``fallback.py``) and compute the same way: outputs are
allocated on the device at the call, and the arithmetic runs later, as a launch on the current
stream, over host views of the device buffers (``launch.py``).
"""

from __future__ import annotations

import functools

import torch

from . import fallback
from .launch import host_view, launch


# LITERALINCLUDE START: PYTHON KERNEL
def silu(x: torch.Tensor) -> torch.Tensor:
    """``aten::silu`` with a hand-written Python kernel: ``x * sigmoid(x)``."""
    if not (x.is_floating_point() or x.is_complex()):  # checks run at the call, as on a real device
        raise RuntimeError(f"silu: expected a floating point or complex tensor, got {x.dtype}")
    out = torch.empty_like(x)
    launch(x.device.index, _silu_kernel, host_view(out), host_view(x), tensors=(out, x), writes=(out,), name="silu")
    return out


def _silu_kernel(out: torch.Tensor, x: torch.Tensor) -> None:
    torch.sigmoid(x, out=out)
    out.mul_(x)
# LITERALINCLUDE END: PYTHON KERNEL


# LITERALINCLUDE START: PER OPERATOR FALLBACK
def boxed(op: torch._ops.OpOverload):
    """A kernel for one operator that sends it to the boxed fallback on purpose.

    ``aten::addcmul`` is a structured operator: without a kernel of its own, PyTorch's generic
    kernel infers the shape, allocates with ``empty_strided`` and calls ``addcmul.out``, which then
    reaches the global fallback. Routed here, the functional operator itself goes to the fallback.
    """
    return functools.partial(fallback.fallback, op)
# LITERALINCLUDE END: PER OPERATOR FALLBACK
