"""Memory copies between host and device memory, checked against the pointer kinds."""

from __future__ import annotations

import ctypes
import enum

from . import memory, timing
from .errors import ErrorCode, OpenRegError
from .stream import Stream, current_stream


class MemcpyKind(enum.IntEnum):
    """Direction of a copy (``cudaMemcpyKind``)."""

    HOST_TO_HOST = 0
    HOST_TO_DEVICE = 1
    DEVICE_TO_HOST = 2
    DEVICE_TO_DEVICE = 3


def _side(ptr: int, nbytes: int, want_device: bool, role: str) -> memory.Allocation | None:
    alloc = memory.find(ptr)
    is_device = alloc is not None and alloc.kind == memory.DEVICE
    if is_device != want_device:
        kind = "device" if is_device else "host"
        raise OpenRegError(
            ErrorCode.INVALID_MEMCPY_DIRECTION,
            f"copy {role} 0x{ptr:x} is {kind} memory, but the copy kind expects "
            f"{'device' if want_device else 'host'} memory",
        )
    if alloc is not None and ptr + nbytes > alloc.ptr + alloc.size:
        raise OpenRegError(
            ErrorCode.INVALID_VALUE,
            f"copy of {nbytes} bytes at {role} 0x{ptr:x} overruns the allocation at 0x{alloc.ptr:x} "
            f"of {alloc.size} bytes",
        )
    return alloc


def _check(dst: int, src: int, nbytes: int, kind: MemcpyKind) -> tuple[Stream, tuple[int, ...]]:
    try:
        kind = MemcpyKind(kind)
    except ValueError:
        raise OpenRegError(ErrorCode.INVALID_MEMCPY_DIRECTION, f"invalid memcpy kind {kind!r}") from None
    if nbytes < 0:
        raise OpenRegError(ErrorCode.INVALID_VALUE, f"copy of negative size {nbytes}")
    dst_alloc = _side(dst, nbytes, kind in (MemcpyKind.HOST_TO_DEVICE, MemcpyKind.DEVICE_TO_DEVICE), "destination")
    src_alloc = _side(src, nbytes, kind in (MemcpyKind.DEVICE_TO_HOST, MemcpyKind.DEVICE_TO_DEVICE), "source")
    device_side = src_alloc if kind == MemcpyKind.DEVICE_TO_HOST else dst_alloc
    # extents, not whole allocations: a copy opens only the pages it touches
    buffers = tuple((p, nbytes) for p, a in ((dst, dst_alloc), (src, src_alloc)) if a is not None)
    device = device_side.device if device_side is not None else None
    return current_stream(device), buffers


# LITERALINCLUDE START: RUNTIME MEMCPY
def memcpy_async(dst: int, src: int, nbytes: int, kind: MemcpyKind, stream: Stream | None = None) -> None:
    """Queue a copy of ``nbytes`` on ``stream`` (default: current stream of the device side)."""
    default, buffers = _check(dst, src, nbytes, kind)
    if nbytes:
        cost = _cost(nbytes, kind) if timing.active else None
        (stream or default).launch(ctypes.memmove, dst, src, nbytes, buffers=buffers, name="memcpy", cost=cost)


def memcpy(dst: int, src: int, nbytes: int, kind: MemcpyKind) -> None:
    """Copy and wait for the copy (and the work queued before it on that stream)."""
    stream, buffers = _check(dst, src, nbytes, kind)
    if nbytes:
        cost = _cost(nbytes, kind) if timing.active else None
        seq = stream.launch(ctypes.memmove, dst, src, nbytes, buffers=buffers, name="memcpy", cost=cost)
        stream.wait_for(seq)
        stream.check_error()
# LITERALINCLUDE END: RUNTIME MEMCPY


def _cost(nbytes: int, kind: MemcpyKind) -> timing.Cost:
    """What the timing model charges a copy: host copies cross the host link (the runtime's host
    memory is pinned); device copies read and write device memory."""
    if kind == MemcpyKind.HOST_TO_DEVICE:
        return timing.Cost("copy", bytes=nbytes, link="h2d")
    if kind == MemcpyKind.DEVICE_TO_HOST:
        return timing.Cost("copy", bytes=nbytes, link="d2h")
    return timing.Cost("copy", bytes=2 * nbytes)
