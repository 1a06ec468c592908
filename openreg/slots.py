"""Execution slots: how many kernels a device runs at once, and which stream's kernel runs next.

A GPU runs the kernels of several streams side by side until its multiprocessors are taken; then the
block scheduler hands the next free one to the highest-priority stream's waiting kernel
(``cudaStreamCreateWithPriority``). openreg's streams each have a worker thread, so without a bound
every ready kernel would run at once and priorities would mean nothing. Each device has ``count()``
slots (at least two, so that two streams still overlap); a worker holds one while it runs an item,
and when more items are ready than slots, the one of the highest priority (lowest number; the
earliest to ask among equals) takes the next free slot.

A host thread that runs queued work itself (``_Queue.wait_for``: a synchronize, ``.item()``) runs it
outside the slots. It is not the device choosing what to run but the host waiting for exactly that
work, and making it wait for a slot could deadlock: the kernels holding the slots may be waiting for
this host (a kernel that waits on a host-set gate or on an event this host has still to record). So
at most one item per waiting host thread runs beyond the bound. A worker takes its slot before it
takes the item off its queue: while it waits for the slot, a host (or another worker in a stream
wait, which runs the waited-for queue itself) can still run that item, so a stream wait never waits
for a worker that waits for a slot. What can still hold every slot is a kernel that blocks on the
host (a test's gate): the host then runs the work it waits for itself, as above.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import threading
from collections.abc import Iterator

from .device import check_device, device_count
from .errors import ErrorCode, OpenRegError

MIN_SLOTS = 2


def _default_count() -> int:
    """One slot per host core the process may use (the simulated device computes on them), at least two."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS has no affinity call
        cores = os.cpu_count() or MIN_SLOTS
    return max(MIN_SLOTS, cores)


# LITERALINCLUDE START: SLOTS
class Slots:
    """The execution slots of one device: a counting semaphore whose waiters are served by priority."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.busy = 0
        self.lock = threading.Lock()
        self.waiting: list[tuple[int, int, threading.Event]] = []  # heap of (priority, arrival, wake-up)
        self.arrivals = itertools.count()

    def acquire(self, priority: int) -> None:
        """Take a slot; while none is free (or a more urgent kernel waits), wait for one by priority."""
        with self.lock:
            if self.busy < self.count and not self.waiting:
                self.busy += 1
                return
            ticket = (priority, next(self.arrivals), threading.Event())
            heapq.heappush(self.waiting, ticket)
        ticket[2].wait()  # release() counted the slot as ours before setting the event

    def release(self) -> None:
        """Give a slot back: the most urgent waiter (the earliest among equals) gets it."""
        with self.lock:
            if self.waiting and self.busy <= self.count:
                heapq.heappop(self.waiting)[2].set()  # the slot passes to it: busy stays the same
            else:
                self.busy -= 1

    def resize(self, count: int) -> None:
        """Change the number of slots; waiters get the new ones at once."""
        with self.lock:
            self.count = count
            while self.waiting and self.busy < self.count:
                self.busy += 1
                heapq.heappop(self.waiting)[2].set()


# LITERALINCLUDE END: SLOTS


_slots = [Slots(_default_count()) for _ in range(device_count())]


class _Held(threading.local):
    slot: tuple[int, int] | None = None  # (device, priority) of the slot this thread holds


_held = _Held()


def acquire(device: int, priority: int) -> None:
    """Take a slot of ``device`` for an item of a stream of ``priority`` (waiting by priority for one)."""
    _slots[device].acquire(priority)
    _held.slot = (device, priority)


def release(device: int) -> None:
    """Give back a slot of ``device`` taken with :func:`acquire`."""
    _held.slot = None
    _slots[device].release()


@contextlib.contextmanager
def released() -> Iterator[None]:
    """Run the block without this thread's slot, if it holds one, and take one again after it (by priority):
    for an item that only waits (a stream waiting for an event occupies no multiprocessor on a GPU), so
    that kernels it may be waiting for are not kept from running."""
    slot = _held.slot
    if slot is None:
        yield
        return
    release(slot[0])
    try:
        yield
    finally:
        acquire(*slot)


def count(device: int) -> int:
    """How many kernels ``device`` runs at once."""
    return _slots[check_device(device)].count


def set_count(device: int, slots: int) -> int:
    """Let ``device`` run ``slots`` kernels at once (at least two); returns the previous count."""
    if not isinstance(slots, int) or slots < MIN_SLOTS:
        raise OpenRegError(ErrorCode.INVALID_VALUE,
                           f"a device needs at least {MIN_SLOTS} execution slots, got {slots!r}")
    arbiter = _slots[check_device(device)]
    previous = arbiter.count
    arbiter.resize(slots)
    return previous


def waiting(device: int) -> list[int]:
    """The priorities of the items waiting for a slot of ``device``, most urgent first (for tests and tools)."""
    arbiter = _slots[check_device(device)]
    with arbiter.lock:
        return [priority for priority, _, _ in sorted(arbiter.waiting)]
