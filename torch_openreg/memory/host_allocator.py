"""The caching pinned-host allocator (``Tensor.pin_memory()`` for openreg).

Pinned buffers are expensive to get from the driver, so freed ones are kept,
by power-of-two size, and handed out again. A buffer that an asynchronous copy
still uses (``record_event``, called by the copy kernels) goes back to the
cache only once that copy's stream has passed the recorded event.
"""

from __future__ import annotations

import threading
import time

import openreg

from .stats import Stat

MIN_BLOCK = 4096


class HostCachingAllocator:
    """One process-wide cache of pinned host blocks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.sizes: dict[int, int] = {}  # ptr -> block size, for every block we own
        self.free_by_size: dict[int, list[int]] = {}
        self.in_use: set[int] = set()
        self.events: dict[int, list[openreg.Event]] = {}  # blocks freed while copies still use them
        self.waiting: set[int] = set()
        # CUDA's HostStats names: allocations/allocated_bytes are what the driver gave us,
        # active_requests/active_bytes what is handed out to tensors now.
        self.stats = {name: Stat() for name in ("allocations", "allocated_bytes", "active_requests", "active_bytes")}
        self.counters = {"num_host_alloc": 0, "num_host_free": 0}
        self.times = {"host_alloc_time": Durations(), "host_free_time": Durations()}  # driver calls, in us

    def malloc(self, size: int) -> int:
        if size == 0:
            return 0
        block = max(MIN_BLOCK, 1 << (size - 1).bit_length())
        with self.lock:
            self._process_events()
            free = self.free_by_size.get(block)
            if free:
                ptr = free.pop()
            else:
                started = time.perf_counter_ns()
                ptr = openreg.host_malloc(block)
                self.times["host_alloc_time"].add((time.perf_counter_ns() - started) // 1000)
                self.sizes[ptr] = block
                self.counters["num_host_alloc"] += 1
                self.stats["allocations"].add(1)
                self.stats["allocated_bytes"].add(block)
            self.in_use.add(ptr)
            self.stats["active_requests"].add(1)
            self.stats["active_bytes"].add(block)
            return ptr

    def free(self, ptr: int) -> None:
        if ptr == 0:
            return
        with self.lock:
            self.in_use.discard(ptr)
            self.stats["active_requests"].add(-1)
            self.stats["active_bytes"].add(-self.sizes[ptr])
            if self.events.get(ptr):
                self.waiting.add(ptr)
            else:
                self.free_by_size.setdefault(self.sizes[ptr], []).append(ptr)

    # LITERALINCLUDE START: HOST RECORD EVENT
    def record_event(self, ptr: int, stream: openreg.Stream) -> bool:
        """Keep the block at ``ptr`` from reuse until ``stream`` reaches this point."""
        with self.lock:
            if ptr not in self.sizes:
                return False
            event = openreg.Event()
            event.record(stream)
            self.events.setdefault(ptr, []).append(event)
            return True
    # LITERALINCLUDE END: HOST RECORD EVENT

    def _process_events(self) -> None:
        for ptr in list(self.events):
            pending = [e for e in self.events[ptr] if not e.query()]
            if pending:
                self.events[ptr] = pending
                continue
            del self.events[ptr]
            if ptr in self.waiting:
                self.waiting.discard(ptr)
                self.free_by_size.setdefault(self.sizes[ptr], []).append(ptr)

    def empty_cache(self) -> None:
        """Give every cached (free, copy-complete) pinned block back to the driver."""
        with self.lock:
            self._process_events()
            for size, ptrs in self.free_by_size.items():
                for ptr in ptrs:
                    started = time.perf_counter_ns()
                    openreg.host_free(ptr)
                    self.times["host_free_time"].add((time.perf_counter_ns() - started) // 1000)
                    del self.sizes[ptr]
                    self.counters["num_host_free"] += 1
                    self.stats["allocations"].add(-1)
                    self.stats["allocated_bytes"].add(-size)
            self.free_by_size.clear()

    def as_dict(self) -> dict:
        """CUDA's ``host_memory_stats_as_nested_dict`` layout."""
        out = {name: s.as_dict() for name, s in self.stats.items()}
        out.update(self.counters)
        out.update({name: d.as_dict() for name, d in self.times.items()})
        return out

    def reset_peak(self) -> None:
        for s in self.stats.values():
            s.peak = s.current

    def reset_accumulated(self) -> None:
        for s in self.stats.values():
            s.reset_accumulated()
        for key in self.counters:
            self.counters[key] = 0
        for durations in self.times.values():
            durations.__init__()


class Durations:
    """Times of driver calls, as CUDA's ``DurationStat``: total, max, min, count and average (us)."""

    def __init__(self) -> None:
        self.total = self.max = self.min = self.count = 0

    def add(self, us: int) -> None:
        self.min = us if self.count == 0 else min(self.min, us)
        self.max = max(self.max, us)
        self.total += us
        self.count += 1

    def as_dict(self) -> dict[str, int]:
        return {"total": self.total, "max": self.max, "min": self.min, "count": self.count,
                "avg": self.total // self.count if self.count else 0}


host_allocator = HostCachingAllocator()
