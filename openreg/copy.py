"""Memory copies between host and device memory, checked against the pointer kinds."""

from __future__ import annotations

import ctypes
import enum

from . import hooks, memcheck, memory, timing
from .device import forked, start
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
    # extents, not whole allocations: a copy names only the bytes it touches (what OPENREG_MEMCHECK opens)
    buffers = tuple((p, nbytes) for p, a in ((dst, dst_alloc), (src, src_alloc)) if a is not None)
    device = device_side.device if device_side is not None else None
    return current_stream(device), buffers, buffers[:1] if dst_alloc is not None else ()  # (what it writes)


# LITERALINCLUDE START: RUNTIME MEMCPY
def memcpy_async(dst: int, src: int, nbytes: int, kind: MemcpyKind, stream: Stream | None = None) -> None:
    """Queue a copy of ``nbytes`` on ``stream`` (default: current stream of the device side)."""
    default, buffers, writes = _check(dst, src, nbytes, kind)
    if nbytes:
        view = memory.view_address  # the copy runs on the device's side: through the views
        (stream or default).launch(ctypes.memmove, view(dst), view(src), nbytes, buffers=buffers, writes=writes,
                                   name="memcpy", cost=lambda: _cost(nbytes, kind))  # (priced while timing is on)


def memcpy(dst: int, src: int, nbytes: int, kind: MemcpyKind) -> None:
    """Copy and wait for the copy (and the work queued before it on that stream)."""
    stream, buffers, writes = _check(dst, src, nbytes, kind)
    if nbytes:
        view = memory.view_address
        seq = stream.launch(ctypes.memmove, view(dst), view(src), nbytes, buffers=buffers, writes=writes,
                            name="memcpy", cost=lambda: _cost(nbytes, kind))
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
    """The device's copy engine: moves bytes between host memory and the device's view of its memory (a
    ``memcpy``), as a DMA engine reads device memory that the CPU cannot. With ``OPENREG_MEMCHECK`` the
    view is opened for the transfer alone."""

    def read(self, ptr: int, nbytes: int) -> bytearray:
        out = bytearray(nbytes)
        if nbytes:
            self.read_into(ptr, nbytes, ctypes.addressof((ctypes.c_char * nbytes).from_buffer(out)))
        return out

    def read_into(self, ptr: int, nbytes: int, host: int) -> None:
        """Copy ``nbytes`` at device address ``ptr`` straight into host memory at ``host``."""
        if memcheck.enabled:
            with _opened(ptr, nbytes):
                ctypes.memmove(host, memory.view_address(ptr), nbytes)
        elif nbytes:
            ctypes.memmove(host, memory.view_address(ptr), nbytes)

    def write(self, ptr: int, data) -> None:
        view = memoryview(data).cast("B")
        nbytes = view.nbytes
        if nbytes:
            source = (ctypes.c_char * nbytes).from_buffer_copy(view) if view.readonly else \
                (ctypes.c_char * nbytes).from_buffer(view)
            with _opened(ptr, nbytes):
                ctypes.memmove(memory.view_address(ptr), source, nbytes)


class _opened:
    """With ``OPENREG_MEMCHECK``: the view of ``nbytes`` at ``ptr`` is open while the engine copies."""

    __slots__ = ("spans",)

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.spans = memory.acquire([(ptr, nbytes)]) if memcheck.enabled else None

    def __enter__(self) -> None:
        if self.spans is not None:
            memcheck.before(self.spans)

    def __exit__(self, *exc: object) -> None:
        if self.spans is not None:
            memcheck.after(self.spans)
            memory.release(self.spans)


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
    here, reporting its errors), then the copy engine reads the bytes.
    ``about``: what the bytes hold, for a stream sanitizer report (the client's describer reads it)."""
    stream = _ready_to_read(src, nbytes, stream, name, about)
    return stream.transfer(name, _engine.read, src, nbytes)


def memcpy_dtoh_into(dst: int, src: int, nbytes: int, stream: Stream | None = None, name: str = "memcpy",
                     about: object = None) -> bool:
    """:func:`memcpy_dtoh` into host memory the caller owns (``dst``), with no buffer in between: a small
    ``.cpu()`` or ``.item()`` reads straight into its result; returns True. ``about`` as for :func:`memcpy_dtoh`."""
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
    the old bytes), the copy engine writes; returns True.
    ``blocking=False``: the program did not ask to wait (``cudaMemcpyAsync`` from pageable memory), so the
    stream sanitizer does not count the wait as the host's synchronization; ``about`` as for ``memcpy_dtoh``."""
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
    if hooks.host_access and nbytes:
        for hook in hooks.host_access:
            hook(stream._q, [(ptr, nbytes)], write, name, about)
# LITERALINCLUDE END: COPY ENGINE


# LITERALINCLUDE START: READ NOW
def wait_to_load(stream: Stream) -> bool:
    """Whether a synchronous read of a few bytes ordered by ``stream`` may be a plain load through the device's
    view, done by the caller: True once the stream's earlier work is done (waited for here, its kernel error
    raised, as :func:`memcpy_dtoh` does), unless the stream is being captured or a feature on the launch path
    (a launch hook: the stream sanitizer, memcheck, a profiler, timing) wants to see the transfer: then False,
    and the caller takes :func:`memcpy_dtoh_into`, which checks, records and refuses as those need. A
    ``.item()``, which PyTorch's test files call millions of times, then costs a wait and a load."""
    if forked():
        start()  # raises, as every runtime call in a forked child (an idle stream's wait would not ask)
    q = stream._q
    if q.capture is not None or hooks.any_registered():
        return False
    if q.error is not None or q.done < q.launched or q.busy:
        stream.synchronize()
    return True


def load_into(dst: int, src: int, nbytes: int) -> None:
    """The load :func:`wait_to_load` allows: ``nbytes`` at device pointer ``src`` (a live tensor's, within its
    allocation) copied by the caller, through the device's view, into host memory at ``dst``."""
    ctypes.memmove(dst, memory.view_address(src), nbytes)
# LITERALINCLUDE END: READ NOW
