"""Streams: in-order queues of work, each run by its own worker thread (``openreg/worker.py``).

Work on one stream runs in launch order; work on different streams may overlap.
A launch returns at once. A kernel that raises does not raise at its launch: the
error is kept and reported by the next synchronizing call on that stream or its
device, the way a real device reports asynchronous faults.
``OPENREG_LAUNCH_BLOCKING=1`` makes every launch wait for its work, so errors
surface at the call that caused them (``openreg/launch_blocking.py``).

This module is the API: the stream, the registry of live streams, the current and
default streams, device synchronize, launch observers. The optional features on the
launch path (graph capture, the stream sanitizer, the timing model, profiler tags,
launch blocking, memcheck) are launch hooks (``openreg/hooks.py``).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any

from . import activity, hooks, slots, timing
from .device import check_device, device_count, get_device, start
from .errors import ErrorCode, OpenRegError
from .worker import PRIORITY_HIGH, PRIORITY_LOW, _Item, _Queue, report, set_kernel_context

__all__ = [
    "PRIORITY_HIGH", "PRIORITY_LOW", "Stream", "add_launch_observer", "current_stream",
    "default_stream", "drain", "get_stream", "remove_launch_observer", "set_kernel_context", "set_launch_hook",
    "set_stream", "synchronize",
]


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
               writes: tuple | list | None = None, cost: timing.Cost | Callable | None = None) -> int:
        """Queue ``fn(*args)``; ``buffers`` are what it may touch: pointers or ``(pointer, nbytes)`` extents.

        Returns the launch's sequence number on this stream. The buffers are pinned
        at once (a free before the work ends is deferred); ``fn`` reaches them through
        their views (``openreg.memory.view_address``), never through the device pointers.
        ``writes`` names those it writes, for the stream sanitizer (None: any of them).
        ``cost`` (FLOPs, bytes, kind; or a function that returns it, called only while simulated time
        is on) is what the timing model prices.
        """
        start()
        if hooks.take:  # a graph capture records the launch instead (openreg/graph.py)
            for hook in hooks.take:
                seq = hook(self._q, fn, args, buffers, name, writes, cost)
                if seq is not None:
                    return seq
        try:
            item = self._q.enqueue(fn, args, buffers, name, writes)
        except BaseException:
            fn = args = None  # this frame stays in the traceback: not with the kernel's arguments
            raise
        if hooks.queued:  # the timing model prices it; launch blocking waits for it
            for hook in hooks.queued:
                hook(self, item, buffers, cost)
        return item.seq
    # LITERALINCLUDE END: STREAM LAUNCH

    # LITERALINCLUDE START: STREAM RUN HERE
    def run_here(self, fn: Callable[..., Any], *args: Any, buffers: tuple | list = (), name: str = "kernel",
                 writes: tuple | list | None = None, host_sync: bool = True,
                 cost: timing.Cost | Callable | None = None) -> Any:
        """Launch ``fn(*args)`` and run it on the calling thread, in stream order: a launch followed by a
        synchronize, where the caller runs the kernel itself. Returns ``fn``'s result; an earlier kernel's
        error is reported first (LAUNCH_FAILURE), then ``fn``'s own exception is raised as it is, and
        its warnings are the caller's: what a host-side check in a CUDA operator gives at the call.
        ``writes`` as for :meth:`launch`; ``host_sync=False`` says the host runs it here for reasons of its
        own, not to wait for the device (a CUDA program would not): the sanitizer does not count the wait.
        """
        start()
        q = self._q
        if hooks.unrecordable:
            self.refuse_in_capture(name)
        try:
            item = q.enqueue(fn, args, buffers, name, writes, threading.get_ident(), host_sync)
        except BaseException:
            fn = args = None  # this frame stays in the traceback: not with the kernel's arguments
            raise
        if hooks.queued:
            for hook in hooks.queued:
                hook(self, item, buffers, cost)
        try:
            q.wait_for(item.seq)
        finally:
            if item.outcome is None:  # interrupted (KeyboardInterrupt) before it ran: an ordinary launch now
                with q.lock:
                    item.owner = 0
        if host_sync and hooks.host_waited:
            for hook in hooks.host_waited:
                hook(q, item.seq)
        if q.error is not None:
            report(q)
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
        item = None
        if hooks.check or hooks.ran:  # the profiler's tag and observers (a transfer names no buffers to check)
            item = _Item(fn, args, [], name, 0)
            for hook in hooks.check:
                hook(self._q, item, (), (), True)
        started = time.perf_counter_ns()
        try:
            return fn(*args)
        finally:
            activity.record(self.device, started, time.perf_counter_ns(), name)
            if item is not None:
                for hook in hooks.ran:
                    hook(self._q, item, started)

    def refuse_in_capture(self, name: str) -> None:
        """Work the host runs now (a kernel run here, a synchronous copy) cannot be captured
        (``cudaErrorStreamCaptureUnsupported``): refused under the caller's name (openreg.graph)."""
        if hooks.unrecordable:
            for hook in hooks.unrecordable:
                hook(self._q, f"{name}, a synchronous call,")

    def wait_for(self, seq: int) -> None:
        """Block until launch number ``seq`` on this stream has finished."""
        self._q.wait_for(seq)
        if hooks.host_waited:
            for hook in hooks.host_waited:
                hook(self._q, seq)

    def synchronize(self) -> None:
        """Wait for all work launched so far, then report a kernel error if one happened."""
        q = self._q  # (wait_for and check_error, inline: every .item() and .cpu() passes here)
        seq = q.launched
        q.wait_for(seq)
        if hooks.host_waited:
            for hook in hooks.host_waited:
                hook(q, seq)
        if q.error is not None:
            report(q)

    def check_error(self) -> None:
        """Raise (once) the error of a kernel that failed since the last report."""
        report(self._q)

    def report_failure(self, name: str, exc: BaseException) -> None:
        """Report ``exc`` at this stream's next synchronizing call, as the failure of a kernel ``name`` launched here.

        For work that runs elsewhere on this stream's behalf: a collective library runs each collective on
        a stream of its own, and a collective that fails is reported to the stream it was launched from.
        """
        with self._q.lock:
            self._q.fail(name, exc)

    def query(self) -> bool:
        """True if all launched work has finished."""
        q = self._q
        if hooks.unrecordable:
            for hook in hooks.unrecordable:
                hook(q, "a stream query")
        seq = q.launched
        done = q.settle()
        if done and hooks.host_waited:  # a host that saw the work finish is ordered after it
            for hook in hooks.host_waited:
                hook(q, seq)
        return done

    @property
    def launched(self) -> int:
        """Sequence number of the last launch (what an event recorded now would wait for)."""
        return self._q.launched

    def wait_event(self, event: Event) -> None:  # noqa: F821 - defined in event.py
        """Make later work on this stream wait for ``event`` (``cudaStreamWaitEvent``)."""
        for hook in hooks.stream_wait:  # a capture's fork or join; the sanitizer's and timing model's ordering
            if hook(self, event):
                return
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


