"""The calls the C++ bridge makes into the openreg runtime, with plain int arguments.

The bridge (``csrc/``) holds no policy: every answer it gives PyTorch comes from
one of these functions, which only translate between stream ids/pointers and
runtime objects. Stream pools live here because ``c10::Stream`` names streams by
id and never frees them, the same way CUDA's stream pool works.
"""

from __future__ import annotations

import functools
import itertools
import threading

import torch

import openreg

from . import sync_debug
from .graph_impl import GraphImpl
from .memory import allocator, host_allocator, owner
from .memory.caching_allocator import _owners
from .memory.pluggable import PluggableAllocator

# LITERALINCLUDE START: SUPPORTED DTYPES
# What torch.accelerator.get_device_capability reports: the dtypes an openreg tensor holds and converts
# to and from (its kernels are the CPU's); the quantized ones come from quantize_per_tensor. Left out:
# quint4x2/quint2x4 (openreg cannot quantize to them) and the sub-byte bits*/intN/uintN/float4 dtypes,
# for which the CPU has no copy kernel either.
SUPPORTED_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex32, torch.complex64,
    torch.complex128, torch.float8_e5m2, torch.float8_e4m3fn, torch.float8_e5m2fnuz, torch.float8_e4m3fnuz,
    torch.float8_e8m0fnu, torch.qint8, torch.quint8, torch.qint32,
]
# LITERALINCLUDE END: SUPPORTED DTYPES


# LITERALINCLUDE START: BRIDGE DEVICES
device_count = openreg.device_count
get_device = openreg.get_device
set_device = openreg.set_device
exchange_device = openreg.exchange_device
check_device = openreg.device.check_device

_POOL_SIZE = 32  # streams per priority per device, as CUDA's pools (made when first handed out)
_pools: dict[tuple[int, int], list[openreg.Stream]] = {}  # (device, priority) -> its pool
_next: dict[tuple[int, int], itertools.count] = {}
_pools_lock = threading.Lock()


def _dev(device: int) -> int:
    """PyTorch says -1 for "the current device"."""
    return openreg.get_device() if device < 0 else device




def init() -> None:
    """Called once by PyTorch's lazy device init: installs the host-fault reporter."""
    openreg.fault.install()


def pointer_device(ptr: int) -> int:
    """Owning device of a device pointer, -1 for anything else."""
    attrs = openreg.pointer_attributes(ptr)
    return attrs.device if attrs.type == "device" else -1


def is_pinned(ptr: int) -> bool:
    """Whether ``ptr`` lies in pinned host memory from :func:`host_malloc`."""
    return openreg.pointer_attributes(ptr).type == "host"


def supported_dtypes(device: int) -> list:
    """The dtypes of ``torch.accelerator.get_device_capability`` (:data:`SUPPORTED_DTYPES`)."""
    check_device(_dev(device))  # an unknown device raises INVALID_DEVICE
    return SUPPORTED_DTYPES


def has_primary_context(device: int) -> bool:
    """True once the device has memory or streams in use (its context exists)."""
    check_device(device)
    return bool(allocator(device).segments) or device in openreg.stream._default
# LITERALINCLUDE END: BRIDGE DEVICES


# LITERALINCLUDE START: BRIDGE MEMORY
def malloc(nbytes: int, device: int) -> int:
    """Device memory for a tensor: from the caching allocator, on the current stream's pool."""
    found = _device_allocators.get(device) if type(device) is int else None  # else allocator() raises
    return (found if found is not None else allocator(device)).malloc(nbytes, openreg.current_stream(device))


def free(ptr: int) -> None:
    found = _owners.get(ptr)  # owner(ptr), without a call: every tensor's free comes here
    found = found if found is not None else owner(ptr)
    found.free(ptr)
    if not caching:  # torch.openreg.caching_allocator_enable(False): nothing stays cached
        found.empty_cache()


def record_stream(ptr: int, device: int, stream_id: int) -> None:
    owner(ptr).record_stream(ptr, openreg.get_stream(_dev(device), stream_id))


def empty_cache() -> None:
    for index in range(openreg.device_count()):
        allocator(index).empty_cache()  # allocator(): after the bridge's block cache gave its blocks back


def _stats(device: int):
    if plugged is not None:
        raise RuntimeError("OpenRegPluggableAllocator does not keep memory statistics (as CUDA's pluggable "
                           "allocators do not)")
    return allocator(_dev(device)).stats


