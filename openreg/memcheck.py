"""``OPENREG_MEMCHECK=1``: kernels see only the device memory their launch names (like compute-sanitizer's
memcheck, for the simulator).

Without it the device's view of its memory (``openreg.memory``) is read/write for everyone who can
translate to it, and a kernel that reaches a buffer it was not handed computes on it silently. With
it, every view is ``PROT_NONE`` except the granules of the buffers named by launches that are running:
its launch hook calls :func:`before` and :func:`after` around each item the stream runs, and the copy
engine calls them around each transfer. A kernel that touches anything else faults, and the fault
reporter names the allocation under its device address. Openings are reference counted, so kernels
on different streams may share a buffer. It costs two ``mprotect`` calls per launch: a debugging mode, off by default.
"""

from __future__ import annotations

import threading

from . import hooks, platform, settings

enabled = settings.MEMCHECK
_lock = threading.Lock()
_open: dict[tuple[int, int], int] = {}  # (first view byte, end) -> running launches holding it open


def seal(view: int, size: int) -> None:
    """Close a view range (a new arena or import, or memory just freed)."""
    platform.protect(view, size, platform.PROT_NONE)


# LITERALINCLUDE START: RUNTIME MEMCHECK
def before(spans: list) -> None:
    """Open the views of ``spans`` (``openreg.memory.acquire``'s ``(allocation, first, end)``) for an item."""
    with _lock:
        for alloc, lo, hi in spans:
            key = (lo + alloc.delta, hi + alloc.delta)
            count = _open.get(key, 0)
            _open[key] = count + 1
            if not count and alloc.delta:
                platform.protect(key[0], key[1] - key[0], platform.PROT_RW)


def after(spans: list) -> None:
    """Close them again, except what a launch still running (on another stream) holds open."""
    with _lock:
        closed = []
        for alloc, lo, hi in spans:
            key = (lo + alloc.delta, hi + alloc.delta)
            count = _open[key] - 1
            if count:
                _open[key] = count
            else:
                del _open[key]
                if alloc.delta:
                    closed.append(key)
        for lo, hi in _minus(_merged(closed), _merged(list(_open))):
            platform.protect(lo, hi - lo, platform.PROT_NONE)
# LITERALINCLUDE END: RUNTIME MEMCHECK


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


class _Hook(hooks.LaunchHook):
    """Memcheck on the launch path: each item's buffers are open while it runs."""

    def running(self, item) -> None:
        before(item.spans)

    def ran(self, q, item, started_ns: int) -> None:
        after(item.spans)


if enabled:
    hooks.add(_Hook())
