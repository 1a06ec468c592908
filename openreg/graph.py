"""Device graphs: a stream in capture mode records its launches; a graph replays the recording.

This is CUDA's stream capture for the simulated device:

==================================  ======================================
CUDA runtime                        openreg
==================================  ======================================
``cudaStreamBeginCapture(s, mode)``  ``begin_capture(stream, mode)``
``cudaStreamEndCapture(s, &g)``      ``end_capture(stream) -> Graph``
``cudaStreamIsCapturing(s)``         ``is_capturing(stream)``
``cudaGraphInstantiate``             ``Graph.instantiate()``
``cudaGraphLaunch(exec, s)``         ``Graph.launch(stream)``
``cudaGraphDestroy``                 ``Graph.release()``
``cudaGraphDebugDotPrint``           ``Graph.dot()``
==================================  ======================================

While a stream captures, ``Stream.launch`` hands its kernel, arguments and buffers to the capture,
which appends them to the graph: nothing is queued and nothing runs. A launch is a Python callable
with its arguments, so whatever the launching code worked out on the host before launching is fixed
in the recording, as a CUDA kernel's arguments are fixed in its graph node. Replay queues one item
that runs the recorded kernels in capture order with the union of their buffers open: one launch for
the whole graph.

A capture refuses what cannot be recorded, as CUDA does, and is then invalidated (its end raises):
a host wait on a capturing stream (synchronize, a copy to pageable memory, a kernel that must run on
the host now), a query or wait on an event recorded into the capture, and, in the ``global`` and
``thread_local`` modes, work on a default stream (CUDA's legacy stream cannot be used during a
capture either). Other streams join a capture by waiting on an event recorded in it (fork) and must
be waited on by the capturing stream before the capture ends (join).
"""

from __future__ import annotations

import enum
import threading
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

from . import hooks, memory, timing
from .device import device_count
from .errors import ErrorCode, OpenRegError
from .stream import Stream, _Queue, default_stream


class CaptureMode(enum.Enum):
    """``cudaStreamCaptureMode``: which threads may not use a default stream while a capture is underway."""

    GLOBAL = "global"  # no thread may
    THREAD_LOCAL = "thread_local"  # the capturing thread may not
    RELAXED = "relaxed"  # every thread may


class Node:
    """One recorded launch: the kernel, its arguments and buffers (and those it writes, for the stream
    sanitizer; None: any of them), and the nodes it must follow."""

    __slots__ = ("fn", "args", "buffers", "name", "stream", "after", "writes", "cost")

    def __init__(self, fn: Callable[..., Any], args: tuple, buffers: tuple, name: str, stream: int,
                 after: tuple[int, ...], writes: tuple | None = None) -> None:
        self.fn, self.args, self.buffers, self.name, self.stream, self.after = fn, args, buffers, name, stream, after
        self.writes = writes
        self.cost = None  # the launch's cost, for the timing model (set by the launch site's pricing)