def device_stats(device: int) -> dict:
    return _stats(device).as_dict()


def reset_accumulated_stats(device: int) -> None:
    _stats(device).reset_accumulated()


def reset_peak_stats(device: int) -> None:
    _stats(device).reset_peak()


def mem_get_info(device: int) -> tuple[int, int]:
    return openreg.mem_get_info(_dev(device))


ipc_close = openreg.free  # unmap memory received from another process

host_malloc = host_allocator.malloc
host_free = host_allocator.free
host_empty_cache = host_allocator.empty_cache
host_stats = host_allocator.as_dict
host_reset_accumulated_stats = host_allocator.reset_accumulated
host_reset_peak_stats = host_allocator.reset_peak


def host_record_event(ptr: int, device: int, stream_id: int) -> bool:
    return host_allocator.record_event(ptr, openreg.get_stream(_dev(device), stream_id))
# LITERALINCLUDE END: BRIDGE MEMORY


# Every tensor's allocation comes through malloc: it finds the allocator with one look-up (allocator()
# checks the device, for the error).
_device_allocators = {index: allocator(index) for index in range(openreg.device_count())}


# LITERALINCLUDE START: BRIDGE ALLOCATOR CHOICE
plugged = None  # the PluggableAllocator in use instead of the caching allocator (change_current_allocator)
caching = True  # False: freed blocks go straight back to the device (caching_allocator_enable(False))


def use_allocator(allocator_: PluggableAllocator) -> None:
    """Route every device allocation to ``allocator_``; refused once the caching allocator has handed out
    memory (its blocks could not be freed through the new one), as CUDA refuses."""
    global plugged
    if plugged is allocator_:
        return
    if plugged is not None or any(allocator(i).segments for i in range(openreg.device_count())):
        raise RuntimeError("Can't swap an already initialized allocator")
    for index in range(openreg.device_count()):
        _device_allocators[index] = allocator_.for_device(index)
    plugged = allocator_


def set_caching(enabled: bool) -> None:
    """``torch.openreg.caching_allocator_enable``: whether freed blocks stay cached (read by :func:`free`)."""
    global caching
    caching = bool(enabled)
# LITERALINCLUDE END: BRIDGE ALLOCATOR CHOICE


# LITERALINCLUDE START: BRIDGE BLOCK CACHE
def block_cache_key(device: int) -> int:
    """For the bridge's block cache (csrc/block_cache.cpp), an allocation on ``device`` (-1: the current
    device): ``(current stream id + 1) << 16 | device`` when the cache may serve it (with a block held for
    that stream) and hold its block when freed, else ``device`` alone: the allocation must reach the caching
    allocator and its free too (another allocator plugged, caching off, memory history recorded, a graph
    capture or ``use_mem_pool`` routing allocations, the stream sanitizer watching allocations, a forked
    child)."""
    if device < 0:
        device = openreg.get_device()
    if plugged is not None or not caching or openreg.device.forked():
        return device
    found = _device_allocators[device]
    if found.history is not None or found.routes or openreg.hooks.allocated or openreg.hooks.cached:
        return device
    return (openreg.current_stream(device).id + 1) << 16 | device


def block_cache_malloc(nbytes: int, device: int) -> tuple[int, int]:
    """:func:`malloc` for the bridge's block cache: the pointer, and :func:`block_cache_key`'s key."""
    key = block_cache_key(device)
    return malloc(nbytes, key & 0xFFFF), key


def block_cache_settle(device: int, hits: list[tuple[int, int]], frees: list[int]) -> None:
    """The block cache's account: ``hits`` (pointer, reuses) happened without the allocator; ``frees`` are
    the blocks it held, freed now."""
    found = _device_allocators[device]
    for ptr, count in hits:
        found.reused(ptr, count)
    for ptr in frees:
        free(ptr)
# LITERALINCLUDE END: BRIDGE BLOCK CACHE


# LITERALINCLUDE START: BRIDGE STREAMS
def pool_stream(device: int, high_priority: bool) -> int:
    """A stream from the device's round-robin pool (``getStreamFromGlobalPool``): of the greatest priority
    when ``high_priority``, as CUDA's ``getStreamFromPool(isHighPriority)``, else of priority 0."""
    return priority_pool_stream(device, openreg.PRIORITY_HIGH if high_priority else openreg.PRIORITY_LOW)


