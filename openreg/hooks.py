"""Launch hooks: how the optional features reach the launch path.

Graph capture (``openreg/graph.py``), the stream sanitizer (``sanitizer.py``), the timing model
(``timing/``), profiler tags (``stream.set_launch_hook``), launch blocking (``launch_blocking.py``) and
memcheck (``memcheck.py``) each register a :class:`LaunchHook` while they are on. The stream and its
worker walk the hooks registered for each point of a launch's life (the tuples below); with every
feature off each tuple is empty and a point costs one test, so ``Stream.launch`` reads as the queue it is.
"""

from __future__ import annotations

import threading
from typing import Any

# LITERALINCLUDE START: LAUNCH HOOKS
POINTS = ("take", "check", "queued", "running", "ran", "host_wait", "host_waited", "unrecordable",
          "stream_wait", "event_record", "event_recorded", "event_waited", "host_access", "allocated", "cached")


class LaunchHook:
    """One optional feature on the launch path. A hook overrides the points it needs; only those are
    called. ``order`` places it among the others at every point (lower first): a capture takes a launch
    before anything sees it, the sanitizer refuses a racing launch before the profiler tags it, the
    timing model prices a launch before launch blocking waits for it."""

    order = 50

    def take(self, q: Any, fn: Any, args: tuple, buffers: Any, name: str, writes: Any, cost: Any) -> int | None:
        """Before the launch pins its buffers: a sequence number returned takes the launch over (a graph
        capture records it; nothing is queued)."""

    def check(self, q: Any, item: Any, buffers: Any, writes: Any, host: bool) -> None:
        """Its buffers pinned, before it is queued (or a copy engine's transfer runs): raise to refuse it;
        may set ``item.tag``. ``host``: the host runs it and waits for it."""

    def queued(self, stream: Any, item: Any, buffers: Any, cost: Any) -> None:
        """Queued, on the launching thread."""

    def running(self, item: Any) -> None:
        """About to run, on the thread that runs it."""

    def ran(self, q: Any, item: Any, started_ns: int) -> None:
        """Has run (or failed), on the thread that ran it."""

    def host_wait(self, q: Any, seq: int, simulated: bool) -> None:
        """The host is about to wait for launch ``seq`` of ``q`` (``simulated``: the program's wait, not the
        simulator's own)."""

    def host_waited(self, q: Any, seq: int) -> None:
        """The host waited for launch ``seq`` of ``q``, or saw it finish: it is ordered after it."""

    def unrecordable(self, q: Any, what: str) -> None:
        """The host runs ``what`` on ``q`` now (a kernel run here, a synchronous copy, a query)."""

    def stream_wait(self, stream: Any, event: Any) -> bool:
        """``stream`` waits for ``event``; True: handled here (the stream queues no wait)."""
        return False

    def event_record(self, event: Any, q: Any) -> bool:
        """``event`` is recorded on ``q``; True: handled here (the event marks no point of the stream)."""
        return False

    def event_recorded(self, event: Any, stream: Any) -> None:
        """``event`` was recorded on ``stream``."""

    def event_waited(self, event: Any) -> None:
        """The host waited for ``event`` (or saw it complete)."""

    def host_access(self, q: Any, extent: list, write: bool, name: str, about: Any) -> None:
        """The host reads (or writes) ``extent`` itself now, in ``q``'s order after its earlier work, with no
        launch (the copy engine's transfers): raise to refuse it."""

    def allocated(self, ptr: int, nbytes: int, device: int, stream: int | None) -> None:
        """An allocator handed out ``[ptr, ptr + nbytes)`` (``stream``: the caching allocator's stream)."""

    def cached(self, ptr: int, nbytes: int, device: int, stream: int) -> None:
        """A caching allocator took a block back: its bytes stay mapped, for the next tensor it hands out."""


_hooks: list[LaunchHook] = []
_lock = threading.Lock()


def add(hook: LaunchHook) -> None:
    """Register ``hook`` (once: adding it again does nothing)."""
    with _lock:
        if hook not in _hooks:
            _hooks.append(hook)
            _hooks.sort(key=lambda h: h.order)
            _rebuild()


def remove(hook: LaunchHook) -> None:
    """Unregister ``hook`` (not registered: nothing happens)."""
    with _lock:
        if hook in _hooks:
            _hooks.remove(hook)
            _rebuild()


def any_registered() -> bool:
    """Whether any feature watches the launch path now (with all of them off: a copy may skip the hooks)."""
    return bool(_hooks)


def registered() -> list[LaunchHook]:
    """The hooks registered now, in order."""
    return list(_hooks)


def _rebuild() -> None:
    """Each point's tuple: the bound methods of the hooks that override it, in order."""
    for point in POINTS:
        default = getattr(LaunchHook, point)
        globals()[point] = tuple(getattr(h, point) for h in _hooks if getattr(type(h), point) is not default)
# LITERALINCLUDE END: LAUNCH HOOKS


# Each point's hooks (bound methods, in order), as the stream walks them: set by _rebuild.
take = check = queued = running = ran = host_wait = host_waited = unrecordable = ()
stream_wait = event_record = event_recorded = event_waited = host_access = allocated = cached = ()