# LITERALINCLUDE START: RUNTIME GRAPH
class Graph:
    """Launches recorded on one device (``cudaGraph_t``), and their executable form (``cudaGraphExec_t``).

    The graph pins the memory its kernels name (as a queued launch does), so that a freed allocation
    cannot be released and its address handed out again while the graph could still write there; a
    launch of a graph whose memory was freed raises instead.
    """

    def __init__(self, device: int) -> None:
        self.device = device
        self.nodes: list[Node] = []
        self._pins: list = []  # spans of every node, pinned until release()
        self._unpin = weakref.finalize(self, _release_pins, self._pins)
        self._exec: tuple | None = None  # (kernels, names, buffers, allocations, writes): see instantiate
        self.released = False

    def instantiate(self) -> None:
        """Freeze the recording into what a launch needs: the kernels in order and their buffers, once each."""
        self._check()
        kernels = tuple((node.fn, node.args) for node in self.nodes)
        names = tuple(node.name for node in self.nodes)
        buffers = list(dict.fromkeys(b for node in self.nodes for b in node.buffers))
        # what the replay writes, for the stream sanitizer: every node's writes (all its buffers if not known)
        writes = list(dict.fromkeys(b for node in self.nodes
                                    for b in (node.buffers if node.writes is None else node.writes)))
        allocations = tuple({id(alloc): alloc for alloc, _, _ in self._pins}.values())
        self._exec = (kernels, names, buffers, allocations, writes)

    def launch(self, stream: Stream) -> int:
        """Queue the whole graph on ``stream`` as one item (``cudaGraphLaunch``); returns its sequence number."""
        self._check()
        if stream.device != self.device:
            raise OpenRegError(
                ErrorCode.INVALID_DEVICE,
                f"a graph captured on openreg:{self.device} cannot be launched on a stream of openreg:{stream.device}: "
                "its kernels name that device's memory",
            )
        if self._exec is None:
            self.instantiate()
        kernels, names, buffers, allocations, writes = self._exec
        for alloc in allocations:
            if alloc.free_pending:
                raise OpenRegError(
                    ErrorCode.INVALID_POINTER,
                    f"graph launch on openreg:{self.device}: the allocation at 0x{alloc.ptr:x} ({alloc.size} bytes), "
                    "which captured kernels use, was freed",
                )
        costs = [node.cost for node in self.nodes]  # priced only while simulated time is on
        return stream.launch(_replay, kernels, names, buffers=buffers, writes=writes,
                             name=f"graph ({len(kernels)} kernels)", cost=lambda: timing.graph_cost(costs))

    def release(self) -> None:
        """Drop the recording and unpin its memory (``cudaGraphDestroy``); launching it afterwards raises."""
        self.released = True
        self.nodes, self._exec = [], None
        self._unpin()

    def _check(self) -> None:
        if self.released:
            raise OpenRegError(ErrorCode.INVALID_HANDLE, "the graph was released (reset); capture a new one")
# LITERALINCLUDE END: RUNTIME GRAPH

    def dot(self) -> str:
        """The graph in Graphviz DOT: one node per kernel (its name and stream), edges for its dependencies."""
        lines = ["digraph openreg_graph {", f'  label="openreg:{self.device}, {len(self.nodes)} kernels";']
        for i, node in enumerate(self.nodes):
            label = f"{i}: {node.name}\\nstream {node.stream}".replace('"', "'")
            lines.append(f'  n{i} [label="{label}"];')
            lines.extend(f"  n{j} -> n{i};" for j in node.after)
        lines.append("}")
        return "\n".join(lines) + "\n"


# LITERALINCLUDE START: RUNTIME REPLAY
def _replay(kernels: tuple, names: tuple) -> None:
    """The item a graph launch queues: every recorded kernel, in capture order (a topological order of the
    graph, since a launch can only depend on work launched before it)."""
    i = 0
    try:
        for fn, args in kernels:
            fn(*args)
            i += 1
    except BaseException as exc:
        if hasattr(exc, "add_note"):
            exc.add_note(f"openreg graph replay: kernel {i} of {len(kernels)}, {names[i]}")
        raise
# LITERALINCLUDE END: RUNTIME REPLAY


def _release_pins(pins: list) -> None:
    spans = pins[:]
    pins.clear()
    if spans:
        memory.release(spans)


class _Member:
    """A stream taking part in a capture: what its next node follows and how far its work reaches."""

    __slots__ = ("tail", "waits", "mark", "reach")

    def __init__(self, mark: int) -> None:
        self.tail = -1  # index of its last node
        self.waits: list[int] = []  # nodes its next node must follow (events it waited on)
        self.mark = mark  # the graph's length after its last node (or when it joined)
        self.reach: dict[_Queue, int] = {}  # per stream: how much of that stream's work its own work follows


