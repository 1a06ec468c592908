"""Device and pinned host memory of the simulated accelerator.

Device memory is real memory the host cannot touch: every allocation is its own
page-aligned mapping (private memory on transparent huge pages when large, moved
into a shared-memory file when exported to another process) kept at ``PROT_NONE``. A kernel or copy gets
read/write access to the pages it names (:func:`grant`, reference counted, so
kernels on different streams can share a buffer); a stream closes them again
(:func:`revoke`) once the host synchronizes with it or it idles, so that
back-to-back kernels share one opening (``openreg.stream``). Host code that
dereferences a device pointer outside that window faults at once; the fault
reporter (``openreg.fault``) names the allocation it hit.

Frees are stream-ordered: an allocation still named by queued or running work,
or by finished work whose pages are still open, is released only when the
stream lets go of it (:func:`release`), the way ``cudaFreeAsync`` behaves, so a
caller may drop a buffer right after launching work on it.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import os
import resource
import threading
from dataclasses import dataclass, field

from . import _libc, sanitizer
from .device import check_device, device_capacity, device_count, forked, start
from .errors import ErrorCode, OpenRegError

DEVICE = "device"
HOST = "host"
UNREGISTERED = "unregistered"


@dataclass
class Allocation:
    """One live allocation: ``ptr`` is its base, ``size`` what was asked for."""

    ptr: int
    size: int
    mapped: int
    kind: str
    device: int | None
    uses: int = 0  # launches that name this allocation, from acquire until their stream releases them
    open: dict = field(default_factory=dict)  # (first byte, end byte) -> grants holding those pages open
    free_pending: bool = field(default=False)
    fd: int = -1  # the shared-memory file behind device memory once IPC exported it (or imported it)
    imported: bool = False  # mapped from another process's export


@dataclass(frozen=True)
class PointerAttributes:
    """What ``cudaPointerGetAttributes`` reports: kind, owning device, allocation base and size."""

    type: str
    device: int | None
    base: int
    size: int
    imported: bool = False


_lock = threading.RLock()
# Opening and closing pages (grant/revoke) has its own lock: an mprotect of a large buffer takes
# milliseconds, and a launch (acquire) must not wait for it. Acquired spans stay mapped meanwhile.
_access_lock = threading.Lock()
_allocs: dict[int, Allocation] = {}
_bases: list[int] = []  # sorted allocation bases, to resolve interior pointers
_used = [0] * device_count()  # bytes held per device (page-rounded)
_freed: collections.OrderedDict[int, None] = collections.OrderedDict()  # recent bases, for double-free reports
_FREED_MEMORY = 4096

# Each device allocation keeps its shared-memory file open (for IPC): allow as many as the system does.
_soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if _hard == resource.RLIM_INFINITY or _soft < _hard:
    resource.setrlimit(resource.RLIMIT_NOFILE, (_hard if _hard != resource.RLIM_INFINITY else 1 << 20, _hard))


def _register(alloc: Allocation) -> None:
    _allocs[alloc.ptr] = alloc
    bisect.insort(_bases, alloc.ptr)
    _freed.pop(alloc.ptr, None)


def _unregister(alloc: Allocation) -> None:
    _spans.clear()  # rare (a segment going back to the OS): simpler than finding its entries
    del _allocs[alloc.ptr]
    del _bases[bisect.bisect_left(_bases, alloc.ptr)]
    _freed[alloc.ptr] = None
    if len(_freed) > _FREED_MEMORY:
        _freed.popitem(last=False)


def find(ptr: int, *, mapped: bool = False) -> Allocation | None:
    """The live allocation containing ``ptr`` (base or interior pointer), if any.

    With ``mapped``, the page padding after the requested size counts too (for fault reports).
    """
    alloc = _allocs.get(ptr)
    if alloc is not None:
        return alloc
    with _lock:
        return _containing(ptr, mapped)


def _containing(ptr: int, mapped: bool = False) -> Allocation | None:
    """:func:`find` for an interior pointer, with ``_lock`` held."""
    i = bisect.bisect_right(_bases, ptr) - 1
    if i >= 0:
        alloc = _allocs[_bases[i]]
        if ptr < alloc.ptr + (alloc.mapped if mapped else max(alloc.size, 1)):
            return alloc
    return None


# LITERALINCLUDE START: RUNTIME MALLOC
def malloc(size: int, device: int) -> int:
    """Allocate ``size`` bytes on ``device``; returns the pointer (0 for size 0)."""
    check_device(device)
    start()
    if size < 0:
        raise OpenRegError(ErrorCode.INVALID_VALUE, f"malloc of negative size {size} on openreg:{device}")
    if size == 0:
        return 0
    mapped = _libc.round_up(size)
    capacity = device_capacity(device)
    with _lock:
        if _used[device] + mapped > capacity:
            raise OpenRegError(
                ErrorCode.OUT_OF_MEMORY,
                f"out of memory on openreg:{device}: tried to allocate {size} bytes; "
                f"{_used[device]} bytes in use of {capacity} total, {capacity - _used[device]} free",
            )
        ptr = _libc.map_device(mapped)
        if ptr is None:
            raise OpenRegError(
                ErrorCode.OUT_OF_MEMORY, f"out of memory on openreg:{device}: the host refused {mapped} bytes"
            )
        _used[device] += mapped
        _register(Allocation(ptr, size, mapped, DEVICE, device))
    return ptr


def free(ptr: int) -> None:
    """Free device memory; released once no launch names it any more (see :func:`release`)."""
    if ptr == 0 or forked():
        return  # in a forked child the parent's memory is left alone
    _free(ptr, DEVICE)
# LITERALINCLUDE END: RUNTIME MALLOC


def _free(ptr: int, kind: str) -> None:
    """Mark a ``kind`` allocation freed; release it now unless a launch still names it."""
    if sanitizer.enabled:  # no launch can name these bytes any more: the sanitizer forgets their accesses
        sanitizer.forget(ptr)
    with _lock:
        alloc = _allocs.get(ptr)
        if alloc is None or alloc.kind != kind or alloc.free_pending:
            _raise_bad_free(ptr, alloc, kind)
        alloc.free_pending = True
        if alloc.uses == 0:
            _release(alloc)


def _raise_bad_free(ptr: int, alloc: Allocation | None, kind: str) -> None:
    # A freed base that a newer allocation now covers (mmap reuses addresses) is an interior pointer.
    inner = find(ptr) if alloc is None else None
    if (inner is None and alloc is None and ptr in _freed) or (alloc is not None and alloc.free_pending):
        raise OpenRegError(ErrorCode.DOUBLE_FREE, f"double free of {kind} pointer 0x{ptr:x}")
    if alloc is not None:
        raise OpenRegError(
            ErrorCode.INVALID_POINTER, f"pointer 0x{ptr:x} is {alloc.kind} memory, not {kind} memory"
        )
    where = f" (inside allocation 0x{inner.ptr:x} of {inner.size} bytes)" if inner else ""
    raise OpenRegError(ErrorCode.INVALID_POINTER, f"0x{ptr:x} is not the base of a {kind} allocation{where}")


def _release(alloc: Allocation) -> None:
    _unregister(alloc)
    _libc.unmap_pages(alloc.ptr, alloc.mapped)
    if alloc.fd >= 0:
        os.close(alloc.fd)
    if alloc.kind == DEVICE and not alloc.imported:
        _used[alloc.device] -= alloc.mapped


# LITERALINCLUDE START: RUNTIME IPC
@dataclass(frozen=True)
class IpcHandle:
    """What another process needs to map an allocation (``cudaIpcMemHandle_t``): the file and where."""

    fd: int
    device: int
    mapped: int
    offset: int


def ipc_export(ptr: int) -> IpcHandle:
    """Describe the device allocation containing ``ptr`` for another process."""
    alloc = find(ptr)
    if alloc is None or alloc.kind != DEVICE:
        raise OpenRegError(ErrorCode.INVALID_POINTER, f"ipc_export: 0x{ptr:x} is not openreg device memory")
    if alloc.imported:
        raise OpenRegError(
            ErrorCode.INVALID_VALUE,
            f"ipc_export: 0x{ptr:x} was received from another process; only the process that allocated "
            "device memory can share it",
        )
    if alloc.fd < 0:
        _make_shareable(alloc)
    return IpcHandle(alloc.fd, alloc.device, alloc.mapped, ptr - alloc.ptr)


def _make_shareable(alloc: Allocation) -> None:
    """Move an allocation's pages into a shared-memory file, at the same address, for another process.

    Device memory is private anonymous memory (huge pages make opening it cheap, see ``_libc.map_device``);
    only what is exported pays for a file. No work may use the allocation meanwhile: its data is copied.
    """
    with _lock, _access_lock:
        if alloc.uses or alloc.open:
            raise OpenRegError(
                ErrorCode.INVALID_VALUE,
                f"ipc_export: the allocation at 0x{alloc.ptr:x} is used by queued or running work; "
                "synchronize its device first",
            )
        fd = os.memfd_create(f"openreg{alloc.device}", os.MFD_CLOEXEC)
        os.ftruncate(fd, alloc.mapped)
        staging = _libc.map_pages(alloc.mapped, _libc.PROT_RW, fd)
        if staging is None:
            os.close(fd)
            raise OpenRegError(ErrorCode.OUT_OF_MEMORY, f"ipc_export: cannot map {alloc.mapped} bytes to share")
        try:
            _libc.protect(alloc.ptr, alloc.mapped, _libc.PROT_RW)
            for lo, hi in _libc.resident(alloc.ptr, alloc.mapped):
                ctypes.memmove(staging + (lo - alloc.ptr), lo, hi - lo)
            _libc.remap_shared(alloc.ptr, alloc.mapped, fd)  # PROT_NONE again
        except BaseException:
            _libc.protect(alloc.ptr, alloc.mapped, _libc.PROT_NONE)
            os.close(fd)
            raise
        finally:
            _libc.unmap_pages(staging, alloc.mapped)
        alloc.fd = fd


def ipc_open(fd: int, device: int, mapped: int) -> int:
    """Map another process's allocation (this takes ownership of ``fd``); free it with :func:`free`."""
    check_device(device)
    ptr = _libc.map_pages(mapped, _libc.PROT_NONE, fd)
    if ptr is None:
        os.close(fd)
        raise OpenRegError(ErrorCode.INVALID_HANDLE, f"ipc_open: cannot map {mapped} bytes of openreg:{device}")
    with _lock:
        _register(Allocation(ptr, mapped, mapped, DEVICE, device, fd=fd, imported=True))
    return ptr
