"""Allocator statistics with CUDA's names and meanings (current / peak / allocated / freed).

Each statistic exists three times, like ``c10::CachingAllocator::StatArray``:
for all pools, the small pool and the large pool.
"""

from __future__ import annotations

ALL, SMALL, LARGE = 0, 1, 2
POOL_NAMES = ("all", "small_pool", "large_pool")
ARRAYS = (
    "allocation", "segment", "active", "inactive_split",
    "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
)
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")


class Stat:
    """One tracked quantity: its current value, peak, and the totals added and removed."""

    __slots__ = ("current", "peak", "allocated", "freed")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.freed = 0

    def add(self, amount: int) -> None:
        if amount >= 0:
            self.current += amount
            self.allocated += amount
            if self.current > self.peak:
                self.peak = self.current
        else:
            self.current += amount
            self.freed -= amount

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}


class Stats:
    """All statistics of one device allocator."""

    def __init__(self) -> None:
        self.arrays = {name: (Stat(), Stat(), Stat()) for name in ARRAYS}
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.oversize_allocations = Stat()
        self.oversize_segments = Stat()
        # (stat, amount) for the hot events per pool; amount 0 means "the block size"
        a = self.arrays
        self._malloc_stats = [
            [(a[n][p], k) for n, k in (("allocation", 1), ("allocated_bytes", 0), ("active", 1), ("active_bytes", 0))
             for p in (ALL, pool)] for pool in (ALL, SMALL, LARGE)
        ]
        self._free_stats = [
            [(a[n][p], k) for n, k in (("allocation", 1), ("allocated_bytes", 0)) for p in (ALL, pool)]
            for pool in (ALL, SMALL, LARGE)
        ]
        self._requested = [(a["requested_bytes"][ALL], a["requested_bytes"][pool]) for pool in (ALL, SMALL, LARGE)]

    def update(self, pool: int, *changes: tuple[str, int]) -> None:
        """Apply several ``(name, amount)`` changes at once (for the allocator's rarer events)."""
        arrays = self.arrays
        for name, amount in changes:
            array = arrays[name]
            array[ALL].add(amount)
            array[pool].add(amount)

    # LITERALINCLUDE START: STATS HOT PATH
    # The allocator's two hot events, written out: one call per event instead of a loop over
    # (name, amount) pairs, which cost more than the allocation itself.
    def on_malloc(self, pool: int, size: int, requested: int) -> None:
        """A block handed out: allocation, allocated/active bytes and requested bytes go up."""
        for s, amount in self._malloc_stats[pool]:
            current = s.current + (amount or size)
            s.current = current
            s.allocated += amount or size
            if current > s.peak:
                s.peak = current
        for s in self._requested[pool]:
            s.current += requested
            s.allocated += requested
            if s.current > s.peak:
                s.peak = s.current

    def on_free(self, pool: int, size: int, requested: int) -> None:
        """A block given back by its tensor: allocation, allocated bytes and requested bytes go down."""
        for s, amount in self._free_stats[pool]:
            s.current -= amount or size
            s.freed += amount or size
        for s in self._requested[pool]:
            s.current -= requested
            s.freed += requested

    def move(self, count_name: str, bytes_name: str, pool: int, count: int, size: int) -> None:
        """Move a count statistic and its bytes twin (``active``/``active_bytes``, ...) together."""
        counts, sizes = self.arrays[count_name], self.arrays[bytes_name]
        counts[ALL].add(count)
        counts[pool].add(count)
        sizes[ALL].add(size)
        sizes[pool].add(size)
    # LITERALINCLUDE END: STATS HOT PATH

    def reset_peak(self) -> None:
        for stats in self.arrays.values():
            for s in stats:
                s.peak = s.current
        for s in (self.oversize_allocations, self.oversize_segments):
            s.peak = s.current

    def reset_accumulated(self) -> None:
        for stats in self.arrays.values():
            for s in stats:
                s.allocated = s.freed = 0
        for s in (self.oversize_allocations, self.oversize_segments):
            s.allocated = s.freed = 0
        for key in ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free"):
            self.counters[key] = 0

    def as_dict(self) -> dict:
        """Nested like ``torch._C._cuda_memoryStats``: ``{"allocated_bytes": {"all": {...}}, ...}``."""
        out: dict = {
            name: {pool: s.as_dict() for pool, s in zip(POOL_NAMES, stats)} for name, stats in self.arrays.items()
        }
        out.update(self.counters)
        out["oversize_allocations"] = self.oversize_allocations.as_dict()
        out["oversize_segments"] = self.oversize_segments.as_dict()
        return out
