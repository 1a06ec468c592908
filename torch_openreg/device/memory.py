"""``torch.openreg`` memory functions, named and shaped like ``torch.cuda``'s.

Statistics come from the caching allocator (``torch_openreg.memory``); the
device-generic ones go through ``torch.accelerator``, which reaches the same
numbers through the bridge's ``c10::DeviceAllocator``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import pickle
import sys
from collections.abc import Iterator
from typing import Any

import torch

import openreg
from torch_openreg import _runtime
from torch_openreg.memory import allocator, caching_allocator, host_allocator
from torch_openreg.memory.history import History
from torch_openreg.memory.pluggable import PluggableAllocator

from .state import _index, _lazy_init


def _device(device: Any) -> int:
    _lazy_init()
    return _index(device)


def empty_cache() -> None:
    """Release all unused cached device memory back to the device."""
    torch.accelerator.empty_cache()


def memory_stats(device: Any = None) -> collections.OrderedDict[str, Any]:
    """Flat dictionary of allocator statistics (``torch.cuda.memory_stats`` keys)."""
    return torch.accelerator.memory_stats(_device(device))


def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """The same statistics, nested."""
    return allocator(_device(device)).stats.as_dict()


def memory_allocated(device: Any = None) -> int:
    """Bytes currently occupied by tensors on a device."""
    return torch.accelerator.memory_allocated(_device(device))


def max_memory_allocated(device: Any = None) -> int:
    """Peak of :func:`memory_allocated` since start or the last peak reset."""
    return torch.accelerator.max_memory_allocated(_device(device))


def memory_reserved(device: Any = None) -> int:
    """Bytes held by the caching allocator (allocated plus cached)."""
    return torch.accelerator.memory_reserved(_device(device))


def max_memory_reserved(device: Any = None) -> int:
    """Peak of :func:`memory_reserved`."""
    return torch.accelerator.max_memory_reserved(_device(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    """Reset the peaks of all statistics to their current values."""
    torch.accelerator.reset_peak_memory_stats(_device(device))


def reset_accumulated_memory_stats(device: Any = None) -> None:
    """Reset the allocated/freed totals and the counters."""
    torch.accelerator.reset_accumulated_memory_stats(_device(device))


def reset_max_memory_allocated(device: Any = None) -> None:
    """Reset the peaks (CUDA's older name)."""
    reset_peak_memory_stats(device)


def mem_get_info(device: Any = None) -> tuple[int, int]:
    """``(free, total)`` bytes of the device, as the driver reports them."""
    return torch.accelerator.get_memory_info(_device(device))


def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
    """Cap what this process's allocator may reserve on a device to ``fraction`` of its memory."""
    if not isinstance(fraction, (int, float)) or not 0 <= fraction <= 1:
        raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
    allocator(_device(device)).fraction = float(fraction)


def get_per_process_memory_fraction(device: Any = None) -> float:
    """The fraction set by :func:`set_per_process_memory_fraction` (1.0 when unset)."""
    fraction = allocator(_device(device)).fraction
    return 1.0 if fraction is None else fraction


def memory_snapshot(mempool_id: tuple[int, int] | None = None, include_traces: bool = True) -> list[dict]:
    """Every segment of every device with its blocks (``torch.cuda.memory_snapshot``); with ``mempool_id``, the
    segments of that pool only. ``include_traces`` is accepted for CUDA's signature: the segments carry no trace."""
    segments = [seg for i in range(openreg.device_count()) for seg in allocator(i).snapshot()]
    if mempool_id is None:
        return segments
    return [seg for seg in segments if seg["segment_pool_id"] == tuple(mempool_id)]


# LITERALINCLUDE START: MEMORY HISTORY API
def _record_memory_history(enabled: str | bool | None = "all", context: str | None = "all", stacks: str = "all",
                           max_entries: int = sys.maxsize, device: Any = None, clear_history: bool = False,
                           skip_actions: list[str] | None = None, **legacy: Any) -> None:
    """Record allocator actions and allocation stacks, as ``torch.cuda.memory._record_memory_history``.

    ``enabled``: ``None`` stops (and drops what was recorded), ``"state"`` keeps stacks of live
    allocations, ``"all"`` also keeps a trace of up to ``max_entries`` actions. ``context``: which
    stacks (``None``, ``"state"``, ``"alloc"``, ``"all"``). ``stacks``: ``"python"`` leaves out the
    backend's own frames, ``"all"`` keeps them. Every device records, as in CUDA (``device`` is
    accepted for CUDA's signature). The boolean form of older PyTorch (``enabled=True``,
    ``trace_alloc_max_entries=...``) is accepted too.
    """
    if isinstance(enabled, bool):  # older PyTorch's signature
        entries = legacy.pop("trace_alloc_max_entries", 1)
        trace_context = legacy.pop("trace_alloc_record_context", False)
        context = ("alloc" if trace_context else "state") if legacy.pop("record_context", True) else None
        stacks = "all" if legacy.pop("record_context_cpp", False) else "python"
        enabled, max_entries = ("all" if entries > 1 else "state") if enabled else None, max(entries, 1)
    legacy.pop("compile_context", None)  # no compiled regions to annotate yet
    legacy.pop("global_record_annotations", None)
    if legacy:
        raise TypeError(f"_record_memory_history() got unexpected arguments {sorted(legacy)}")
    for index in range(openreg.device_count()):
        alloc = allocator(index)
        with alloc.lock:
            old = alloc.history
            if enabled is None:
                alloc.history = None
                alloc.segment_frames.clear()
                for block in alloc.active.values():
                    block.frames = None
                continue
            new = History(enabled, context, stacks, max_entries, set(skip_actions or ()))
            if old is not None and old.trace is not None and new.trace is not None and not clear_history:
                new.trace.extend(old.trace)
            alloc.history = new


def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
    """Segments (with the stacks of their blocks) and each device's trace: ``torch.cuda.memory._snapshot``.

    The dictionary has CUDA's shape: ``torch.cuda._memory_viz`` and pytorch.org/memory_viz read it.
    """
    traces = []
    for index in range(openreg.device_count()):
        history = allocator(index).history
        if history is not None:
            history.record("snapshot", 0, 0, 0)
        traces.append(list(history.trace) if history is not None and history.trace is not None else [])
    return {"segments": memory_snapshot(), "device_traces": traces}


def _dump_snapshot(filename: str = "dump_snapshot.pickle", augment_with_fx_traces: bool = False) -> None:
    """Pickle :func:`_snapshot` to ``filename`` (for pytorch.org/memory_viz or ``torch.cuda._memory_viz``)."""
    with open(filename, "wb") as f:
        pickle.dump(_snapshot(), f)


def _allocation_traceback(data_ptr: int) -> list[dict[str, Any]] | None:
    """The stack that allocated the live block at ``data_ptr`` (a storage's base), or ``None``."""
    for index in range(openreg.device_count()):
        block = allocator(index).active.get(data_ptr)
        if block is not None:
            return block.frames
    return None
# LITERALINCLUDE END: MEMORY HISTORY API


# LITERALINCLUDE START: HOST MEMORY STATS
def host_memory_stats() -> collections.OrderedDict[str, Any]:
    """Flat statistics of the pinned-host caching allocator (``torch.cuda.host_memory_stats`` keys):
    ``allocations``/``allocated_bytes`` (blocks the cache owns), ``active_requests``/``active_bytes``
    (handed out now), ``num_host_alloc``/``num_host_free`` and ``host_alloc_time``/``host_free_time`` (us)."""
    flat = []
    for key, value in host_memory_stats_as_nested_dict().items():
        if isinstance(value, dict):
            flat.extend((f"{key}.{inner}", v) for inner, v in value.items())
        else:
            flat.append((key, value))
    return collections.OrderedDict(sorted(flat))


def host_memory_stats_as_nested_dict() -> dict[str, Any]:
    """:func:`host_memory_stats` nested by statistic."""
    return host_allocator.as_dict()


def reset_accumulated_host_memory_stats() -> None:
    """Reset the ``allocated``/``freed`` totals, the counters and the timings of the pinned-host cache."""
    host_allocator.reset_accumulated()


def reset_peak_host_memory_stats() -> None:
    """Reset the peaks of the pinned-host cache's statistics to their current values."""
    host_allocator.reset_peak()
# LITERALINCLUDE END: HOST MEMORY STATS


# LITERALINCLUDE START: MEMORY SUMMARY
# torch.cuda.memory_summary's table, row for row, so that what people paste and parse reads the same: the rows
# keep CUDA's titles; the title and the OOM line name openreg (its driver call is openreg.malloc).
_SUMMARY_ROWS = (
    ("allocated_bytes", "Allocated memory"), ("active_bytes", "Active memory"),
    ("requested_bytes", "Requested memory"), ("reserved_bytes", "GPU reserved memory"),
    ("inactive_split_bytes", "Non-releasable memory"), ("allocation", "Allocations"), ("active", "Active allocs"),
    ("segment", "GPU reserved segments"), ("inactive_split", "Non-releasable allocs"),
)
_SUMMARY_TOTALS = (("oversize_allocations", "Oversize allocations"), ("oversize_segments", "Oversize GPU segments"))


def _scaled(value: int, by: int, units: tuple[str, ...], step: int, keep_below: int) -> tuple[int, str]:
    """``value`` in the unit that the column's first value ``by`` is shown in: the next unit while ``by`` is at
    least ``keep_below`` (CUDA's table scales every row of a group by its "all" row)."""
    unit = units[0]
    for bigger in units[1:]:
        if by < keep_below:
            break
        value, by, unit = value // step, by / step, bigger
    return value, unit


def _summary_cell(value: int, first: int, is_bytes: bool) -> str:
    if is_bytes:
        number, unit = _scaled(value, first, ("B  ", "KiB", "MiB", "GiB", "TiB", "PiB"), 1024, 768 * 1024)
        return f"{number:6d} {unit}"
    number, unit = _scaled(value, first, (" ", "K", "M"), 1000, 750 * 1000)
    return f"{number:7d} {unit} "


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A readable table of the allocator statistics, laid out as ``torch.cuda.memory_summary``'s."""
    index = _device(device)
    stats = memory_stats(index)
    rule, double = "-" * 75, "=" * 75
    lines = [double, f"{'':15}PyTorch OpenReg memory summary, device ID {index:<17d} ", rule,
             f"{'':9}OpenReg OOMs: {stats['num_ooms']:<12d} | {'':3}openreg.malloc retries: "
             f"{stats['num_alloc_retries']:<8d}  ",
             double, "        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  "]
    columns = ("current", "peak", "allocated", "freed")
    pools = (("all", None),) if abbreviated else (("all", None), ("large_pool", "      from large pool"),
                                                  ("small_pool", "      from small pool"))
    for key, title in _SUMMARY_ROWS:
        lines.append(rule)
        first = [stats[f"{key}.all.{column}"] for column in columns]
        for pool, label in pools:
            cells = [_summary_cell(stats[f"{key}.{pool}.{column}"], by, key.endswith("bytes"))
                     for column, by in zip(columns, first)]
            lines.append(f" {label or title:<21} | " + " | ".join(cells) + " ")
    for key, title in _SUMMARY_TOTALS:
        lines.append(rule)
        cells = [_summary_cell(stats[f"{key}.{c}"], stats[f"{key}.{c}"], False) for c in columns]
        lines.append(f" {title:<21} | " + " | ".join(cells) + " ")
    lines.append(double)
    return "".join(f"|{line}|\n" for line in lines)
# LITERALINCLUDE END: MEMORY SUMMARY


def memory_cached(device: Any = None) -> int:
    """Deprecated CUDA name of :func:`memory_reserved`."""
    return memory_reserved(device)


def max_memory_cached(device: Any = None) -> int:
    """Deprecated CUDA name of :func:`max_memory_reserved`."""
    return max_memory_reserved(device)


def reset_max_memory_cached(device: Any = None) -> None:
    """Deprecated CUDA name: resets the peaks (:func:`reset_peak_memory_stats`)."""
    reset_peak_memory_stats(device)


def device_memory_used(device: Any = None) -> int:
    """Bytes of device memory in use as the driver sees it (``nvidia-smi``'s "used"): every live
    allocation of this process, cached blocks included, page-rounded."""
    return openreg.memory_used(_device(device))


def list_gpu_processes(device: Any = None) -> str:
    """``torch.cuda.list_gpu_processes``: the processes using a device and their memory.

    The simulated device lives in this process, so this process is the only one the driver knows of
    (memory another process mapped through IPC is counted by that process's own device).
    """
    index = _device(device)
    used = openreg.memory_used(index)
    lines = [f"openreg:{index}"]
    lines.append(f"process {os.getpid():>10d} uses {used / (1024 * 1024):>12.3f} MB openreg memory"
                 if used else "no processes are running")
    return "\n".join(lines)


# LITERALINCLUDE START: RAW ALLOCATIONS
def caching_allocator_alloc(size: int, device: Any = None, stream: Any = None) -> int:
    """Device memory from openreg's allocator, for another framework (``torch.cuda.caching_allocator_alloc``);
    give it back with :func:`caching_allocator_delete`. ``stream``: where it is used (the current one).
    ``size`` 0 gives the null pointer, as on CUDA."""
    if not isinstance(size, int) or isinstance(size, bool):
        raise TypeError(f"caching_allocator_alloc: size must be an int (bytes), got {type(size).__name__}")
    if size < 0:
        raise ValueError(f"caching_allocator_alloc: size must be non-negative, got {size}")
    index = _device(device)
    if stream is None:
        runtime_stream = openreg.current_stream(index)
    elif isinstance(stream, torch.Stream):
        runtime_stream = openreg.get_stream(stream.device_index, stream.stream_id)
    elif isinstance(stream, int):
        runtime_stream = openreg.get_stream(index, stream)
    else:
        raise TypeError("Invalid type for stream argument, must be `torch.openreg.Stream` or `int` naming a stream")
    if runtime_stream.device != index:
        raise ValueError(f"stream {runtime_stream} is not on openreg:{index}")
    if caching_allocator.bridge_flush is not None:  # the block cache's blocks back first, as for any allocation
        caching_allocator.bridge_flush(index)
    return _runtime._device_allocators[index].malloc(size, runtime_stream) if size else 0


def caching_allocator_delete(mem_ptr: int) -> None:
    """Free memory from :func:`caching_allocator_alloc` (stream-ordered, like a tensor's free). A pointer the
    allocator did not hand out (or already took back) is refused, as CUDA's "invalid device pointer"."""
    if mem_ptr == 0:
        return  # the null pointer of a 0-byte allocation
    if not isinstance(mem_ptr, int) or _runtime._owners.get(mem_ptr) is None:
        raise RuntimeError(f"invalid device pointer: {mem_ptr:#x}" if isinstance(mem_ptr, int)
                           else f"invalid device pointer: {mem_ptr!r}")
    _runtime.free(mem_ptr)


def caching_allocator_enable(value: bool = True) -> None:
    """Enable (default) or disable caching: disabled, a freed block goes straight back to the device."""
    _runtime.set_caching(value)
    if not value:
        empty_cache()


@contextlib.contextmanager
def caching_allocator_disabled() -> Iterator[None]:
    """Run a block with caching disabled (:func:`caching_allocator_enable`), then restore the setting."""
    previous = _runtime.caching
    caching_allocator_enable(False)
    try:
        yield
    finally:
        caching_allocator_enable(previous)
# LITERALINCLUDE END: RAW ALLOCATIONS


# LITERALINCLUDE START: PLUGGABLE API
class OpenRegPluggableAllocator(PluggableAllocator):
    """``torch.cuda.CUDAPluggableAllocator`` for openreg: Python ``alloc_fn(size, device, stream_id) -> ptr``
    and ``free_fn(ptr, size, device, stream_id)`` (openreg's driver API is Python: build them on
    ``openreg.malloc``/``openreg.free``). Install with :func:`change_current_allocator`."""

    def allocator(self) -> OpenRegPluggableAllocator:
        return self


def change_current_allocator(allocator: PluggableAllocator) -> None:
    """Use ``allocator`` for every openreg allocation from now on; an error once memory was allocated."""
    if not isinstance(allocator, PluggableAllocator):
        raise TypeError(f"expected an OpenRegPluggableAllocator, got {type(allocator).__name__}")
    _runtime.use_allocator(allocator)


def _get_current_allocator() -> PluggableAllocator | None:
    """The pluggable allocator in use, or ``None`` for openreg's caching allocator."""
    return _runtime.plugged


def get_allocator_backend() -> str:
    """``"native"`` for openreg's caching allocator, ``"pluggable"`` after :func:`change_current_allocator`."""
    return "native" if _get_current_allocator() is None else "pluggable"
# LITERALINCLUDE END: PLUGGABLE API