# LITERALINCLUDE START: RUNTIME CAPTURE
class Capture:
    """A capture underway: the graph it records into, the streams taking part, and why it failed, if it did."""

    def __init__(self, stream: Stream, mode: CaptureMode) -> None:
        self.origin, self.device, self.mode = stream._q, stream.device, mode
        self.thread = threading.get_ident()
        self.graph = Graph(stream.device)
        self.members: dict[_Queue, _Member] = {self.origin: _Member(0)}
        self.error: str | None = None  # set by the first thing the capture refused: it is invalidated
        self.ended = False

    def record(self, q: _Queue, fn: Callable[..., Any], args: tuple, buffers: tuple | list, name: str,
               writes: tuple | list | None = None) -> int:
        """``Stream.launch`` on a capturing stream: append the launch to the graph instead of queueing it."""
        if self.error is not None:
            raise OpenRegError(ErrorCode.STREAM_CAPTURE_INVALIDATED,
                               f"launch of {name} into an invalidated graph capture: {self.error}")
        spans = memory.acquire(buffers) if buffers else []
        graph, member = self.graph, self.members[q]
        index = len(graph.nodes)
        after = ((member.tail,) if member.tail >= 0 else ()) + tuple(member.waits)
        graph.nodes.append(Node(fn, args, tuple(buffers), name, q.id, after, None if writes is None else tuple(writes)))
        graph._pins.extend(spans)
        member.tail, member.waits, member.mark = index, [], index + 1
        return q.launched

    def refuse(self, q: _Queue, what: str, code: ErrorCode = ErrorCode.STREAM_CAPTURE_UNSUPPORTED) -> NoReturn:
        """Raise for something a capture cannot record, and invalidate the capture (as CUDA does)."""
        message = (f"{what} on openreg:{q.device} stream {q.id} during a graph capture: a capture records launches "
                   "and cannot wait for the device or run anything on the host")
        self.invalidate(message)
        raise OpenRegError(code, message + " (the capture is invalidated; end it and capture again without this)")

    def invalidate(self, message: str) -> None:
        if self.error is None:
            self.error = message

    def record_event(self, event: Any, q: _Queue) -> bool:
        """``Event.record`` on a capturing stream: the event marks a point of the capture, for other streams."""
        member = self.members[q]
        event.capture, event.point = self, ({**member.reach, q: member.mark}, member.tail)
        return True

    def wait_event(self, q: _Queue, event: Any) -> bool:
        """``Stream.wait_event`` where the stream or the event takes part in a capture (fork and join)."""
        owner = event.capture
        if owner is None:  # a capturing stream waits on work outside the capture
            if event.pending() is None:
                return True  # done already: nothing to wait for
            self.refuse(q, "waiting on an event recorded outside the capture", ErrorCode.STREAM_CAPTURE_ISOLATION)
        if owner.ended:
            return True  # a capture's event, after the capture: never reached on a real stream
        if owner is not self:
            if q in self.members:
                self.refuse(q, "waiting on an event recorded into another capture", ErrorCode.STREAM_CAPTURE_MERGE)
            return owner.wait_event(q, event)
        member = self.members.get(q)
        if member is None:  # fork: the stream joins the capture
            if q.capture is not None:
                what = ("a default stream joining the capture" if q.capture is _guard
                        else "a stream of another capture joining this one")
                self.refuse(q, what, ErrorCode.STREAM_CAPTURE_MERGE)
            member = self.members[q] = _Member(len(self.graph.nodes))
            q.capture = self
        reach, tail = event.point
        for other, mark in reach.items():
            if member.reach.get(other, -1) < mark:
                member.reach[other] = mark
        if tail >= 0:
            member.waits.append(tail)
        return True

    def event_done(self, event: Any, what: str) -> bool:
        """``Event.query``/``synchronize`` of an event recorded into a capture: refused while it is underway."""
        if not self.ended:
            self.refuse(self.origin, f"{what} of an event recorded into the capture", ErrorCode.CAPTURED_EVENT)
        return True  # after the capture, the event was never recorded on a real stream: complete

    def includes(self, stream: Stream) -> bool:
        """Whether ``stream`` takes part in this capture (began it or joined it), while it is underway."""
        return not self.ended and stream._q in self.members

    def unjoined(self) -> list[_Queue]:
        """Streams that joined the capture but whose work the capturing stream never waited for."""
        reach = self.members[self.origin].reach
        return [q for q, m in self.members.items() if q is not self.origin and reach.get(q, -1) < m.mark]
