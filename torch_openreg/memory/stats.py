"""Allocator statistics with CUDA's names and meanings (current / peak / allocated / freed).

Each statistic exists three times, like ``c10::CachingAllocator::StatArray``: for all pools, the small
pool and the large pool. The allocator updates a dozen of them per allocation, more than the rest of
its work, so they are stored to make that cheap:

* only the two pools' values are stored; "all" is their sum, added up when read, except its peak, a
  running maximum that every increase checks;
* the total freed is derived (:class:`Stat`), so a decrease changes one value;
* ``active`` and ``active_bytes`` differ from ``allocation`` and ``allocated_bytes`` only while a freed
  block waits for other streams (``record_stream``); until then they are the same objects, updated once.
"""

from __future__ import annotations

from typing import NamedTuple

ALL, SMALL, LARGE = 0, 1, 2
POOL_NAMES = ("all", "small_pool", "large_pool")
ARRAYS = (
    "allocation", "segment", "active", "inactive_split",
    "allocated_bytes", "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes",
)
COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")
MIRRORED = (("active", "allocation"), ("active_bytes", "allocated_bytes"))


class Stat:
    """One tracked quantity: its current value, peak, and the totals added and removed.

    The total removed is not stored: since the last reset, ``allocated - freed == current - base``,
    so a decrease only changes ``current``.
    """

    __slots__ = ("current", "peak", "allocated", "base")

    def __init__(self) -> None:
        self.current = self.peak = self.allocated = self.base = 0

    @property
    def freed(self) -> int:
        return self.allocated - self.current + self.base

    def add(self, amount: int) -> None:
        self.current += amount
        if amount >= 0:
            self.allocated += amount
            if self.current > self.peak:
                self.peak = self.current

    def reset_accumulated(self) -> None:
        self.allocated, self.base = 0, self.current

    def copy(self) -> Stat:
        other = Stat()
        other.current, other.peak, other.allocated, other.base = self.current, self.peak, self.allocated, self.base
        return other

    def as_dict(self) -> dict[str, int]:
        return {"current": self.current, "peak": self.peak, "allocated": self.allocated, "freed": self.freed}


class Peak:
    """The peak of a statistic summed over both pools (its other values are the pools' sums)."""

    __slots__ = ("peak",)

    def __init__(self, peak: int = 0) -> None:
        self.peak = peak


class Tracked(NamedTuple):
    """One statistic as an event in one pool changes it: the pool's value, the other pool's (their sum's
    peak is checked on increases), and the peak of the sum."""

    pool: Stat
    other: Stat
    total: Peak


POOL = Tracked._fields.index("pool")


class HotStats(NamedTuple):
    """The statistics the allocator's hot events touch, for one pool (``Stats.on_malloc``/``on_release``)."""

    allocation: Tracked
    allocated_bytes: Tracked
    requested_bytes: Tracked
    active: Tracked
    active_bytes: Tracked
    inactive_split: Tracked
    inactive_split_bytes: Tracked