# LITERALINCLUDE END: RUNTIME IPC


def host_malloc(size: int) -> int:
    """Allocate pinned (page-locked in a real driver) host memory, readable by the host."""
    start()
    if size < 0:
        raise OpenRegError(ErrorCode.INVALID_VALUE, f"host_malloc of negative size {size}")
    if size == 0:
        return 0
    mapped = _libc.round_up(size)
    ptr = _libc.map_pages(mapped, _libc.PROT_RW)
    if ptr is None:
        raise OpenRegError(ErrorCode.OUT_OF_MEMORY, f"out of pinned host memory: tried to allocate {size} bytes")
    with _lock:
        _register(Allocation(ptr, size, mapped, HOST, None))
    return ptr


def host_free(ptr: int) -> None:
    """Free pinned host memory (stream-ordered like :func:`free`)."""
    if ptr:
        _free(ptr, HOST)


def pointer_attributes(ptr: int) -> PointerAttributes:
    """Classify any pointer: device memory, pinned host memory, or ordinary host memory."""
    alloc = find(ptr)
    if alloc is None:
        return PointerAttributes(UNREGISTERED, None, 0, 0)
    return PointerAttributes(alloc.kind, alloc.device, alloc.ptr, alloc.size, alloc.imported)


def memory_used(device: int) -> int:
    """Bytes of ``device`` memory held by live allocations (page-rounded)."""
    check_device(device)
    return _used[device]


