"""Device and pinned host memory of the simulated accelerator.

Device memory is memory the host can never touch. Each device is one shared-memory object
(``openreg.arena``) mapped twice: the **device address range**, what ``malloc`` returns and PyTorch,
the caching allocator, IPC handles and fault reports see, is ``PROT_NONE`` for the allocation's whole
life; the **view** is the same memory, read/write, the simulated device's side of the bus. Kernels and
the copy engine reach it through one translation, :func:`view_address` (a device pointer's view
address); nothing else hands a view address out. Host code that dereferences a device pointer faults
at once, while a kernel uses that memory or not; the fault reporter (``openreg.fault``) names the
allocation it hit. No protection changes on the way: ``OPENREG_MEMCHECK=1`` (``openreg.memcheck``) adds
them back on the views, as a debugging mode.

Frees are stream-ordered: an allocation still named by queued or running work is released only when
that work is done (:func:`release`), the way ``cudaFreeAsync`` behaves, so a caller may drop a buffer
right after launching work on it.
"""

from __future__ import annotations

import bisect
import collections
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from . import bounded, memcheck, platform
from .arena import Arena
from .device import check_device, device_capacity, device_count, forked, start
from .errors import ErrorCode, OpenRegError

DEVICE = "device"
HOST = "host"
UNREGISTERED = "unregistered"


@dataclass
class Allocation:
    """One live allocation: ``ptr`` is its base, ``size`` what was asked for, ``mapped`` its granules."""

    ptr: int
    size: int
    mapped: int
    kind: str
    device: int | None
    uses: int = 0  # launches that name this allocation, from acquire until their work is done
    free_pending: bool = field(default=False)
    imported: bool = False  # mapped from another process's export
    delta: int = 0  # its view's address minus its device address (0 for host memory)


@dataclass(frozen=True)
class PointerAttributes:
    """What ``cudaPointerGetAttributes`` reports: kind, owning device, allocation base and size."""

    type: str
    device: int | None
    base: int
    size: int
    imported: bool = False


_lock = threading.RLock()
_allocs: dict[int, Allocation] = {}
_bases: list[int] = []  # sorted allocation bases, to resolve interior pointers
_used = [0] * device_count()  # bytes held per device (granule-rounded)
_freed: collections.OrderedDict[int, None] = collections.OrderedDict()  # recent bases, for double-free reports
_FREED_MEMORY = 4096
_arenas: list[Arena | None] = [None] * device_count()  # each device's memory, created by its first malloc


def _register(alloc: Allocation) -> None:
    _allocs[alloc.ptr] = alloc
    bisect.insort(_bases, alloc.ptr)
    _freed.pop(alloc.ptr, None)


def _unregister(alloc: Allocation) -> None:
    _spans.clear()  # rare (a segment going back to the device): simpler than finding its entries
    del _allocs[alloc.ptr]
    del _bases[bisect.bisect_left(_bases, alloc.ptr)]
    _freed[alloc.ptr] = None
    if len(_freed) > _FREED_MEMORY:
        _freed.popitem(last=False)


def find(ptr: int, *, mapped: bool = False) -> Allocation | None:
    """The live allocation containing ``ptr`` (base or interior pointer), if any.

    With ``mapped``, the padding after the requested size up to the granule counts too (for fault reports).
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


# LITERALINCLUDE START: VIEW TRANSLATION
# (first device address, end, view address minus device address) of each device arena and import.
# Replaced, never changed in place, so the translation reads it without a lock.
_views: tuple[tuple[int, int, int], ...] = ()
_view_listeners: list[Callable[[tuple], None]] = []


def view_address(ptr: int) -> int:
    """The address through which kernels and the copy engine reach device pointer ``ptr`` (the device's
    own view of its memory); host memory is its own view. Only device-side code calls this: a view
    address handed to user code would let the host touch device memory."""
    for lo, hi, delta in _views:
        if lo <= ptr < hi:
            return ptr + delta
    return ptr


def add_view_listener(fn: Callable[[tuple], None]) -> None:
    """Call ``fn(ranges)`` now and whenever the ranges of :func:`view_address` change (the C++ bridge's
    copy of the translation: ``(first device address, end, delta)`` tuples)."""
    _view_listeners.append(fn)
    fn(_views)


def _set_views(views: tuple) -> None:
    global _views
    _views = views
    for fn in _view_listeners:
        fn(views)
# LITERALINCLUDE END: VIEW TRANSLATION


def device_address(addr: int) -> int | None:
    """The device address whose view ``addr`` is, if it is in a view (the fault reporter, for memcheck)."""
    for lo, hi, delta in _views:
        if lo + delta <= addr < hi + delta:
            return addr - delta
    return None


def arena_device(addr: int) -> int | None:
    """The device whose address range holds ``addr``, allocated or not."""
    for device, arena in enumerate(_arenas):
        if arena is not None and arena.holds(addr):
            return device
    return None


def _arena(device: int) -> Arena:
    """``device``'s arena, created (with ``_lock`` held) by its first allocation."""
    arena = _arenas[device]
    if arena is None:
        try:
            arena = Arena(device, device_capacity(device))
        except (OSError, MemoryError) as exc:
            raise OpenRegError(ErrorCode.OUT_OF_MEMORY, f"out of memory on openreg:{device}: the host refused "
                               f"{device_capacity(device)} bytes of device memory ({exc})") from None
        if memcheck.enabled:
            memcheck.seal(arena.base + arena.delta, arena.size)
        _arenas[device] = arena
        _set_views(_views + ((arena.base, arena.base + arena.size, arena.delta),))
    return arena


