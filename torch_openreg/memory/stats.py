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

    def add(self, name: str, pool: int, amount: int) -> None:
        """Change ``name`` by ``amount`` in ``pool`` and in the all-pools aggregate."""
        stats = self.arrays[name]
        stats[ALL].add(amount)
        stats[pool].add(amount)

    def update(self, pool: int, *changes: tuple[str, int]) -> None:
        """Apply several ``(name, amount)`` changes at once (the allocator's hot path: no per-stat calls)."""
        arrays = self.arrays
        for name, amount in changes:
            array = arrays[name]
            for s in (array[ALL], array[pool]):
                current = s.current + amount
                s.current = current
                if amount >= 0:
                    s.allocated += amount
                    if current > s.peak:
                        s.peak = current
                else:
                    s.freed -= amount

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
