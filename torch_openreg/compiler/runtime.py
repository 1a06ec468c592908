"""What Inductor's generated wrapper code calls at run time on openreg.

A compiled graph is ordinary openreg work: its buffers come from the caching allocator of the device
the graph runs on, and its C++ kernels run as launches on that device's current stream. The runtime
cannot tell a compiled kernel from a fallback kernel: both are ``openreg.Stream.launch`` of a Python callable.

The C++ kernels take raw pointers (Inductor's ``cpp_pybinding`` reads ``tensor.data_ptr()``), and a
device pointer is never readable by the host: each openreg tensor argument is handed to them as its host
view, whose pointer is the device's own view of that memory (``openreg.memory.view_address``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from torch_openreg import _C
from torch_openreg.aten.launch import launch_extents, written_extents
from torch_openreg.timing import costs as timing_costs

_DEVICES: dict[int, torch.device] = {}


# LITERALINCLUDE START: GRAPH RUNTIME
def empty_strided_openreg(size: tuple, stride: tuple, dtype: torch.dtype, index: int) -> torch.Tensor:
    """A graph buffer on ``openreg:index``, from its caching allocator, on the current stream."""
    device = _DEVICES.get(index)
    if device is None:
        device = _DEVICES[index] = torch.device("openreg", index)
    return torch.empty_strided(size, stride, dtype=dtype, device=device)


def launch_kernels(index: int, name: str, tensors: tuple, *calls: Callable | tuple,
                   written: tuple | None = None) -> None:
    """Queue ``calls`` (kernel, args, kernel, args, ...) as one launch on ``openreg:index``'s current stream.

    ``tensors`` are every tensor the kernels touch: the launch pins their storages until it has run.
    ``written`` are those the kernels write (their non-``const`` pointer arguments), for the stream sanitizer.
    """
    writes = written_extents(written)
    calls = tuple(call if i % 2 == 0 else _views(call) for i, call in enumerate(calls))
    # the timing model prices the kernel by its bytes (torch_openreg/timing), while it prices launches
    launch_extents(index, _run_kernels, calls, extents=_C._extents(tensors), name=name, writes=writes,
                   cost=timing_costs.price_kernel, cost_args=(name, tensors))


def _views(args: tuple) -> tuple:
    """A kernel's arguments with each openreg tensor replaced by its host view (over the device's view)."""
    return tuple(_C._host_view(a) if isinstance(a, torch.Tensor) and a.device.type == "openreg" else a
                 for a in args)


def _run_kernels(calls: tuple) -> None:
    for i in range(0, len(calls), 2):
        calls[i](*calls[i + 1])


def get_raw_stream(index: int) -> int:
    """The id of ``openreg:index``'s current stream (Inductor's ``get_raw_stream``)."""
    return torch.openreg.current_stream(index).stream_id
# LITERALINCLUDE END: GRAPH RUNTIME
