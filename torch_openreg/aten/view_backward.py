"""The backward of ``select`` and ``slice``, written straight into device memory.

Their CPU kernels build the input-sized gradient as zeros and copy the incoming gradient into the
viewed part. Through the fallback that result would be a host temporary copied into device memory
afterwards (``select_backward.out`` is PyTorch's generic functional-then-copy wrapper), one more pass
over a tensor as big as the view's base: a transformer's attention takes ``select_backward`` of its
packed q/k/v projection six times a step. Here the output is allocated on the device, and one kernel
zeroes it and copies the gradient into the view of it, the way the CPU kernel does.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .launch import host_view, launch


# LITERALINCLUDE START: VIEW BACKWARD
def _into_zeros(grad: torch.Tensor, input_sizes: Sequence[int], view_of, name: str) -> torch.Tensor:
    out = torch.empty(input_sizes, dtype=grad.dtype, device=grad.device)
    part = view_of(out)  # a bad dim or index raises here, at the call, as on the CPU
    source = grad.expand_as(part)  # as does a gradient of the wrong shape
    launch(grad.device.index, _zero_and_copy, host_view(out), host_view(part), host_view(source),
           tensors=(out, grad), writes=(out,), name=name)
    return out


def _zero_and_copy(out: torch.Tensor, part: torch.Tensor, source: torch.Tensor) -> None:
    out.zero_()
    part.copy_(source)


def select_backward(grad: torch.Tensor, input_sizes: Sequence[int], dim: int, index: int) -> torch.Tensor:
    """``aten::select_backward``: zeros of ``input_sizes`` with ``grad`` at ``index`` along ``dim``."""
    return _into_zeros(grad, input_sizes, lambda t: t.select(dim, index), "aten::select_backward")


def slice_backward(
    grad: torch.Tensor, input_sizes: Sequence[int], dim: int, start: int, end: int, step: int
) -> torch.Tensor:
    """``aten::slice_backward``: zeros of ``input_sizes`` with ``grad`` in ``start:end:step`` along ``dim``."""
    return _into_zeros(
        grad, input_sizes, lambda t: torch.ops.aten.slice.Tensor(t, dim, start, end, step), "aten::slice_backward"
    )
# LITERALINCLUDE END: VIEW BACKWARD