def _mapped(size: int, what: str, device: int | None = None) -> int:
    """What an allocation of ``size`` bytes by ``what`` maps (whole granules; 0 for none), the runtime started."""
    start()
    if size < 0:
        where = f" on openreg:{device}" if device is not None else ""
        raise OpenRegError(ErrorCode.INVALID_VALUE, f"{what} of negative size {size}{where}")
    return platform.round_up(size) if size else 0


# LITERALINCLUDE START: RUNTIME MALLOC
def malloc(size: int, device: int) -> int:
    """Allocate ``size`` bytes on ``device``; returns the pointer (0 for size 0)."""
    check_device(device)
    mapped = _mapped(size, "malloc", device)
    if not mapped:
        return 0
    capacity = device_capacity(device)
    with _lock:
        if _used[device] + mapped > capacity:
            raise OpenRegError(
                ErrorCode.OUT_OF_MEMORY,
                f"out of memory on openreg:{device}: tried to allocate {size} bytes; "
                f"{_used[device]} bytes in use of {capacity} total, {capacity - _used[device]} free",
            )
        arena = _arena(device)
        ptr = arena.take(mapped)
        if ptr is None:
            raise OpenRegError(
                ErrorCode.OUT_OF_MEMORY,
                f"out of memory on openreg:{device}: tried to allocate {size} bytes; {capacity - _used[device]} "
                "bytes are free but no free range holds them (fragmented)",
            )
        _used[device] += mapped
        _register(Allocation(ptr, size, mapped, DEVICE, device, delta=arena.delta))
    return ptr


def free(ptr: int) -> None:
    """Free device memory; released once no launch names it any more (see :func:`release`)."""
    if ptr == 0 or forked():
        return  # in a forked child the parent's memory is left alone
    _free(ptr, DEVICE)
# LITERALINCLUDE END: RUNTIME MALLOC


# Called with a device pointer as it is freed, before its bytes can be named again: the stream sanitizer forgets
# their accesses. A list that features above this module register with, so that memory imports none of them.
_free_hooks: list[Callable[[int], None]] = []


def add_free_hook(fn: Callable[[int], None]) -> None:
    """Call ``fn(ptr)`` whenever device memory is freed (openreg/sanitizer.py, while it is on)."""
    if fn not in _free_hooks:
        _free_hooks.append(fn)


def remove_free_hook(fn: Callable[[int], None]) -> None:
    """Stop calling a hook added with :func:`add_free_hook` (nothing if it is not there)."""
    if fn in _free_hooks:
        _free_hooks.remove(fn)


def _free(ptr: int, kind: str) -> None:
    """Mark a ``kind`` allocation freed; release it now unless a launch still names it."""
    for hook in _free_hooks:  # no launch can name these bytes any more: e.g. the sanitizer forgets their accesses
        hook(ptr)
    with _lock:
        alloc = _allocs.get(ptr)
        if alloc is None or alloc.kind != kind or alloc.free_pending:
            _raise_bad_free(ptr, alloc, kind)
        alloc.free_pending = True
        if alloc.uses == 0:
            _release(alloc)