# LITERALINCLUDE END: RUNTIME CAPTURE


class _DefaultStreamGuard:
    """The ``capture`` of every default stream while ``global`` or ``thread_local`` captures are underway:
    launches and host waits there are refused (CUDA's legacy stream syncs with capturing streams)."""

    def __init__(self) -> None:
        self.captures: list[Capture] = []

    def _forbidding(self) -> list[Capture]:
        me = threading.get_ident()
        return [c for c in self.captures if c.mode is CaptureMode.GLOBAL or c.thread == me]

    def record(self, q: _Queue, fn: Callable[..., Any], args: tuple, buffers: tuple | list, name: str,
               writes: tuple | list | None = None) -> None:
        """A launch on a default stream: refused where forbidden (else it returns, and the launch is queued)."""
        self.refuse(q, f"launch of {name}")

    def refuse(self, q: _Queue, what: str) -> None:
        """A launch, synchronous call or host wait on a default stream: refused where forbidden."""
        forbidding = self._forbidding()
        if forbidding:
            c = forbidding[0]
            message = (f"{what} on the default stream of openreg:{q.device} while a graph capture is underway "
                       f"(openreg:{c.device} stream {c.origin.id}, mode '{c.mode.value}'): in this mode the default "
                       "streams cannot be used during a capture (CUDA's legacy stream neither); launch the graph's "
                       "work on the capturing stream and other work on a stream of its own, or capture in mode "
                       "'relaxed'")
            for capture in forbidding:
                capture.invalidate(message)
            raise OpenRegError(ErrorCode.STREAM_CAPTURE_IMPLICIT, message + " (the capture is invalidated)")

    def record_event(self, event: Any, q: _Queue) -> bool:
        return False  # recorded as usual (a timed event launches, and the launch decides)

    def wait_event(self, q: _Queue, event: Any) -> bool:
        return event.capture is not None and event.capture.wait_event(q, event)


_guard = _DefaultStreamGuard()
_lock = threading.Lock()
_captures: list[Capture] = []  # every capture underway


# LITERALINCLUDE START: CAPTURE HOOK
class _CaptureHook(hooks.LaunchHook):
    """Graph capture on the launch path, registered while a capture is underway: a launch on a stream that
    takes part (``q.capture``) is recorded, not queued; what the host would run or wait for now is refused;
    events mark points of the capture, and waits on them fork and join it."""

    order = 0  # a recorded launch is seen by nothing else: the replay is what runs, and is checked then

    def take(self, q: _Queue, fn: Callable[..., Any], args: tuple, buffers: Any, name: str, writes: Any,
             cost: Any) -> int | None:
        capture = q.capture
        if capture is None:
            return None
        seq = capture.record(q, fn, args, buffers, name, writes)
        if seq is not None:  # the timing model: the recorded kernel keeps its cost for the replays
            timing.captured(capture.graph, name, cost)
        return seq

    def host_wait(self, q: _Queue, seq: int, simulated: bool) -> None:
        if q.capture is not None:
            q.capture.refuse(q, "a host wait")

    def unrecordable(self, q: _Queue, what: str) -> None:
        if q.capture is not None:
            q.capture.refuse(q, what)

    def stream_wait(self, stream: Stream, event: Any) -> bool:
        capture = stream._q.capture or event.capture
        return capture is not None and capture.wait_event(stream._q, event)

    def event_record(self, event: Any, q: _Queue) -> bool:
        return q.capture is not None and q.capture.record_event(event, q)


_hook = _CaptureHook()
# LITERALINCLUDE END: CAPTURE HOOK


