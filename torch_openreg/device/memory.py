"""``torch.openreg`` memory functions, named and shaped like ``torch.cuda``'s.

Statistics come from the caching allocator (``torch_openreg.memory``); the
device-generic ones go through ``torch.accelerator``, which reaches the same
numbers through the bridge's ``c10::DeviceAllocator``.
"""

from __future__ import annotations

import collections
import pickle
import sys
from typing import Any

import torch

import openreg
from torch_openreg.memory import allocator, format_size, host_allocator
from torch_openreg.memory.history import History

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


def memory_snapshot() -> list[dict]:
    """Every segment of every device with its blocks (``torch.cuda.memory_snapshot``)."""
    return [seg for i in range(openreg.device_count()) for seg in allocator(i).snapshot()]


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


def host_memory_stats() -> dict[str, Any]:
    """Statistics of the pinned-host caching allocator."""
    return host_allocator.as_dict()


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    """A readable table of the allocator statistics (like ``torch.cuda.memory_summary``)."""
    index = _device(device)
    stats = allocator(index).stats.as_dict()
    rows = [
        ("Allocated memory", "allocated_bytes", True), ("Active memory", "active_bytes", True),
        ("Requested memory", "requested_bytes", True), ("Reserved memory", "reserved_bytes", True),
        ("Non-releasable memory", "inactive_split_bytes", True), ("Allocations", "allocation", False),
        ("Active allocs", "active", False), ("Reserved segments", "segment", False),
        ("Non-releasable allocs", "inactive_split", False),
    ]
    pools = ("all",) if abbreviated else ("all", "large_pool", "small_pool")
    width = 75
    lines = ["=" * width, f" OpenReg memory summary, device ID {index}".ljust(width), "-" * width,
             f" {'Metric':<28}| {'Cur Usage':>10} | {'Peak Usage':>10} | {'Tot Alloc':>9} | {'Tot Freed':>9}",
             "-" * width]
    for title, key, is_bytes in rows:
        for pool in pools:
            s = stats[key][pool]
            label = title if pool == "all" else f"  from {pool.replace('_pool', '')} pool"
            fmt = format_size if is_bytes else str
            lines.append(f" {label:<28}| {fmt(s['current']):>10} | {fmt(s['peak']):>10} | "
                         f"{fmt(s['allocated']):>9} | {fmt(s['freed']):>9}")
        lines.append("-" * width)
    lines.append(f" OOMs: {stats['num_ooms']:<8} allocation retries: {stats['num_alloc_retries']:<8} "
                 f"device mallocs: {stats['num_device_alloc']:<6} frees: {stats['num_device_free']}")
    lines.append("=" * width)
    return "\n".join(lines) + "\n"