def priority_pool_stream(device: int, priority: int) -> int:
    """A stream of ``priority`` from the device's round-robin pool (``getNewStream``): a pool of 32 per
    priority level; a priority outside the range takes the nearest level, as ``torch.cuda.Stream``'s."""
    device = _dev(device)
    priority = min(max(int(priority), openreg.PRIORITY_HIGH), openreg.PRIORITY_LOW)
    key = (device, priority)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            pool = _pools[key] = []
            _next[key] = itertools.count()
        i = next(_next[key]) % _POOL_SIZE
        if i == len(pool):  # streams are made as the pool is first gone through: a device synchronize
            pool.append(openreg.Stream(device, priority))  # walks only those
        return pool[i].id


def current_stream(device: int) -> int:
    return openreg.current_stream(_dev(device)).id


def set_stream(device: int, stream_id: int) -> int:
    """Make a stream current for this thread; returns the previous stream's id."""
    return openreg.set_stream(openreg.get_stream(_dev(device), stream_id)).id


def query_stream(device: int, stream_id: int) -> bool:
    return openreg.get_stream(_dev(device), stream_id).query()


def synchronize_stream(device: int, stream_id: int) -> None:
    if sync_debug.mode:
        sync_debug.check("stream synchronize")
    openreg.get_stream(_dev(device), stream_id).synchronize()


def synchronize_device(device: int) -> None:
    # not reported by the sync debug mode, as CUDA's device_synchronize is not (nor an event's synchronize):
    # a wait the program asks for by name; CUDA reports a stream's synchronize only
    openreg.synchronize(_dev(device))
# LITERALINCLUDE END: BRIDGE STREAMS


# LITERALINCLUDE START: BRIDGE EVENTS
def event_record(event: openreg.Event | None, device: int, stream_id: int, timing: bool) -> openreg.Event:
    """Record (creating the event on first use, as ``cudaEventCreate`` + record)."""
    if event is None:
        event = openreg.Event(enable_timing=timing, device=_dev(device))
    event.record(openreg.get_stream(_dev(device), stream_id))
    return event


def event_block(event: openreg.Event, device: int, stream_id: int) -> None:
    openreg.get_stream(_dev(device), stream_id).wait_event(event)


def event_query(event: openreg.Event) -> bool:
    return event.query()


def event_synchronize(event: openreg.Event) -> None:
    event.synchronize()


def event_elapsed(start: openreg.Event, end: openreg.Event) -> float:
    return start.elapsed_time(end)
# LITERALINCLUDE END: BRIDGE EVENTS


def generator_sync(device: int) -> None:
    """Before the host reads or writes a generator's state: let queued random kernels draw first."""
    if not openreg.device.forked():
        openreg.synchronize(device)


def copy_device_to_device(dst: int, src: int, nbytes: int, device: int) -> None:
    """Stream-ordered device copy on the current stream (used when a storage grows)."""
    openreg.memcpy_async(dst, src, nbytes, openreg.MemcpyKind.DEVICE_TO_DEVICE, openreg.current_stream(device))


# LITERALINCLUDE START: BRIDGE GRAPHS
def graph_new(keep_graph: bool) -> object:
    """The openreg graph behind a new ``torch.accelerator.Graph`` (csrc/graph.cpp holds it)."""
    return GraphImpl(keep_graph)


def graph_call(method: str, impl: object, *args: object) -> object:
    """One ``at::GraphImplInterface`` method of that graph: capture_begin, capture_end, replay, reset, ..."""
    return getattr(impl, method)(*args)
# LITERALINCLUDE END: BRIDGE GRAPHS


# LITERALINCLUDE START: BRIDGE LAUNCH
def launch(device: int, kernel, buffers: list, name: str, writes: list | None = None) -> None:
    """Queue a C++ kernel (a callable from the bridge) on ``device``'s current stream; ``writes``: the extents
    it writes (for the stream sanitizer)."""
    # the timing model prices it (only while it prices launches) as an elementwise kernel over the storages it touches
    openreg.current_stream(_dev(device)).launch(kernel, buffers=buffers, name=name, writes=writes,
                                                cost=functools.partial(_elementwise_cost, buffers, name))


def _elementwise_cost(buffers: list, name: str) -> openreg.timing.Cost:
    moved = float(sum(n for _, n in buffers))  # a fill writes (no arithmetic); abs: one op per float32 read
    flops = 0.0 if name.startswith(("fill_", "zero_")) else moved / 8
    return openreg.timing.Cost("elementwise", flops, moved, formula=True)
# LITERALINCLUDE END: BRIDGE LAUNCH