def _raise_bad_free(ptr: int, alloc: Allocation | None, kind: str) -> None:
    # A freed base that a newer allocation now covers (addresses are reused) is an interior pointer.
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
    if alloc.kind == HOST:
        platform.unmap(alloc.ptr, alloc.mapped)
    elif alloc.imported:
        _set_views(tuple(v for v in _views if v[0] != alloc.ptr))
        platform.unmap(alloc.ptr, alloc.mapped)
        platform.unmap(alloc.ptr + alloc.delta, alloc.mapped)
    else:
        if memcheck.enabled:
            memcheck.seal(alloc.ptr + alloc.delta, alloc.mapped)
        _arenas[alloc.device].give(alloc.ptr, alloc.mapped)
        _used[alloc.device] -= alloc.mapped


# LITERALINCLUDE START: RUNTIME IPC
@dataclass(frozen=True)
class IpcHandle:
    """What another process needs to map an allocation (``cudaIpcMemHandle_t``): the device's shared-memory
    object, the allocation's place in it (``file_offset``, ``mapped`` bytes) and the pointer's in that."""

    fd: int
    device: int
    mapped: int
    offset: int
    file_offset: int = 0


def ipc_export(ptr: int) -> IpcHandle:
    """Describe the device allocation containing ``ptr`` for another process (free: the memory is shared
    memory from the start; the descriptor stays the runtime's, the receiver gets a duplicate)."""
    alloc = find(ptr)
    if alloc is None or alloc.kind != DEVICE:
        raise OpenRegError(ErrorCode.INVALID_POINTER, f"ipc_export: 0x{ptr:x} is not openreg device memory")
    if alloc.imported:
        raise OpenRegError(
            ErrorCode.INVALID_VALUE,
            f"ipc_export: 0x{ptr:x} was received from another process; only the process that allocated "
            "device memory can share it",
        )
    arena = _arenas[alloc.device]
    return IpcHandle(arena.fd, alloc.device, alloc.mapped, ptr - alloc.ptr, alloc.ptr - arena.base)


def ipc_open(fd: int, device: int, mapped: int, file_offset: int = 0) -> int:
    """Map another process's allocation, device range and view (this takes ownership of ``fd``, closed once
    mapped); free it with :func:`free`."""
    check_device(device)
    try:
        pair = platform.map_twice(fd, mapped, file_offset)
    finally:
        os.close(fd)
    if pair is None:
        raise OpenRegError(ErrorCode.INVALID_HANDLE, f"ipc_open: cannot map {mapped} bytes of openreg:{device}")
    ptr, view = pair
    if memcheck.enabled:
        memcheck.seal(view, mapped)
    with _lock:
        _register(Allocation(ptr, mapped, mapped, DEVICE, device, imported=True, delta=view - ptr))
        _set_views(_views + ((ptr, ptr + mapped, view - ptr),))
    return ptr
# LITERALINCLUDE END: RUNTIME IPC


def host_malloc(size: int) -> int:
    """Allocate pinned (page-locked in a real driver) host memory, readable by the host."""
    mapped = _mapped(size, "host_malloc")
    if not mapped:
        return 0
    ptr = platform.map_host(mapped)
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
    """Bytes of ``device`` memory held by live allocations (granule-rounded)."""
    check_device(device)
    return _used[device]


def mem_get_info(device: int) -> tuple[int, int]:
    """``(free, total)`` bytes of a device, like ``cudaMemGetInfo``."""
    total = device_capacity(device)
    return total - memory_used(device), total


# LITERALINCLUDE START: RUNTIME ACCESS
Span = tuple  # (allocation, first byte, end byte): granule-aligned device addresses of what a launch names


def acquire(buffers: tuple | list) -> list[Span]:
    """Pin what a launch names, at launch time: the allocations cannot be released before it ends.

    A buffer is a pointer (the whole allocation it points into) or a ``(pointer, nbytes)`` extent
    (only the granules those bytes lie on: what ``OPENREG_MEMCHECK`` opens to the kernel).
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
    """The granules a launch's buffer covers (``_lock`` held), checked against its allocation and remembered."""
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
        granule = platform.GRANULE
        mask = ~(granule - 1)  # allocations are granule-aligned, so a granule starts at ptr & mask
        span = (alloc, ptr & mask, min(base + alloc.mapped, (ptr + (nbytes or 1) + granule - 1) & mask))
    return bounded.put(_spans, buffer, span, _SPANS_SIZE)


def release(spans: list[Span]) -> None:
    """Undo :func:`acquire` for launches that have run (or were dropped): frees waiting on them go through."""
    with _lock:
        for alloc, _, _ in spans:
            alloc.uses -= 1
            if alloc.uses == 0 and alloc.free_pending:
                _release(alloc)
# LITERALINCLUDE END: RUNTIME ACCESS