def mem_get_info(device: int) -> tuple[int, int]:
    """``(free, total)`` bytes of a device, like ``cudaMemGetInfo``."""
    total = device_capacity(device)
    return total - memory_used(device), total


# LITERALINCLUDE START: RUNTIME ACCESS
_protect, _PROT_RW, _PROT_NONE = _libc.protect, _libc.PROT_RW, _libc.PROT_NONE
Span = tuple  # (allocation, first byte, end byte): page-aligned pages of one allocation a launch names


def acquire(buffers: tuple | list) -> list[Span]:
    """Pin what a launch names, at launch time: the allocations cannot be released before it ends.

    A buffer is a pointer (the whole allocation it points into) or a ``(pointer, nbytes)`` extent
    (only the pages those bytes lie on). Opening only the pages a kernel names keeps the cost of
    ``mprotect``, which grows with the number of pages, proportional to what the kernel touches.
    """
    spans = []
    with _lock:
        for buffer in buffers:
            span = _spans.get(buffer) or _span_of(buffer)
            if span is None:
                continue  # a null pointer: an empty tensor names no memory
            alloc = span[0]
            if alloc.free_pending:
                ptr = buffer if type(buffer) is int else buffer[0]
                raise OpenRegError(
                    ErrorCode.INVALID_POINTER, f"launch names 0x{ptr:x}, which is not live openreg memory"
                )
            alloc.uses += 1
            spans.append(span)
    return spans