# LITERALINCLUDE START: RUNTIME BEGIN END
def begin_capture(stream: Stream, mode: CaptureMode | str = CaptureMode.GLOBAL) -> Capture:
    """Put ``stream`` in capture mode (``cudaStreamBeginCapture``): its launches are recorded, not run."""
    mode = CaptureMode(mode)
    q = stream._q
    if stream.id == 0:
        raise OpenRegError(
            ErrorCode.STREAM_CAPTURE_UNSUPPORTED,
            f"graph capture on the default stream of openreg:{stream.device} is not allowed: capture on a stream "
            "of its own (torch.openreg.Stream()), as CUDA requires; the graph can be replayed on any stream",
        )
    with _lock:
        check_not_capturing(stream)
        capture = Capture(stream, mode)
        q.capture = capture
        _captures.append(capture)
        hooks.add(_hook)
        timing.capture_began()  # the capture's launches are priced for later simulated replays
        if mode is not CaptureMode.RELAXED:
            _guard.captures.append(capture)
            for device in range(device_count()):
                default_stream(device)._q.capture = _guard
    return capture


def check_not_capturing(stream: Stream | None = None) -> None:
    """Raise if the calling thread has a capture underway, or ``stream`` takes part in one: a capture cannot
    begin inside another."""
    me = threading.get_ident()
    nested = stream._q.capture if stream is not None and isinstance(stream._q.capture, Capture) else None
    nested = nested or next((c for c in _captures if c.thread == me), None)
    if nested is not None:
        raise OpenRegError(
            ErrorCode.STREAM_CAPTURE_UNSUPPORTED,
            f"graph capture nested in a capture: a capture on openreg:{nested.device} stream {nested.origin.id} "
            "is underway (in this thread or on this stream); end it first",
        )


def end_capture(stream: Stream) -> Graph:
    """End the capture begun on ``stream`` and return its graph (``cudaStreamEndCapture``).

    The streams that took part leave capture mode whatever happens; an invalidated capture, or one with
    a forked stream never joined back, raises and its recording is dropped.
    """
    capture = stream._q.capture
    if not isinstance(capture, Capture) or capture.origin is not stream._q:
        where = f"it joined the capture begun on stream {capture.origin.id}" if isinstance(capture, Capture) else \
            "no capture was begun on it"
        raise OpenRegError(ErrorCode.STREAM_CAPTURE_UNMATCHED,
                           f"end of a graph capture on openreg:{stream.device} stream {stream.id}: {where}")
    with _lock:
        capture.ended = True
        for q in capture.members:
            q.capture = None
        _captures.remove(capture)
        if not _captures:
            hooks.remove(_hook)
        timing.capture_ended()
        if capture in _guard.captures:
            _guard.captures.remove(capture)
            if not _guard.captures:
                for device in range(device_count()):
                    default_stream(device)._q.capture = None
    graph, unjoined = capture.graph, capture.unjoined()
    capture.graph = None  # events recorded in the capture keep it: not the graph
    if capture.error is not None or unjoined:
        graph.release()
        if capture.error is not None:
            raise OpenRegError(ErrorCode.STREAM_CAPTURE_INVALIDATED,
                               f"the graph capture was invalidated: {capture.error}")
        raise OpenRegError(
            ErrorCode.STREAM_CAPTURE_UNJOINED,
            f"graph capture on openreg:{capture.device} stream {capture.origin.id} ended with stream(s) "
            f"{', '.join(str(q.id) for q in unjoined)} forked into it but not joined back: make the capturing stream "
            "wait for their work (wait_stream / wait_event) before the capture ends",
        )
    return graph


def is_capturing(stream: Stream) -> bool:
    """Whether ``stream`` records its launches into a capture (``cudaStreamIsCapturing``), joined ones included."""
    return isinstance(stream._q.capture, Capture)
# LITERALINCLUDE END: RUNTIME BEGIN END


def refuse_capture(stream: Stream, message: str) -> NoReturn:
    """Invalidate the capture ``stream`` takes part in and raise ``message``, as CUDA invalidates a capture on a
    call it cannot record: for a library whose launches cannot be recorded for a reason of its own (occl's)."""
    capture = stream._q.capture
    if isinstance(capture, Capture):
        capture.invalidate(message)
    raise OpenRegError(ErrorCode.STREAM_CAPTURE_UNSUPPORTED,
                       message + " (the capture is invalidated; end it and capture again without this)")
