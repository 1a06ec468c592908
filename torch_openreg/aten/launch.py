"""Run a CPU computation over openreg tensors as a kernel on the current stream.

This is how every Python kernel of the backend touches device memory: it takes
host views of the tensors (CPU tensors over the same bytes, from the bridge)
and hands the runtime a closure plus the storages it may touch. The runtime
opens those storages only while the closure runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import openreg
from torch_openreg import _C

host_view = _C._host_view


def storage_ptr(t: torch.Tensor) -> int:
    """Base pointer of a tensor's storage: the buffer a launch names."""
    return _C._storage_base(t)


# LITERALINCLUDE START: LAUNCH
def launch(device: int, fn: Callable[..., Any], *args: Any, tensors: tuple | list, name: str) -> tuple:
    """Queue ``fn(*args)`` on ``device``'s current stream; returns ``(stream, seq)``."""
    stream = openreg.current_stream(device)
    buffers = [storage_ptr(t) for t in tensors]
    return stream, stream.launch(fn, *args, buffers=buffers, name=name)


def run_sync(device: int, fn: Callable[..., Any], *args: Any, tensors: tuple | list, name: str) -> Any:
    """Launch, wait for it, and return ``fn``'s result; ``fn``'s own error is raised as is.

    An error of an earlier asynchronous kernel on the stream is reported first,
    as the ``OpenRegError`` (LAUNCH_FAILURE) a synchronizing call reports.
    """
    outcome: list = []

    def body() -> None:
        try:
            outcome.append((True, fn(*args)))
        except Exception as exc:  # noqa: BLE001 - re-raised below, on the caller's thread
            outcome.append((False, exc))

    stream, seq = launch(device, body, tensors=tensors, name=name)
    stream.wait_for(seq)
    stream.check_error()
    ok, value = outcome[0]
    if not ok:
        raise value
    return value


# LITERALINCLUDE END: LAUNCH