_streams: weakref.WeakValueDictionary[tuple[int, int], Stream] = weakref.WeakValueDictionary()
_queues: weakref.WeakValueDictionary[tuple[int, int], _Queue] = weakref.WeakValueDictionary()
# Per device, references to its queues as of the last stream created there: every synchronize walks
# them without walking the weak dictionary itself, which costs more than the rest of an idle synchronize.
_device_queues: dict[int, list[weakref.ref]] = {}
_registry_lock = threading.Lock()
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
    if _current_listener is not None:
        _current_listener(stream.device, stream.id)
    return previous


# LITERALINCLUDE START: CURRENT STREAM LISTENER
# Told of every change of a thread's current stream, on that thread: (device, stream id). A client that keeps
# its own copy of the current streams (the torch bridge's device guard) stays exact without asking.
_current_listener: Callable[[int, int], None] | None = None


def set_current_listener(fn: Callable[[int, int], None] | None) -> None:
    """Make ``fn(device, stream_id)`` hear of each thread's current-stream changes (None: nobody)."""
    global _current_listener
    _current_listener = fn
# LITERALINCLUDE END: CURRENT STREAM LISTENER


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
        report(q)


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
        for hook in hooks.host_waited:
            hook(q, seq)
    return queues


# LITERALINCLUDE START: LAUNCH HOOK
class _Observers(hooks.LaunchHook):
    """The launch observers (profilers), called after each launch has run: a launch hook while there are any."""

    order = 60

    def __init__(self) -> None:
        self.observers: list[tuple[Callable[..., None], bool]] = []  # (observer, whether it gets the launch's tag)

    def ran(self, q: _Queue, item: _Item, started: int) -> None:
        ended = time.perf_counter_ns()
        for observer, tagged in self.observers:
            try:
                if tagged:
                    observer(item.name, q.device, q.id, started, ended, item.tag)
                else:
                    observer(item.name, q.device, q.id, started, ended)
            except Exception:  # noqa: BLE001 - a broken observer must not wedge the stream
                print(f"openreg: launch observer {observer!r} failed after {item.name}:", file=sys.stderr)
                traceback.print_exc()


class _Tagger(hooks.LaunchHook):
    """The profiler's launch hook (:func:`set_launch_hook`): what it returns becomes the launch's tag."""

    order = 20  # after the sanitizer: a launch it refuses gets no tag

    def __init__(self, fn: Callable[[str, int, int], Any]) -> None:
        self.fn = fn

    def check(self, q: _Queue, item: _Item, buffers: Any, writes: Any, host: bool) -> None:
        item.tag = self.fn(item.name, q.device, q.id)


_observing = _Observers()
_observers = _observing.observers
_tagger: _Tagger | None = None


def add_launch_observer(fn: Callable[..., None], tagged: bool = False) -> None:
    """Call ``fn(name, device, stream_id, start_ns, end_ns)`` after every launch (profilers), on the
    thread that ran it; with ``tagged``, also the launch's tag (``fn(..., end_ns, tag)``)."""
    _observers.append((fn, tagged))
    hooks.add(_observing)


def remove_launch_observer(fn: Callable[..., None]) -> None:
    """Stop calling an observer added with :func:`add_launch_observer`."""
    for i, (observer, _) in enumerate(_observers):
        if observer == fn:
            del _observers[i]
            if not _observers:
                hooks.remove(_observing)
            return
    raise ValueError(f"{fn!r} is not a launch observer")


def set_launch_hook(fn: Callable[[str, int, int], Any] | None) -> Callable[[str, int, int], Any] | None:
    """Call ``fn(name, device, stream_id)`` at every launch, on the launching thread, before the work is
    queued; what it returns is the launch's *tag*, handed to tagged observers when the work has run
    (CUPTI's callback API and its correlation ids). A tag with a ``launch_site`` attribute names where
    the launch came from: a kernel failure's message ends with it. Returns the previous hook; ``None``
    removes it. One hook per process: a client that wants several composes them."""
    global _tagger
    previous = _tagger.fn if _tagger is not None else None
    if _tagger is not None:
        hooks.remove(_tagger)
    _tagger = _Tagger(fn) if fn is not None else None
    if _tagger is not None:
        hooks.add(_tagger)
    return previous
# LITERALINCLUDE END: LAUNCH HOOK