# Buffer -> its span, for launches: the same tensors' extents recur launch after launch, and nearly
# all of them are interior pointers (the caching allocator carves tensors out of large allocations).
_spans: dict = {}
_SPANS_SIZE = 1 << 16


def _span_of(buffer: int | tuple[int, int]) -> Span | None:
    """The pages a launch's buffer covers (``_lock`` held), checked against its allocation and remembered."""
    ptr, nbytes = (buffer, None) if type(buffer) is int else buffer
    if not ptr:
        return None
    alloc = _allocs.get(ptr) or _containing(ptr)
    if alloc is None or alloc.free_pending:
        raise OpenRegError(ErrorCode.INVALID_POINTER, f"launch names 0x{ptr:x}, which is not live openreg memory")
    base = alloc.ptr
    if nbytes is None:
        span = (alloc, base, base + alloc.mapped)
    else:
        if nbytes < 0 or ptr + nbytes > base + alloc.size:
            raise OpenRegError(
                ErrorCode.INVALID_VALUE,
                f"launch names {nbytes} bytes at 0x{ptr:x}, beyond the allocation at 0x{base:x} of {alloc.size} bytes",
            )
        mask = ~(_libc.PAGE - 1)  # allocations are page-aligned, so a page starts at ptr & mask
        span = (alloc, ptr & mask, min(base + alloc.mapped, (ptr + (nbytes or 1) + _libc.PAGE - 1) & mask))
    if len(_spans) >= _SPANS_SIZE:
        _spans.clear()
    _spans[buffer] = span
    return span


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of address ranges, as sorted disjoint ranges (touching ones joined)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            if hi > out[-1][1]:
                out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return out


def _minus(ranges: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted disjoint ``ranges`` without the sorted disjoint ``holes``."""
    out = []
    for lo, hi in ranges:
        for hlo, hhi in holes:
            if hhi <= lo or hlo >= hi:
                continue
            if hlo > lo:
                out.append((lo, hlo))
            lo = max(lo, hhi)
            if lo >= hi:
                break
        if lo < hi:
            out.append((lo, hi))
    return out


def grant(spans: list[Span]) -> None:
    """Open the named pages to the host for a kernel or copy (reference counted); a stream closes them
    with :func:`revoke` once the host synchronizes with it or it idles, not when the kernel ends.

    Every synchronizing call opens and closes pages, so the common case (one page range, the
    launches' tensors side by side in one caching-allocator segment) is one ``mprotect`` without
    sorting or merging.
    """
    with _access_lock:
        todo = None
        for alloc, lo, hi in spans:
            if alloc.kind == DEVICE:
                opened, key = alloc.open, (lo, hi)
                count = opened.get(key, 0)
                opened[key] = count + 1
                if not count:
                    if todo is None:
                        todo = [key]
                    else:
                        todo.append(key)
        if todo is None:
            return
        for lo, hi in (todo if len(todo) == 1 else _merged(todo)):
            _protect(lo, hi - lo, _PROT_RW)


def revoke(spans: list[Span]) -> None:
    """Close the pages again, except those another grant (a kernel on another stream) still holds open."""
    with _access_lock:
        closed = None
        for alloc, lo, hi in spans:
            if alloc.kind == DEVICE:
                opened, key = alloc.open, (lo, hi)
                count = opened[key] - 1
                if count:
                    opened[key] = count
                    continue
                del opened[key]
                if closed is None:
                    closed = {alloc.ptr: (alloc, [key])}
                else:
                    closed.setdefault(alloc.ptr, (alloc, []))[1].append(key)
        if closed is None:
            return
        for alloc, ranges in closed.values():
            if len(ranges) > 1:
                ranges = _merged(ranges)
            if alloc.open:  # pages another kernel still holds stay open
                ranges = _minus(ranges, _merged(list(alloc.open)))
            for lo, hi in ranges:
                _protect(lo, hi - lo, _PROT_NONE)


def release(spans: list[Span]) -> None:
    """Undo :func:`acquire` for launches whose pages their stream has closed (or that were dropped): frees
    waiting on them go through."""
    with _lock:
        for alloc, _, _ in spans:
            alloc.uses -= 1
            if alloc.uses == 0 and alloc.free_pending:
                _release(alloc)
# LITERALINCLUDE END: RUNTIME ACCESS
