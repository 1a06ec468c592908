"""One device's memory: a shared-memory object the size of the device, mapped twice, and which ranges of it
are allocated.

The device range (``base``) is what device pointers point into; it is ``PROT_NONE`` for the process's
life. The view (``base + delta``) is the same memory, read/write: the simulated device's side of the
bus, which only kernels and the copy engine reach, through ``openreg.memory.view_address``. One object
per device, not per allocation: translating a pointer is one subtraction, the process holds one
descriptor per device (macOS's default soft limit is 256), and an export hands out the same descriptor
with the allocation's place in it. Freed ranges go back to the OS (``platform.release_pages``).
"""

from __future__ import annotations

import bisect
import os

from . import platform


class Arena:
    """``size`` bytes of device memory: first-fit ranges of granules, handed out by :meth:`take`."""

    def __init__(self, device: int, size: int) -> None:
        self.size = platform.round_up(size)
        self.fd = platform.create_shared(f"openreg{device}", self.size)
        mapped = platform.map_twice(self.fd, self.size)
        if mapped is None:
            os.close(self.fd)
            raise MemoryError(f"cannot map {self.size} bytes twice for openreg:{device}")
        self.base, view = mapped
        self.delta = view - self.base
        self._starts = [0]  # free ranges, sorted by offset, never touching (merged on give)
        self._ends = [self.size]

    # LITERALINCLUDE START: ARENA
    def take(self, nbytes: int) -> int | None:
        """The device address of ``nbytes`` (whole granules) of free memory, or None if no range fits."""
        for i, (lo, hi) in enumerate(zip(self._starts, self._ends)):
            if hi - lo >= nbytes:
                if hi - lo == nbytes:
                    del self._starts[i], self._ends[i]
                else:
                    self._starts[i] = lo + nbytes
                return self.base + lo
        return None

    def give(self, ptr: int, nbytes: int) -> None:
        """Free ``nbytes`` at ``ptr`` (from :meth:`take`): merged with its free neighbours, its memory released."""
        lo = ptr - self.base
        hi = lo + nbytes
        platform.release_pages(self.fd, lo, nbytes)
        i = bisect.bisect_left(self._starts, lo)
        if i < len(self._starts) and self._starts[i] == hi:  # joins the next free range
            hi = self._ends[i]
            del self._starts[i], self._ends[i]
        if i and self._ends[i - 1] == lo:  # joins the previous one
            self._ends[i - 1] = hi
        else:
            self._starts.insert(i, lo)
            self._ends.insert(i, hi)
    # LITERALINCLUDE END: ARENA

    def holds(self, ptr: int) -> bool:
        """Whether ``ptr`` is in this device's address range."""
        return self.base <= ptr < self.base + self.size
