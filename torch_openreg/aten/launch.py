"""Run a CPU computation over openreg tensors as a kernel on the current stream.

This is how every Python kernel of the backend touches device memory: it takes
host views of the tensors (CPU tensors over the same bytes, from the bridge)
and hands the runtime a closure plus the storages it may touch. The runtime
opens those storages only while the closure runs.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any

import torch

import openreg
from torch_openreg import _C
from torch_openreg.timing import costs as timing_costs


def host_view(t: torch.Tensor, writable: bool = True) -> torch.Tensor:
    """A CPU tensor over an openreg tensor's bytes, with its lazy conjugate/negative bits.

    Operators that handle those bits themselves (copies, dot, mm, ...) receive the tensor
    unresolved, so the host view carries them too (set by the bridge, in the same call).
    A kernel that only reads ``t`` asks for it without ``writable``: a copy-on-write storage
    (``Tensor._lazy_clone``) then stays shared, as the CPU's kernels leave it.
    """
    return _C._host_view(t, writable)


def host_views(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """:func:`host_view` of each tensor, passing ``None`` (an absent optional tensor) through."""
    return [host_view(t) if t is not None else None for t in tensors]


def detach_frames(exc: BaseException | None, where: str = "kernel") -> None:
    """Drop the frames of a kernel's exception: their arguments are host views of device memory.

    Those views are the device's own view of its memory (``openreg.view_address``), which user code must
    never hold: a test runner or debugger that kept the frames would hand it out. The traceback is kept as
    text, in a note.
    """
    if hasattr(exc, "add_note") and exc.__traceback__ is not None:
        exc.add_note(f"{where} traceback:\n" + "".join(traceback.format_tb(exc.__traceback__)).rstrip())
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


class _Kernel:
    """``fn(*args)`` as the runtime runs it; a failure leaves with no frames holding the host views."""

    __slots__ = ("fn", "args")

    def __init__(self, fn: Callable[..., Any], args: tuple) -> None:
        self.fn, self.args = fn, args

    def __call__(self) -> Any:
        try:
            return self.fn(*self.args)
        except Exception as exc:  # noqa: BLE001 - re-raised below, outside the frames that hold the views
            error = exc
        detach_frames(error)
        raise error


# Kernels run with autograd, autocast and Python modes off, on whichever thread runs them.
openreg.stream.set_kernel_context(_C._KernelScope)


# LITERALINCLUDE START: LAUNCH
def launch(device: int, fn: Callable[..., Any], *args: Any, tensors: tuple | list, name: str,
           sync: bool = False, writes: tuple | list | Callable[[], list] | None = None, host_sync: bool = False,
           cost: Callable[..., None] | None = None, cost_args: tuple = ()) -> Any:
    """Queue ``fn(*args)`` on ``device``'s current stream; returns ``(stream, seq)``.

    With ``sync``, run it here instead, in stream order (``Stream.run_here``), and return its result
    (``host_sync``: because the host waits for the device there, as a CUDA program would).
    ``writes``: those of ``tensors`` the kernel writes (None: any of them), or a function that lists them,
    called only while the stream sanitizer is on. ``cost``: a function that prices the launch
    (``torch_openreg.timing.costs.price_*``), ``cost(*cost_args)``, called only while the timing model prices
    launches (a function and its arguments, not a closure: nothing is allocated while it is off); without it,
    a launch its site did not price is priced as elementwise work over ``tensors``.
    """
    if openreg.timing.pricing:  # the timing model (torch_openreg/timing)
        if cost is not None:
            cost(*cost_args)
        else:
            timing_costs.price_launch(name, tensors, writes() if callable(writes) else writes)
    try:
        # the storages' extents: what the launch names (and OPENREG_MEMCHECK opens while it runs); what it
        # writes, as written_extents gives it (inline: every Python kernel's launch passes here)
        written = (_C._extents(writes() if callable(writes) else writes)
                   if writes is not None and openreg.sanitizer.enabled else None)
        return launch_extents(device, fn, *args, extents=_C._extents(tensors), name=name, sync=sync,
                              writes=written, host_sync=host_sync)
    except BaseException:
        args = tensors = ()  # noqa: F841 - this frame is in the traceback: it must not show the host views
        raise


def written_extents(writes: tuple | list | Callable[..., list] | None, *args: Any) -> list | None:
    """The extents of the tensors a launch writes, for the stream sanitizer (None while it is off, or not
    known); ``writes``: the tensors, or a function that lists them, ``writes(*args)``, called only while the
    sanitizer is on."""
    if writes is None or not openreg.sanitizer.enabled:
        return None
    return _C._extents(writes(*args) if callable(writes) else writes)


def launch_extents(device: int, fn: Callable[..., Any], *args: Any, extents: list, name: str,
                   sync: bool = False, writes: list | None = None, host_sync: bool = False,
                   cost: Callable[..., None] | None = None, cost_args: tuple = ()) -> Any:
    """:func:`launch` for a caller that has the ``(pointer, nbytes)`` extents already (``writes`` too, as
    :func:`written_extents` gives them); ``cost`` as for :func:`launch` (without it, the launch is not priced)."""
    if cost is not None and openreg.timing.pricing:
        cost(*cost_args)
    stream = openreg.current_stream(device)
    kernel = _Kernel(fn, args)
    args = ()  # this frame may be in a traceback: the kernel holds the host views, not the frame
    try:
        if sync:
            return stream.run_here(kernel, buffers=extents, name=name, writes=writes, host_sync=host_sync)
        return stream, stream.launch(kernel, buffers=extents, name=name, writes=writes)
    except BaseException:
        kernel = None
        raise


def run_sync(device: int, fn: Callable[..., Any], *args: Any, tensors: tuple | list, name: str,
             writes: tuple | list | Callable[[], list] | None = None, host_sync: bool = True) -> Any:
    """Launch ``fn(*args)``, run it on this thread once the stream's earlier work is done, and return its
    result; ``fn``'s own error (and its warnings) reach the caller as they are.

    An error of an earlier asynchronous kernel on the stream is reported first,
    as the ``OpenRegError`` (LAUNCH_FAILURE) a synchronizing call reports. ``host_sync=False``: the host
    waits for the simulator's sake only (a CUDA kernel would not), which the stream sanitizer ignores.
    """
    try:
        return launch(device, fn, *args, tensors=tensors, name=name, sync=True, writes=writes, host_sync=host_sync)
    except BaseException:
        args = tensors = ()  # noqa: F841 - this frame is in the traceback: it must not show the host views
        raise


# LITERALINCLUDE END: LAUNCH