class Stats:
    """All statistics of one device allocator."""

    def __init__(self) -> None:
        # name -> (peak of the sum, small pool, large pool), indexed by ALL / SMALL / LARGE
        self.arrays: dict[str, tuple[Peak, Stat, Stat]] = {name: (Peak(), Stat(), Stat()) for name in ARRAYS}
        self.counters = dict.fromkeys(COUNTERS, 0)
        self.oversize_allocations = Stat()
        self.oversize_segments = Stat()
        self._mirror(True)

    def current(self, name: str) -> int:
        """The current value of ``name`` over both pools."""
        _, small, large = self.arrays[name]
        return small.current + large.current

    def update(self, pool: int, *changes: tuple[str, int]) -> None:
        """Apply several ``(name, amount)`` changes at once (for the allocator's rarer events)."""
        for name, amount in changes:
            peak, small, large = self.arrays[name]
            (small if pool == SMALL else large).add(amount)
            if amount > 0 and small.current + large.current > peak.peak:
                peak.peak = small.current + large.current

    # -- active mirrors allocation ----------------------------------------------------------------
    def _mirror(self, on: bool) -> None:
        """Make active(_bytes) the same objects as allocation / allocated_bytes, or copies of them."""
        for name, source in MIRRORED:
            peak, small, large = self.arrays[source]
            self.arrays[name] = (peak, small, large) if on else (Peak(peak.peak), small.copy(), large.copy())
        self.mirrored = on
        # Per pool, a HotStats of Tracked, stored as plain tuples: the hot events unpack 12 of them, and a
        # NamedTuple unpacks through the generic iterator (docs/performance.md; their names follow the fields).
        self._hot = [None] + [
            tuple(tuple(Tracked(self.arrays[name][pool], self.arrays[name][3 - pool], self.arrays[name][ALL]))
                  for name in HotStats._fields)
            for pool in (SMALL, LARGE)
        ]

    def _diverge(self) -> None:
        """A freed block waits for other streams: active stops following allocation."""
        if self.mirrored:
            self._mirror(False)

    def converge(self) -> None:
        """Follow allocation again once active equals it (no block waits, nothing differs)."""
        if not self.mirrored and all(
            self.arrays[name][0].peak == self.arrays[source][0].peak
            and all(a.as_dict() == b.as_dict() for a, b in zip(self.arrays[name][1:], self.arrays[source][1:]))
            for name, source in MIRRORED
        ):
            self._mirror(True)

    # LITERALINCLUDE START: STATS HOT PATH
    # The allocator's hot events, written out: one call per event, no loop over names, only the pool's
    # values touched ("all" is their sum, except its peak), active only when it differs from allocation.
    def on_malloc(self, pool: int, size: int, requested: int, taken: int, rest: int) -> None:
        """A block handed out: allocation, allocated/active bytes and requested bytes go up. ``taken``
        is the size of the split block it came from (0 if that was not split), ``rest`` the size of
        the free block split off it (0 if none): inactive_split moves by both."""
        allocation, allocated_bytes, requested_bytes, active, active_bytes, split, split_bytes = self._hot[pool]
        n, n2, nt = allocation  # this pool's value, the other pool's, the peak of their sum
        b, b2, bt = allocated_bytes
        r, r2, rt = requested_bytes
        s, s2, st = split
        sb, sb2, sbt = split_bytes
        c = n.current + 1
        n.current = c
        n.allocated += 1
        if c > n.peak:
            n.peak = c
        c += n2.current
        if c > nt.peak:
            nt.peak = c
        c = b.current + size
        b.current = c
        b.allocated += size
        if c > b.peak:
            b.peak = c
        c += b2.current
        if c > bt.peak:
            bt.peak = c
        c = r.current + requested
        r.current = c
        r.allocated += requested
        if c > r.peak:
            r.peak = c
        c += r2.current
        if c > rt.peak:
            rt.peak = c
        if not self.mirrored:
            a, a2, at = active
            ab, ab2, abt = active_bytes
            c = a.current + 1
            a.current = c
            a.allocated += 1
            if c > a.peak:
                a.peak = c
            c += a2.current
            if c > at.peak:
                at.peak = c
            c = ab.current + size
            ab.current = c
            ab.allocated += size
            if c > ab.peak:
                ab.peak = c
            c += ab2.current
            if c > abt.peak:
                abt.peak = c
        if rest:  # the free block split off enters inactive_split
            s.allocated += 1
            sb.allocated += rest
            if taken:  # ... and the split block it came from leaves: fewer bytes, the same count
                sb.current += rest - taken
            else:
                c = s.current + 1
                s.current = c
                if c > s.peak:
                    s.peak = c
                c += s2.current
                if c > st.peak:
                    st.peak = c
                c = sb.current + rest
                sb.current = c
                if c > sb.peak:
                    sb.peak = c
                c += sb2.current
                if c > sbt.peak:
                    sbt.peak = c
        elif taken:
            s.current -= 1
            sb.current -= taken

    def on_reuse(self, pool: int, size: int, requested: int, count: int) -> None:
        """A block freed and handed out again ``count`` times with nothing between (the bridge's block cache):
        the totals of both events; current values and peaks stay as they are."""
        allocation, allocated_bytes, requested_bytes, active, active_bytes = self._hot[pool][:5]
        allocation[POOL].allocated += count
        allocated_bytes[POOL].allocated += size * count
        requested_bytes[POOL].allocated += requested * count
        if not self.mirrored:
            active[POOL].allocated += count
            active_bytes[POOL].allocated += size * count

    def on_free(self, pool: int, size: int, requested: int) -> None:
        """A block given back by its tensor while other streams still use it: allocation, allocated
        bytes and requested bytes go down (active ones when it is released)."""
        self._diverge()
        allocation, allocated_bytes, requested_bytes = self._hot[pool][:3]
        n, b, r = allocation[POOL], allocated_bytes[POOL], requested_bytes[POOL]
        n.current -= 1
        b.current -= size
        r.current -= requested

    def on_release(self, pool: int, size: int, merged: int, merged_bytes: int, inserted: int,
                   requested: int = -1) -> None:
        """A block back in its pool: active and active bytes go down; it absorbed ``merged`` free
        neighbours of ``merged_bytes`` and, if still split, enters inactive_split with ``inserted``.
        A block that comes straight from its tensor passes ``requested``: the free is counted too."""
        allocation, allocated_bytes, requested_bytes, active, active_bytes, split, split_bytes = self._hot[pool]
        if requested >= 0:  # as on_free
            allocation[POOL].current -= 1
            allocated_bytes[POOL].current -= size
            requested_bytes[POOL].current -= requested
        if not self.mirrored:
            active[POOL].current -= 1
            active_bytes[POOL].current -= size
        s, s2, st = split
        sb, sb2, sbt = split_bytes
        # inactive_split: the merged neighbours leave, then the block enters if still split; only a
        # net increase can set a peak
        added = 1 if inserted else 0
        s.allocated += added
        c = s.current + added - merged
        s.current = c
        if added > merged:
            if c > s.peak:
                s.peak = c
            c += s2.current
            if c > st.peak:
                st.peak = c
        sb.allocated += inserted
        c = sb.current + inserted - merged_bytes
        sb.current = c
        if inserted > merged_bytes:
            if c > sb.peak:
                sb.peak = c
            c += sb2.current
            if c > sbt.peak:
                sbt.peak = c
    # LITERALINCLUDE END: STATS HOT PATH

    def reset_peak(self) -> None:
        for peak, small, large in self.arrays.values():
            small.peak, large.peak = small.current, large.current
            peak.peak = small.current + large.current
        for s in (self.oversize_allocations, self.oversize_segments):
            s.peak = s.current
        self.converge()

    def reset_accumulated(self) -> None:
        for _, small, large in self.arrays.values():
            small.reset_accumulated()
            large.reset_accumulated()
        self.oversize_allocations.reset_accumulated()
        self.oversize_segments.reset_accumulated()
        for key in COUNTERS:
            self.counters[key] = 0
        self.converge()

    def as_dict(self) -> dict:
        """Nested like ``torch._C._cuda_memoryStats``: ``{"allocated_bytes": {"all": {...}}, ...}``."""
        out: dict = {}
        for name, (peak, small, large) in self.arrays.items():
            total = {"current": small.current + large.current, "peak": peak.peak,
                     "allocated": small.allocated + large.allocated, "freed": small.freed + large.freed}
            out[name] = {"all": total, "small_pool": small.as_dict(), "large_pool": large.as_dict()}
        out.update(self.counters)
        out["oversize_allocations"] = self.oversize_allocations.as_dict()
        out["oversize_segments"] = self.oversize_segments.as_dict()
        return out
