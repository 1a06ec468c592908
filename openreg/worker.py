"""A stream's worker: its queue of launched items, the thread that runs them, and when it runs them.

The stream API (``openreg/stream.py``) launches into a :class:`_Queue`; this module decides who runs
the queued work and when: the stream's worker thread once the host pauses, or a host that waits,
which runs the queue itself instead of sleeping until the worker is done (a thread round trip costs
more than most kernels). Optional features join through the launch hooks (``openreg/hooks.py``).
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from . import activity, hooks, memory, slots
from .activity import running as _running
from .device import forked, start
from .errors import OpenRegError, launch_failure

_clock = time.perf_counter_ns

# LITERALINCLUDE START: STREAM SCHEDULING
# Scheduling: when a stream's worker runs. The simulated device computes on the host's own cores, so
# every choice below trades the launching thread's time against the device's (the measurements behind
# them: docs/performance.md, "A worker that waits for the host" and "A worker that naps").
#
# The worker waits for the host to pause before it runs queued work: a worker that competes with the
# launching thread for the cores and the GIL slows both down (a CPU kernel's OpenMP team above all).
# A host that waits for work runs the queue itself instead (_Queue.wait_for).
_IDLE = 1e-3  # seconds without a launch before the worker starts on queued work
# Every wake-up of the worker takes the GIL from the host, which gives it up at every operator call. So
# the worker naps, twice as long each time it finds the host still launching, up to _NAP_MAX; launches
# wake it only from a deep sleep, entered after _AWAKE without a launch; finished items never wake it
# (waiting hosts have a condition of their own). Work still completes unattended within _IDLE + _NAP_MAX
# of the last launch.
_NAP_MAX = 8e-3  # longest nap of a worker that keeps finding the host still launching
_AWAKE = 0.1  # seconds after the last launch that the worker keeps checking on its own, unwoken
# LITERALINCLUDE END: STREAM SCHEDULING

# LITERALINCLUDE START: KERNEL CONTEXT
# What every thread that runs kernels enters first: a worker for its whole life, a host thread that
# runs queued work itself (wait_for) for as long as it does. A client sets it once, before launching:
# torch_openreg makes kernels run with autograd, autocast and Python modes off, whatever the state
# of the host thread that happens to run them.
_kernel_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext


def set_kernel_context(factory: Callable[[], contextlib.AbstractContextManager]) -> None:
    """Make ``factory()`` the context kernels run in (a fresh one per thread that runs them)."""
    global _kernel_context
    _kernel_context = factory
# LITERALINCLUDE END: KERNEL CONTEXT


# Priorities follow CUDA: lower numbers are more urgent; 0 is the default. Four levels, as torch.cuda
# reports for current GPUs (c10::cuda::max_compile_time_stream_priorities). They order the device's
# execution slots (openreg/slots.py).
PRIORITY_LOW = 0
PRIORITY_HIGH = -3


class _Item:
    __slots__ = ("fn", "args", "spans", "name", "seq", "owner", "outcome", "tag")

    def __init__(self, fn: Callable[..., Any], args: tuple, spans: list, name: str, seq: int, owner: int = 0) -> None:
        self.fn, self.args, self.spans, self.name, self.seq = fn, args, spans, name, seq
        self.tag = None  # what the launch hook returned for it (see stream.set_launch_hook)
        self.owner = owner  # for Stream.run_here: the thread that runs it (and gets its result); 0: anyone
        self.outcome: tuple | None = None  # for Stream.run_here: (True, result) or (False, exception)


class _Queue:
    """The machinery behind a stream; its worker thread holds this, never the Stream."""

    def __init__(self, device: int, stream_id: int) -> None:
        self.device, self.id = device, stream_id
        self.lock = lock = threading.Lock()
        self.cond = threading.Condition(lock)  # hosts waiting for items to finish
        self.wake = threading.Condition(lock)  # the worker, in a deep sleep, waiting for a launch
        self.items: collections.deque[_Item] = collections.deque()
        self.busy = False  # an item is running (on the worker or a stealing caller)
        self.waiters = 0  # hosts blocked in wait_for (notifying nobody costs a lock probe)
        self.launched = 0  # sequence number of the last launched item
        self.done = 0  # sequence number of the last finished item
        self.error: OpenRegError | None = None
        self.closed = False
        self.worker: threading.Thread | None = None
        self.idle = False  # the worker sleeps until a launch wakes it (see serve)
        self.last_launch = 0.0  # time.monotonic() of the last launch
        self.capture = None  # while a graph capture (openreg.graph) records this stream's launches, or guards it
        self.hurried = False  # a host waits for the whole device: run the queue now, without waiting for _IDLE
        self.priority = PRIORITY_LOW  # its stream's: which worker takes the next free slot (openreg/slots.py)

    # LITERALINCLUDE START: STREAM ENQUEUE
    def enqueue(self, fn: Callable[..., Any], args: tuple, buffers: tuple | list, name: str,
                writes: tuple | list | None, owner: int = 0, host: bool = False) -> _Item:
        """Queue ``fn(*args)`` (``Stream.launch``, and ``Stream.run_here`` for its ``owner`` thread): pin its
        buffers, let the launch hooks check it (the sanitizer may refuse it), append it with the next sequence
        number, and see that someone will run it: the worker, started on the first launch and woken from a
        deep sleep; an item for ``run_here`` waits for its owner."""
        item = _Item(fn, args, memory.acquire(buffers) if buffers else [], name, 0, owner)
        if hooks.check:  # the stream sanitizer (a launch that races raises); the profiler's tag
            try:
                for hook in hooks.check:
                    hook(self, item, buffers, writes, host)
            except BaseException:
                memory.release(item.spans)
                item.fn = item.args = fn = args = None  # this frame stays in the traceback: not the kernel's arguments
                raise
        with self.lock:  # the conditions' lock, taken directly: cheaper than entering a Condition
            self.launched += 1
            item.seq = self.launched
            self.items.append(item)
            self.last_launch = time.monotonic()
            if not owner:
                if self.worker is None:
                    self.worker = threading.Thread(target=self.serve, name=f"openreg:{self.device} stream {self.id}",
                                                   daemon=True)
                    self.worker.start()
                if self.idle:
                    self.wake.notify()
        return item
    # LITERALINCLUDE END: STREAM ENQUEUE

    # LITERALINCLUDE START: STREAM RUN
    def run(self, item: _Item) -> None:
        """Execute one item (the worker's; a waiting host runs them in :meth:`wait_for`), then mark it done."""
        self._execute(item)
        with self.lock:
            self.busy = False
            self.done = item.seq
            if self.waiters:
                self.cond.notify_all()

    def _execute(self, item: _Item) -> None:
        """Run one item; keep the first error for the next sync. Its buffers are let go of once it has run
        (frees waiting on them go through); the launch hooks see it start and end (memcheck opens its buffers'
        views meanwhile, profilers observe it). The caller marks it done, with the lock held.
        """
        started = _clock()
        running = _running.kernel
        _running.kernel = (item.name, self.device, self.id)
        try:
            if hooks.running:
                for hook in hooks.running:
                    hook(item)
            if item.owner:
                item.outcome = (True, item.fn(*item.args))
            else:
                item.fn(*item.args)
        except BaseException as exc:  # noqa: BLE001 - any kernel failure becomes a device fault
            if item.owner:
                item.outcome = (False, exc)  # raised as is by run_here, on the thread that called it
            else:
                self.fail(item.name, exc, getattr(item.tag, "launch_site", None))
        finally:
            _running.kernel = running  # (a kernel run inside another's wait restores the outer one)
            activity.record(self.device, started, _clock(), item.name)
            if hooks.ran:
                for hook in hooks.ran:
                    hook(self, item, started)
        if item.spans:
            memory.release(item.spans)
        # What the kernel held (a collective's tensors, a closure's) goes before the item is seen done: a host that
        # synchronizes then finds the memory a freed tensor kept in use released, not released a moment later by
        # whichever thread ran the item when it lets go of it.
        item.fn = item.args = None

    def fail(self, name: str, exc: BaseException, site: str | None = None) -> None:
        """Keep the failure of kernel ``name`` for the next synchronizing call (the first one not yet reported)."""
        if self.error is None:
            self.error = launch_failure(
                f"{name} on openreg:{self.device} stream {self.id} failed: {type(exc).__name__}: {exc}"
                + (f" (launched at {site})" if site else ""), exc
            )

    def _settled(self) -> bool:
        """With the lock held: True if all work is done."""
        return self.done >= self.launched and not self.busy
    # LITERALINCLUDE END: STREAM RUN

    # LITERALINCLUDE START: STREAM WAIT
    def wait_for(self, seq: int, settle: bool = True, simulated: bool = True) -> None:
        """Block until launch ``seq`` has finished, running queued work here when the worker is idle.

        ``settle``: the host waits (the launch hooks see it: a graph capture refuses it, the timing model
        moves the host's clock when ``simulated``); a wait queued on another stream (``Stream.wait_event``)
        does not.
        """
        if forked():
            start()  # raises: the workers did not survive the fork
        if settle and hooks.host_wait:
            for hook in hooks.host_wait:
                hook(self, seq, simulated)
        if self.done >= seq:  # (``done`` only grows: a launch seen finished needs no lock)
            return
        lock = self.lock  # the conditions' lock, taken directly: cheaper than entering a Condition
        with lock:
            item = self._next(seq)
        if item is None:
            return
        context = _kernel_context()  # entered once for all the items this host runs
        context.__enter__()
        try:
            while True:
                self._execute(item)
                with lock:  # one hold of the lock marks this item done and takes the next
                    self.busy = False
                    self.done = item.seq
                    if self.waiters:
                        self.cond.notify_all()
                    item = self._next(seq)
                if item is None:
                    return
        finally:
            context.__exit__(None, None, None)

    def _next(self, seq: int) -> _Item | None:
        """With the lock held, for a host waiting for launch ``seq``: the next item for it to run (taken), or
        None once ``seq`` has finished; meanwhile it waits while the worker (or another host) runs an item."""
        me = 0
        while self.done < seq:
            items = self.items
            if not self.busy and items:
                owner = items[0].owner
                if not owner or owner == (me or (me := threading.get_ident())):
                    item = items.popleft()  # (_take, inline; an item for run_here runs on the thread that asked for it)
                    self.busy = True
                    if not items:
                        self.hurried = False
                    return item
            self._wait()
        return None

    def _wait(self) -> None:
        """Wait for an item to finish (with the lock held)."""
        self.waiters += 1
        try:
            self.cond.wait()
        finally:
            self.waiters -= 1

    def settle(self) -> bool:
        """``query``: True if all launched work has finished."""
        with self.lock:
            return self._settled()
    # LITERALINCLUDE END: STREAM WAIT

    # LITERALINCLUDE START: STREAM SERVE
    def serve(self) -> None:
        """The worker thread: run items in order until the stream is gone and drained, by the
        scheduling policy at the top of this module (``_IDLE``, ``_NAP_MAX``, ``_AWAKE``)."""
        with _kernel_context():
            self._serve()

    def _serve(self) -> None:
        nap = _IDLE
        while True:
            with self.cond:
                while True:
                    if self.closed and not self.items:
                        if self._settled():
                            self.worker = None
                            return
                        self.wake.wait(_IDLE)  # the last item is still finishing on a stealing host
                        continue
                    now = time.monotonic()
                    if self.items and not self.busy and not self.items[0].owner:
                        if self.hurried or now - self.last_launch >= _IDLE:
                            break  # the host has paused (or waits for the device): run the next item
                        timeout = max(self.last_launch + _IDLE - now, nap)
                    elif self.busy or self.items or now - self.last_launch < _AWAKE:
                        timeout = nap  # a host is running the queue (or will: run_here), or may launch again
                    else:
                        timeout = None  # deep sleep: the next launch wakes the worker
                    self.idle = timeout is None
                    self.wake.wait(timeout)
                    self.idle = False
                    nap = min(2 * nap, _NAP_MAX)
            slots.acquire(self.device, self.priority)  # before taking the item: a waiting host may still run it
            with self.lock:
                item = self._take() if self.items and not self.busy and not self.items[0].owner else None
            try:
                if item is not None:
                    nap = _IDLE
                    self.run(item)
            finally:
                slots.release(self.device)
            del item
    # LITERALINCLUDE END: STREAM SERVE

    def _take(self) -> _Item:
        """The next item, now running (with the lock held); once the queue is drained, later launches wait for
        the host's pause again (:meth:`hurry` was for the work queued then)."""
        item = self.items.popleft()
        self.busy = True
        if not self.items:
            self.hurried = False
        return item

    def hurry(self) -> None:
        """A host waits for the whole device and runs another stream's queue itself: this worker starts on its
        queue now, side by side with it, rather than after ``_IDLE`` (the host is not launching)."""
        with self.lock:
            if self.items and self.worker is not None:
                self.hurried = True
                self.wake.notify()

    def close(self) -> None:
        """The stream is gone: its worker drains the queue and exits."""
        with self.cond:
            self.closed = True
            self.cond.notify_all()
            self.wake.notify()


def report(q: _Queue) -> None:
    """Raise (once) the error a kernel on ``q`` left for the next synchronizing call."""
    error, q.error = q.error, None
    if error is not None:
        raise error
