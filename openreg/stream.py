"""Streams: in-order queues of work, each run by its own worker thread.

Work on one stream runs in launch order; work on different streams may overlap.
A launch returns at once. A kernel that raises does not raise at its launch: the
error is kept and reported by the next synchronizing call on that stream or its
device, the way a real device reports asynchronous faults.
``OPENREG_LAUNCH_BLOCKING=1`` makes every launch wait for its work, so errors
surface at the call that caused them.

Synchronizing is cheap when the work has not started yet: the waiting thread
runs the queued items itself, in order, instead of waking the worker and
sleeping until it is done (a thread round trip costs ~170 us).
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from . import activity, memcheck, memory, sanitizer, settings, slots, timing
from .device import check_device, device_count, forked, get_device, start
from .errors import ErrorCode, OpenRegError, launch_failure

LAUNCH_BLOCKING = settings.LAUNCH_BLOCKING

# LITERALINCLUDE START: STREAM SCHEDULING
# Scheduling: when a stream's worker runs. The simulated device
# computes on the host's own cores, so every choice below trades the launching thread's time against
# the device's; the numbers are from this project's 2-core machine (docs/runtime.md, "When the worker runs").
#
# The worker waits for the host to pause before it runs queued work. A worker that started on each item
# at once competed with the launching thread for the cores and the GIL, and a CPU kernel's OpenMP team
# slows down badly when one of its threads is preempted: a transformer step's matrix products took 1.9x
# their CPU time. A host that waits for work runs the queue itself instead (_Queue.wait_for).
_IDLE = 1e-3  # seconds without a launch before the worker starts on queued work
# Every wake-up of the worker takes the GIL from the host, which gives it up at every operator call: a
# worker polling every 200 us made each launch twice as expensive, and one woken by every launch and
# every finished item added 25-35 us to each launch-and-wait (.item()). So the worker naps, twice as long
# each time it finds the host still launching, up to _NAP_MAX; launches wake it only from a deep sleep,
# entered after _AWAKE without a launch; finished items never wake it (waiting hosts have a condition of
# their own). Work still completes unattended within _IDLE + _NAP_MAX of the last launch.
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

    def __init__(self, fn: Callable[..., Any], args: tuple, spans: list, name: str, seq: int, tag: Any = None) -> None:
        self.fn, self.args, self.spans, self.name, self.seq = fn, args, spans, name, seq
        self.tag = tag  # what the launch hook returned for it (see set_launch_hook)
        self.owner = 0  # for Stream.run_here: the thread that runs it (and gets its result); 0: anyone
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

    # LITERALINCLUDE START: STREAM RUN
    def run(self, item: _Item) -> None:
        """Execute one item; keep the first error for the next sync. Its buffers are let go of once it has
        run (frees waiting on them go through); with ``OPENREG_MEMCHECK`` their views are open only meanwhile.
        """
        started = time.perf_counter_ns()
        running, activity.running.kernel = activity.running.kernel, (item.name, self.device, self.id)
        try:
            if memcheck.enabled:
                memcheck.before(item.spans)
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
            activity.running.kernel = running  # (a kernel run inside another's wait restores the outer one)
            if memcheck.enabled:
                memcheck.after(item.spans)
            activity.record(self.device, started, time.perf_counter_ns(), item.name)
            if _observers:
                self._observe(item, started)
        if item.spans:
            memory.release(item.spans)
        with self.lock:
            self.busy = False
            self.done = item.seq
            if self.waiters:
                self.cond.notify_all()

    def fail(self, name: str, exc: BaseException, site: str | None = None) -> None:
        """Keep the failure of kernel ``name`` for the next synchronizing call (the first one not yet reported)."""
        if self.error is None:
            self.error = launch_failure(
                f"{name} on openreg:{self.device} stream {self.id} failed: {type(exc).__name__}: {exc}"
                + (f" (launched at {site})" if site else ""), exc
            )

    def _observe(self, item: _Item, started: int) -> None:
        ended = time.perf_counter_ns()
        for observer, tagged in _observers:
            try:
                if tagged:
                    observer(item.name, self.device, self.id, started, ended, item.tag)
                else:
                    observer(item.name, self.device, self.id, started, ended)
            except Exception:  # noqa: BLE001 - a broken observer must not wedge the stream
                print(f"openreg: launch observer {observer!r} failed after {item.name}:", file=sys.stderr)
                traceback.print_exc()

    def _settled(self) -> bool:
        """With the lock held: True if all work is done."""
        return self.done >= self.launched and not self.busy
    # LITERALINCLUDE END: STREAM RUN

    # LITERALINCLUDE START: STREAM WAIT
    def wait_for(self, seq: int, settle: bool = True, simulated: bool = True) -> None:
        """Block until launch ``seq`` has finished, running queued work here when the worker is idle.

        ``settle``: the host waits (a graph capture refuses it, the timing model moves the host's clock);
        a wait queued on another stream (``Stream.wait_event``) does not.
        """
        if forked():
            start()  # raises: the workers did not survive the fork
        if settle and self.capture is not None:
            self.capture.refuse(self, "a host wait")  # a capture cannot wait (openreg.graph)
        if timing.active and settle and simulated:  # the timing model: the host is at that launch's end now
            timing.host_waits(self.device, self.id, seq)
        scope = None  # the kernel context, entered once this host runs an item itself
        lock = self.lock  # the conditions' lock, taken directly: cheaper than entering a Condition
        me = 0
        try:
            while True:
                with lock:
                    if self.done >= seq:
                        return
                    items = self.items
                    if not self.busy and items:
                        owner = items[0].owner
                        if owner and owner != (me or (me := threading.get_ident())):
                            owner = -1  # an item for run_here runs on the thread that asked for it
                    else:
                        owner = -1
                    if owner == -1:
                        self._wait()
                        continue
                    item = self._take()
                if scope is None:
                    scope = _kernel_context()
                    scope.__enter__()
                self.run(item)
        finally:
            if scope is not None:
                scope.__exit__(None, None, None)

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


class Stream:
    """An in-order work queue on one device (``cudaStream_t``)."""

    _ids = [itertools.count(1) for _ in range(device_count())]

    def __init__(self, device: int | None = None, priority: int = PRIORITY_LOW, *, _id: int | None = None) -> None:
        self.device = check_device(get_device() if device is None else device)
        if not PRIORITY_HIGH <= priority <= PRIORITY_LOW:
            raise OpenRegError(
                ErrorCode.INVALID_VALUE,
                f"stream priority {priority} is outside [{PRIORITY_HIGH}, {PRIORITY_LOW}]",
            )
        self.priority = priority
        self.id = next(Stream._ids[self.device]) if _id is None else _id
        self._q = _Queue(self.device, self.id)
        self._q.priority = priority
        weakref.finalize(self, self._q.close)
        with _registry_lock:
            _streams[(self.device, self.id)] = self
            _queues[(self.device, self.id)] = self._q
            _device_queues.pop(self.device, None)  # drain() lists the device's queues afresh

    def __repr__(self) -> str:
        return f"openreg.Stream(device={self.device}, id={self.id}, priority={self.priority})"

    # LITERALINCLUDE START: STREAM LAUNCH
    def launch(self, fn: Callable[..., Any], *args: Any, buffers: tuple | list = (), name: str = "kernel",
               writes: tuple | list | None = None, cost: timing.Cost | None = None) -> int:
        """Queue ``fn(*args)``; ``buffers`` are what it may touch: pointers or ``(pointer, nbytes)`` extents.

        Returns the launch's sequence number on this stream. The buffers are pinned
        at once (a free before the work ends is deferred); ``fn`` reaches them through
        their views (``openreg.memory.view_address``), never through the device pointers.
        ``writes`` names those it writes, for the stream sanitizer (None: any of them).
        ``cost`` (FLOPs, bytes, kind) is what the timing model prices, when simulated time is on.
        """
        start()
        q = self._q
        if q.capture is not None:  # a graph capture records the launch instead (openreg.graph)
            capture = q.capture
            seq = capture.record(q, fn, args, buffers, name, writes)
            if seq is not None:
                if timing.pricing:  # the timing model: the recorded kernel keeps its cost for the replays
                    timing.captured(capture.graph, name, cost)
                return seq
        spans = memory.acquire(buffers) if buffers else []  # (first: the sanitizer records no refused launch)
        if sanitizer.enabled:  # the stream sanitizer (openreg/sanitizer.py): a launch that races raises here
            race = sanitizer.launch(q, buffers, writes, name, fn, args)
            if race is not None:
                memory.release(spans)
                fn = args = None  # this frame stays in the traceback: not with the kernel's arguments
                raise race
        tag = _launch_hook(name, self.device, self.id) if _launch_hook is not None else None
        with q.lock:  # the conditions' lock, taken directly: cheaper than entering a Condition
            q.launched += 1
            seq = q.launched
            q.items.append(_Item(fn, args, spans, name, seq, tag))
            q.last_launch = time.monotonic()
            if q.worker is None:
                q.worker = threading.Thread(target=q.serve, name=f"openreg:{q.device} stream {q.id}", daemon=True)
                q.worker.start()
            if q.idle:
                q.wake.notify()
        if timing.active:  # the timing model: this launch's simulated start and end (openreg/timing)
            timing.launched(self, seq, name, cost, tag, buffers)
        if LAUNCH_BLOCKING:  # a debugging setting's wait, not the program's: neither simulated time nor the
            q.wait_for(q.launched, simulated=False)  # stream sanitizer counts it
            self.check_error()
        return seq
    # LITERALINCLUDE END: STREAM LAUNCH

    # LITERALINCLUDE START: STREAM RUN HERE
    def run_here(self, fn: Callable[..., Any], *args: Any, buffers: tuple | list = (), name: str = "kernel",
                 writes: tuple | list | None = None, host_sync: bool = True, cost: timing.Cost | None = None) -> Any:
        """Launch ``fn(*args)`` and run it on the calling thread, in stream order: a launch followed by a
        synchronize, where the caller runs the kernel itself. Returns ``fn``'s result; an earlier kernel's
        error is reported first (LAUNCH_FAILURE), then ``fn``'s own exception is raised as it is, and
        its warnings are the caller's: what a host-side check in a CUDA operator gives at the call.
        ``writes`` as for :meth:`launch`; ``host_sync=False`` says the host runs it here for reasons of its
        own, not to wait for the device (a CUDA program would not): the sanitizer does not count the wait.
        """
        start()
        q = self._q
        self.refuse_in_capture(name)
        spans = memory.acquire(buffers) if buffers else []  # (first: the sanitizer records no refused launch)
        if sanitizer.enabled:  # the stream sanitizer: a launch that races raises here
            race = sanitizer.launch(q, buffers, writes, name, fn, args, host=host_sync)
            if race is not None:
                memory.release(spans)
                fn = args = None  # this frame stays in the traceback: not with the kernel's arguments
                raise race
        tag = _launch_hook(name, self.device, self.id) if _launch_hook is not None else None
        item = _Item(fn, args, spans, name, 0, tag)
        item.owner = threading.get_ident()
        with q.lock:
            q.launched += 1
            item.seq = q.launched
            q.items.append(item)
            q.last_launch = time.monotonic()
        simulated = True  # whether the timing model's host waits too (not for a simulator-only check)
        if timing.active:  # the timing model: this launch's simulated start and end (openreg/timing)
            simulated = timing.launched(self, item.seq, name, cost, tag, buffers)
        try:
            q.wait_for(item.seq, simulated=simulated)
        finally:
            if item.outcome is None:  # interrupted (KeyboardInterrupt) before it ran: an ordinary launch now
                with q.lock:
                    item.owner = 0
        if host_sync and sanitizer.enabled:
            sanitizer.host_waits(q, item.seq)
        self.check_error()
        ok, value = item.outcome
        if not ok:
            item.outcome = None
            raise value
        return value
    # LITERALINCLUDE END: STREAM RUN HERE

    def transfer(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a copy engine's transfer ``fn(*args)`` now, on the calling thread (the caller has waited for
        the stream's earlier work): no kernel, but profilers and utilization see it as this stream's
        activity, as CUPTI reports a ``cudaMemcpy``."""
        tag = _launch_hook(name, self.device, self.id) if _launch_hook is not None else None
        started = time.perf_counter_ns()
        try:
            return fn(*args)
        finally:
            activity.record(self.device, started, time.perf_counter_ns(), name)
            if _observers:
                self._q._observe(_Item(fn, args, [], name, 0, tag), started)

    def refuse_in_capture(self, name: str) -> None:
        """Work the host runs now (a kernel run here, a synchronous copy) cannot be captured
        (``cudaErrorStreamCaptureUnsupported``): refused under the caller's name (openreg.graph)."""
        if self._q.capture is not None:
            self._q.capture.refuse(self._q, f"{name}, a synchronous call,")

    def wait_for(self, seq: int) -> None:
        """Block until launch number ``seq`` on this stream has finished."""
        self._q.wait_for(seq)
        if sanitizer.enabled:
            sanitizer.host_waits(self._q, seq)

    def synchronize(self) -> None:
        """Wait for all work launched so far, then report a kernel error if one happened."""
        self.wait_for(self._q.launched)
        self.check_error()

    def check_error(self) -> None:
        """Raise (once) the error of a kernel that failed since the last report."""
        _report(self._q)

    def report_failure(self, name: str, exc: BaseException) -> None:
        """Report ``exc`` at this stream's next synchronizing call, as the failure of a kernel ``name`` launched here.

        For work that runs elsewhere on this stream's behalf: a collective library runs each collective on
        a stream of its own, and a collective that fails is reported to the stream it was launched from.
        """
        with self._q.lock:
            self._q.fail(name, exc)

    def query(self) -> bool:
        """True if all launched work has finished."""
        if self._q.capture is not None:
            self._q.capture.refuse(self._q, "a stream query")
        seq = self._q.launched
        done = self._q.settle()
        if done and sanitizer.enabled:  # a host that saw the work finish is ordered after it
            sanitizer.host_waits(self._q, seq)
        return done

    @property
    def launched(self) -> int:
        """Sequence number of the last launch (what an event recorded now would wait for)."""
        return self._q.launched

    def wait_event(self, event: Event) -> None:  # noqa: F821 - defined in event.py
        """Make later work on this stream wait for ``event`` (``cudaStreamWaitEvent``)."""
        capture = self._q.capture or event.capture
        if capture is not None and capture.wait_event(self._q, event):
            return  # a fork or join of a graph capture (openreg.graph)
        if sanitizer.enabled:  # ordered even when the event's work is done already: CUDA promises no less
            sanitizer.stream_waits(self._q, event._clock)
        if timing.active:  # the timing model: this stream's simulated time catches up with the event's
            timing.stream_waits(self, event._sim_time)
        target = event.pending()
        if target is None:
            return  # never recorded or already complete: nothing to wait for
        queue, seq = target
        if queue is self._q:
            return  # in-order already
        self.launch(_wait_event, queue, seq, name="wait_event", cost=timing.FREE)


def _wait_event(queue: _Queue, seq: int) -> None:
    """A stream's wait for another's launch ``seq``: it holds no execution slot while it waits."""
    with slots.released():
        queue.wait_for(seq, False)


def _report(q: _Queue) -> None:
    error, q.error = q.error, None
    if error is not None:
        raise error


_streams: weakref.WeakValueDictionary[tuple[int, int], Stream] = weakref.WeakValueDictionary()
_queues: weakref.WeakValueDictionary[tuple[int, int], _Queue] = weakref.WeakValueDictionary()
# Per device, references to its queues as of the last stream created there: every synchronize walks
# them, and walking the weak dictionary itself cost more than the rest of an idle synchronize.
_device_queues: dict[int, list[weakref.ref]] = {}
_registry_lock = threading.Lock()
_observers: list[tuple[Callable[..., None], bool]] = []  # (observer, whether it gets the launch's tag)
_launch_hook: Callable[[str, int, int], Any] | None = None
_default: dict[int, Stream] = {}


class _Local(threading.local):
    """Per-thread current streams; the class default spares threads that never set one an
    ``AttributeError`` raised and caught inside ``getattr`` on every look-up."""

    streams: dict[int, Stream] | None = None


_local = _Local()
_default_lock = threading.Lock()


def default_stream(device: int | None = None) -> Stream:
    """The device's default stream (id 0), created on first use."""
    device = check_device(get_device() if device is None else device)
    stream = _default.get(device)
    if stream is None:
        with _default_lock:
            stream = _default.get(device)
            if stream is None:
                stream = _default[device] = Stream(device, _id=0)
    return stream


def current_stream(device: int | None = None) -> Stream:
    """The calling thread's current stream on ``device`` (the default stream until set).

    Every launch and allocation asks for it: the common answers come from two dictionary
    look-ups; only an unknown device (checked, raising INVALID_DEVICE) or a first use takes the
    long way.
    """
    if device is None:
        device = get_device()
    elif type(device) is not int:
        device = check_device(device)
    current = _local.streams
    if current is not None:
        stream = current.get(device)
        if stream is not None:
            return stream
    stream = _default.get(device)
    return stream if stream is not None else default_stream(device)


def set_stream(stream: Stream) -> Stream:
    """Make ``stream`` current on its device for this thread; returns the previous one."""
    previous = current_stream(stream.device)
    current = _local.streams
    if current is None:
        current = _local.streams = {}
    current[stream.device] = stream
    return previous


def get_stream(device: int, stream_id: int) -> Stream:
    """Look a live stream up by its id (how the torch bridge names streams)."""
    check_device(device)
    if stream_id == 0:
        return default_stream(device)
    stream = _streams.get((device, stream_id))
    if stream is None:
        raise OpenRegError(ErrorCode.INVALID_HANDLE, f"no live stream {stream_id} on openreg:{device}")
    return stream


def synchronize(device: int | None = None) -> None:
    """Wait for every stream of ``device`` (``cudaDeviceSynchronize``), then report errors."""
    for q in drain(device):
        _report(q)


def drain(device: int | None = None) -> list[_Queue]:
    """Wait for every stream of ``device``, so that frees waiting for its work go through; kernel errors
    stay for the next synchronizing call. An allocator that
    must make room (as ``cudaFree`` synchronizes the device) calls this."""
    device = check_device(get_device() if device is None else device)
    refs = _device_queues.get(device)
    if refs is None:
        with _registry_lock:
            refs = _device_queues[device] = [weakref.ref(q) for (d, _), q in list(_queues.items()) if d == device]
    queues = [q for q in (ref() for ref in refs) if q is not None]
    # LITERALINCLUDE START: DRAIN SIDE BY SIDE
    # The host runs the first busy queue itself; the other busy streams' workers start at once, beside it (a
    # copy on one stream overlaps a kernel on another), instead of after the host's pause (_IDLE).
    busy = [q for q in queues if q.items]
    for q in busy[1:]:
        q.hurry()
    # LITERALINCLUDE END: DRAIN SIDE BY SIDE
    for q in queues:
        seq = q.launched
        q.wait_for(seq)
        if sanitizer.enabled:
            sanitizer.host_waits(q, seq)
    return queues


# LITERALINCLUDE START: LAUNCH HOOK
def add_launch_observer(fn: Callable[..., None], tagged: bool = False) -> None:
    """Call ``fn(name, device, stream_id, start_ns, end_ns)`` after every launch (profilers), on the
    thread that ran it; with ``tagged``, also the launch's tag (``fn(..., end_ns, tag)``)."""
    _observers.append((fn, tagged))


def remove_launch_observer(fn: Callable[..., None]) -> None:
    """Stop calling an observer added with :func:`add_launch_observer`."""
    for i, (observer, _) in enumerate(_observers):
        if observer == fn:
            del _observers[i]
            return
    raise ValueError(f"{fn!r} is not a launch observer")


def set_launch_hook(fn: Callable[[str, int, int], Any] | None) -> Callable[[str, int, int], Any] | None:
    """Call ``fn(name, device, stream_id)`` at every launch, on the launching thread, before the work is
    queued; what it returns is the launch's *tag*, handed to tagged observers when the work has run
    (CUPTI's callback API and its correlation ids). A tag with a ``launch_site`` attribute names where
    the launch came from: a kernel failure's message ends with it. Returns the previous hook; ``None``
    removes it. One hook per process: a client that wants several composes them."""
    global _launch_hook
    previous, _launch_hook = _launch_hook, fn
    return previous
# LITERALINCLUDE END: LAUNCH HOOK
