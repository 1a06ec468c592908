"""Memory copies between host and device memory, checked against the pointer kinds."""

from __future__ import annotations

import ctypes
import enum
import os

from . import memory, sanitizer, timing
from ._libc import libc
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


def _check(dst: int, src: int, nbytes: int, kind: MemcpyKind) -> tuple[Stream, tuple, tuple]:
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
    return current_stream(device), buffers, buffers[:1] if dst_alloc is not None else ()  # (what it writes)


# LITERALINCLUDE START: RUNTIME MEMCPY
def memcpy_async(dst: int, src: int, nbytes: int, kind: MemcpyKind, stream: Stream | None = None) -> None:
    """Queue a copy of ``nbytes`` on ``stream`` (default: current stream of the device side)."""
    default, buffers, writes = _check(dst, src, nbytes, kind)
    if nbytes:
        cost = _cost(nbytes, kind) if timing.active else None
        (stream or default).launch(ctypes.memmove, dst, src, nbytes, buffers=buffers, writes=writes, name="memcpy",
                                   cost=cost)


def memcpy(dst: int, src: int, nbytes: int, kind: MemcpyKind) -> None:
    """Copy and wait for the copy (and the work queued before it on that stream)."""
    stream, buffers, writes = _check(dst, src, nbytes, kind)
    if nbytes:
        cost = _cost(nbytes, kind) if timing.active else None
        seq = stream.launch(ctypes.memmove, dst, src, nbytes, buffers=buffers, writes=writes, name="memcpy",
                            cost=cost)
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


# LITERALINCLUDE START: COPY ENGINE
class _CopyEngine:
    """The device's copy engine: moves bytes between host and device memory without opening device pages
    to the host. Kernels need their pages open (host code runs them); a synchronous copy does not, as
    a DMA engine reads device memory while the CPU still cannot. Simulated with ``/proc/self/mem``, whose
    reads and writes reach pages the process itself may not touch; where it cannot be opened (another
    OS, a sandbox), ``available`` is False and copies run as kernels."""

    def __init__(self) -> None:
        self.fd = None  # opened on first use, and again in a forked child (see _forget)
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        """In a forked child: the inherited file reads the parent's memory."""
        self.fd = None

    def _file(self) -> int:
        fd = self.fd
        if fd is None:
            try:
                fd = os.open("/proc/self/mem", os.O_RDWR | os.O_CLOEXEC)
            except OSError:
                fd = -1
            self.fd = fd
        return fd

    @property
    def available(self) -> bool:
        return self._file() >= 0

    def read(self, ptr: int, nbytes: int) -> bytearray:
        out = bytearray(nbytes)
        if nbytes and os.preadv(self._file(), [out], ptr) != nbytes:
            raise OpenRegError(ErrorCode.LAUNCH_FAILURE, f"copy engine: short read of {nbytes} bytes at 0x{ptr:x}")
        return out

    def read_into(self, ptr: int, nbytes: int, host: int) -> None:
        """Read ``nbytes`` at device address ``ptr`` straight into host memory at ``host`` (one ``pread``: a
        ``.cpu()`` or ``.item()`` of a few bytes costs the system call, not a buffer object around it)."""
        if nbytes and libc.pread(self._file(), host, nbytes, ptr) != nbytes:
            raise OpenRegError(ErrorCode.LAUNCH_FAILURE, f"copy engine: short read of {nbytes} bytes at 0x{ptr:x}")

    def write(self, ptr: int, data) -> None:
        view = memoryview(data).cast("B")
        if view.nbytes and os.pwrite(self._file(), view, ptr) != view.nbytes:
            raise OpenRegError(ErrorCode.LAUNCH_FAILURE,
                               f"copy engine: short write of {view.nbytes} bytes at 0x{ptr:x}")


_engine = _CopyEngine()


def _device_extent(ptr: int, nbytes: int, stream: Stream | None) -> Stream:
    """Check that ``nbytes`` at ``ptr`` are live device memory; the stream that orders the copy."""
    alloc = _side(ptr, nbytes, True, "device side")
    if alloc.free_pending:
        raise OpenRegError(ErrorCode.INVALID_POINTER, f"copy names 0x{ptr:x}, which is not live openreg memory")
    return stream or current_stream(alloc.device)


def memcpy_dtoh(src: int, nbytes: int, stream: Stream | None = None, name: str = "memcpy",
                about: object = None) -> bytearray | None:
    """``cudaMemcpy`` device to host into a new host buffer: waits for ``stream``'s earlier work (running it
    here, reporting its errors), then the copy engine reads the bytes. None when there is no copy engine.
    ``about``: what the bytes hold, for a stream sanitizer report (the client's describer reads it)."""
    if not _engine.available:
        return None
    stream = _ready_to_read(src, nbytes, stream, name, about)
    return stream.transfer(name, _engine.read, src, nbytes)


def memcpy_dtoh_into(dst: int, src: int, nbytes: int, stream: Stream | None = None, name: str = "memcpy",
                     about: object = None) -> bool:
    """:func:`memcpy_dtoh` into host memory the caller owns (``dst``), with no buffer in between: a small
    ``.cpu()`` or ``.item()`` reads straight into its result. False (nothing done) when there is no copy
    engine. ``about`` as for :func:`memcpy_dtoh`."""
    if not _engine.available:
        return False
    _side(dst, nbytes, False, "destination")
    stream = _ready_to_read(src, nbytes, stream, name, about)
    stream.transfer(name, _engine.read_into, src, nbytes, dst)
    return True


def _ready_to_read(src: int, nbytes: int, stream: Stream | None, name: str, about: object) -> Stream:
    """Before the engine reads ``nbytes`` at ``src``: the stream that orders the read has done its earlier
    work (run here, its errors reported) and the stream sanitizer has checked the read; that stream."""
    stream = _device_extent(src, nbytes, stream)
    stream.refuse_in_capture(name)
    stream.synchronize()
    _checked(stream, src, nbytes, False, name, about)
    return stream


def memcpy_htod(dst: int, data, stream: Stream | None = None, name: str = "memcpy", about: object = None,
                blocking: bool = True) -> bool:
    """``cudaMemcpy`` host to device from a buffer: after ``stream``'s earlier work (which may still read
    the old bytes), the copy engine writes. False (nothing done) when there is no copy engine.
    ``blocking=False``: the program did not ask to wait (``cudaMemcpyAsync`` from pageable memory), so the
    stream sanitizer does not count the wait as the host's synchronization; ``about`` as for ``memcpy_dtoh``."""
    if not _engine.available:
        return False
    nbytes = memoryview(data).nbytes
    stream = _device_extent(dst, nbytes, stream)
    stream.refuse_in_capture(name)
    if blocking:
        stream.synchronize()
    else:  # (the simulator's wait: its copy engine writes now, after the stream's earlier work)
        stream._q.wait_for(stream.launched)
        stream.check_error()
    _checked(stream, dst, nbytes, True, name, about)
    stream.transfer(name, _engine.write, dst, data)
    return True


def _checked(stream: Stream, ptr: int, nbytes: int, write: bool, name: str, about: object) -> None:
    """The stream sanitizer's check of a transfer: the host reads or writes the bytes itself, in the stream's
    order (no launch), so the other streams' accesses must be ordered before it as before a launch there."""
    if sanitizer.enabled and nbytes:
        extent = [(ptr, nbytes)]
        race = sanitizer.launch(stream._q, extent, extent if write else (), name, None, (about,), host=True,
                                done=True)
        if race is not None:
            raise race
# LITERALINCLUDE END: COPY ENGINE
