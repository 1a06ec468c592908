"""The stream sanitizer: finds launches that race with work on another stream.

Work on two streams runs in any order unless the program orders it: an event wait (``wait_stream`` is
one), or a host that synchronized before it launched. A program that forgets usually still gets the
right answer on a GPU (the other stream happened to be done) and sometimes not. In sanitizer mode
(``OPENREG_STREAM_SANITIZER=1`` or :func:`enable`) every launch checks, for each buffer it reads or
writes, that the last write to it by another stream, and for a write every read since, is ordered
before it; a launch that races raises ``OpenRegError`` (``STREAM_RACE``) at the launch, naming both
launches, their streams, the buffer and both Python stacks.

"Ordered before" is a happens-before relation kept as vector clocks in the runtime's own launch
sequence numbers:

* a stream's clock says, for each other stream, up to which launch its next launches are ordered
  after that stream (an event wait joins the event's clock into it);
* an event carries its stream's clock at the point it recorded;
* the host has one clock, joined when it synchronizes (a stream, the device, an event, a completed
  query, a launch it runs and waits for such as ``.item()``); every launch is ordered after what the
  host knew when it launched.

One host clock serves every host thread: threads order themselves through Python (queues, locks,
joins) where the runtime cannot see it, so a synchronize by one thread counts for all. Accesses are
tracked per byte range: the extents launches name (for PyTorch, a tensor's whole storage).
"""

from __future__ import annotations

import bisect
import contextlib
import itertools
import linecache
import os
import sys
import sysconfig
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from . import bounded, hooks, memory, settings
from .errors import ErrorCode, OpenRegError

# LITERALINCLUDE START: SANITIZER SWITCH
# ``OPENREG_STREAM_SANITIZER`` (read in openreg/settings.py) sets the start. While it is on, the sanitizer's
# launch hook (below) sees every launch and synchronization; while it is off, the hook is not registered.
enabled: bool = settings.STREAM_SANITIZER


def enable() -> None:
    """Check every launch from now on (state starts empty: what ran before is not known)."""
    global enabled
    with _lock:
        if not enabled:
            reset()
            enabled = True
            memory.add_free_hook(forget)
            hooks.add(_hook)


def disable() -> None:
    """Stop checking (what was recorded is forgotten at the next :func:`enable`)."""
    global enabled
    enabled = False
    hooks.remove(_hook)
    memory.remove_free_hook(forget)


def is_enabled() -> bool:
    return enabled


@contextlib.contextmanager
def sanitizing(on: bool = True) -> Iterator[None]:
    """Check launches inside the block (``on=False``: do not, e.g. around a deliberate race)."""
    before = enabled
    enable() if on else disable()
    try:
        yield
    finally:
        enable() if before else disable()
# LITERALINCLUDE END: SANITIZER SWITCH


Key = tuple  # (device, stream id): stream ids are never reused on a device


class Access:
    """One launch's access to a byte range: what the next conflicting launch is checked against."""

    __slots__ = ("stream", "seq", "name", "stack", "what", "serial")

    def __init__(self, stream: Key, seq: int, name: str, stack: tuple, what: str) -> None:
        self.stream, self.seq, self.name, self.stack, self.what = stream, seq, name, stack, what
        self.serial = next(_serial)  # global order, to tell accesses before a free from those after

    def where(self) -> str:
        return f"openreg:{self.stream[0]} stream {self.stream[1]}"

    def __repr__(self) -> str:
        return f"<{self.what} by {self.name} on {self.where()}, launch {self.seq}>"


class _Freed:
    """The caching allocator freed the block covering a range: accesses before ``serial`` were its last tensor's."""

    __slots__ = ("serial", "stack", "stream")

    def __init__(self, stack: tuple, stream: Key) -> None:
        self.serial, self.stack, self.stream = next(_serial), stack, stream


class _Seg:
    """A byte range ``[start, end)`` and its accesses: the last write and, per stream, the last read since."""

    __slots__ = ("end", "write", "reads", "freed")

    def __init__(self, end: int, write: Access | None = None, reads: dict | None = None,
                 freed: _Freed | None = None) -> None:
        self.end, self.write, self.reads, self.freed = end, write, reads if reads is not None else {}, freed


class _VectorClock:
    """A stream's vector clock (for each other stream, the last launch its next launches are ordered after),
    with its recent history: events and host waits name a launch by its number."""

    __slots__ = ("clock", "history")

    def __init__(self) -> None:
        self.clock: dict[Key, int] = {}
        self.history: list[tuple[int, dict]] = [(0, self.clock)]  # (first launch it applies to, clock)

    def at(self, seq: int) -> dict:
        """The clock launch ``seq`` ran with (the oldest kept, a superset, for one older than the history)."""
        for first, clock in reversed(self.history):
            if first <= seq:
                return clock
        return self.history[0][1]


@dataclass
class Race:
    """What a ``STREAM_RACE`` error reports (its ``race`` attribute)."""

    kind: str  # "read after write", "write after read", "write after write"
    current: Access
    previous: Access
    start: int  # the byte range the two launches share
    end: int
    tensor: str  # what the current launch's kernel holds there (the client's describer), or bytes
    reuse: bool  # the previous access was to memory freed and handed out again since (a reuse hazard)


_lock = threading.RLock()
_serial = itertools.count(1)
_clocks: dict[Key, _VectorClock] = {}  # each stream's
_host: dict[Key, int] = {}  # the host's clock
_starts: list[int] = []  # sorted starts of the disjoint ranges in _segs
_segs: dict[int, _Seg] = {}
_allocs: dict[int, tuple[int, tuple, tuple]] = {}  # base -> (bytes, (device, stream id or None), stack), live
_HISTORY = 64  # clock changes kept per stream
_DEPTH = 64  # frames looked at per stack
_SHOWN = 8  # frames kept (and shown in a report) per stack

_describer: Callable[[Any, tuple, int, int], str | None] | None = None
_library: tuple[str, ...] = (os.path.dirname(os.path.abspath(__file__)) + os.sep,)
# The standard library and installed packages (a test runner, a framework): shown only inside the innermost
# frame of the program's own code, never outside it.
_installed = ("<frozen ", *{os.path.join(os.path.abspath(p), "")  # ("<frozen runpy>" and the like too)
                             for key in ("stdlib", "platstdlib", "purelib", "platlib")
                             if (p := sysconfig.get_paths().get(key))})


def reset() -> None:
    """Forget every access, clock and allocation."""
    with _lock:
        _clocks.clear()
        _host.clear()
        _starts.clear()
        _segs.clear()
        _allocs.clear()


# LITERALINCLUDE START: SANITIZER CLIENT
def set_client(describe: Callable[[Any, tuple, int, int], str | None] | None, library: tuple[str, ...] = ()) -> None:
    """How a client (torch_openreg) helps reports: ``describe(fn, args, start, end)`` names what the kernel
    ``fn(*args)`` holds in bytes ``[start, end)`` (a tensor's shape and dtype), called only when a race is
    reported; frames under the ``library`` directories are left out of the stacks shown."""
    global _describer, _library
    _describer = describe
    _library = (_library[0], *(os.path.join(os.path.abspath(p), "") for p in library))
    _kinds.clear()
# LITERALINCLUDE END: SANITIZER CLIENT


LIBRARY, INSTALLED, OWN = 0, 1, 2
# file name -> LIBRARY (runtime or client), INSTALLED (stdlib, site-packages) or OWN. Keyed by name, never by
# code object: a code object can carry a framework's caches (TorchDynamo keeps its compiled graphs, and the
# tensors they hold, in the code's extra data), and holding it would keep those alive.
_kinds: dict[str, int] = {}
_KINDS_SIZE = (1 << 16) + 1


def _kind(path: str) -> int:
    kind = _kinds.get(path)
    if kind is None:  # (generated code comes and goes: the cache is bounded)
        kind = LIBRARY if path.startswith(_library) else INSTALLED if path.startswith(_installed) else OWN
        bounded.put(_kinds, path, kind, _KINDS_SIZE)
    return kind


def _stack() -> tuple:
    """The launching thread's Python stack as a report shows it, compactly: up to ``_SHOWN`` (file, line, function),
    innermost first, outside the runtime and its client's library: installed packages' frames (a framework)
    up to the program's innermost own frames, and those own frames up to the next installed one (a test
    runner, ``runpy``); the innermost frames if none qualifies (a launch from C++, such as the autograd
    engine's thread). Capturing costs a short walk up the frames, no formatting; it keeps no code object or
    frame alive."""
    kept, first, own = [], [], False
    f = sys._getframe(2)
    for _ in range(_DEPTH):
        if f is None:
            break
        code = f.f_code
        path = code.co_filename
        if len(first) < _SHOWN:
            first.append((path, f.f_lineno, code.co_name))
        kind = _kinds.get(path)
        if kind is None:
            kind = _kind(path)
        if kind == OWN or (kind == INSTALLED and not own):
            own = own or kind == OWN
            kept.append((path, f.f_lineno, code.co_name))
            if len(kept) == _SHOWN:
                break
        elif kind == INSTALLED:  # outside the program's own frames: what runs the program
            break
        f = f.f_back
    return tuple(kept) if kept else (None, *first)


def _state(key: Key) -> _VectorClock:
    st = _clocks.get(key)
    if st is None:
        st = _clocks[key] = _VectorClock()
    return st


def _join(into: dict, other: dict) -> None:
    for k, seq in other.items():
        if into.get(k, 0) < seq:
            into[k] = seq


# LITERALINCLUDE START: SANITIZER ORDER
def record(q: Any, seq: int) -> dict:
    """The clock an event recorded on ``q`` now (after launch ``seq``) carries: it follows the event waits
    issued on ``q`` so far, even those no launch followed yet."""
    key = (q.device, q.id)
    with _lock:
        clock = dict(_state(key).clock)
    clock[key] = max(clock.get(key, 0), seq)
    return clock


def stream_waits(q: Any, clock: dict | None) -> None:
    """``q``'s next launches are ordered after an event's clock (``Stream.wait_event``)."""
    if not clock:
        return  # recorded before the sanitizer was on: nothing it knows of is ordered by it
    key = (q.device, q.id)
    with _lock:
        st = _state(key)
        if all(st.clock.get(k, 0) >= seq for k, seq in clock.items() if k != key):
            return
        joined = dict(st.clock)
        _join(joined, {k: seq for k, seq in clock.items() if k != key})
        first = q.launched + 1
        st.clock = joined
        if st.history[-1][0] == first:
            st.history[-1] = (first, joined)
        else:
            st.history.append((first, joined))
            if len(st.history) > _HISTORY:
                del st.history[0]


def host_waits(q: Any, seq: int) -> None:
    """The host waited for launch ``seq`` of ``q``: it, and everything it was ordered after, is done (all
    that was issued on ``q``, event waits included, when ``seq`` is its last launch)."""
    key = (q.device, q.id)
    with _lock:
        st = _state(key)
        _join(_host, st.clock if seq >= q.launched else st.at(seq))
        if _host.get(key, 0) < seq:
            _host[key] = seq


def host_joins(clock: dict | None) -> None:
    """The host waited for an event (or saw it complete)."""
    if clock:
        with _lock:
            _join(_host, clock)


def _ordered(prev: Access, key: Key, clock: dict) -> bool:
    """Whether ``prev`` is ordered before a launch on stream ``key`` whose stream clock is ``clock``."""
    k = prev.stream
    return k == key or prev.seq <= clock.get(k, 0) or prev.seq <= _host.get(k, 0)
# LITERALINCLUDE END: SANITIZER ORDER


# -- byte ranges -------------------------------------------------------------------------------------
def _extent(buffer: Any) -> tuple[int, int] | None:
    """``[start, end)`` of a launch's buffer: a pointer names its whole allocation, an extent its bytes."""
    if type(buffer) is int:
        alloc = memory.find(buffer) if buffer else None
        return (alloc.ptr, alloc.ptr + alloc.size) if alloc is not None and alloc.size else None
    ptr, nbytes = buffer
    return (ptr, ptr + nbytes) if ptr and nbytes > 0 else None


def _accesses(buffers: Any, writes: Any) -> dict[tuple[int, int], bool]:
    """Each range a launch touches -> whether it writes it (``writes`` None: it may write them all)."""
    written = None if writes is None else {e for e in map(_extent, writes) if e is not None}
    out: dict[tuple[int, int], bool] = {}
    for buffer in buffers:
        e = _extent(buffer)
        if e is not None:
            out[e] = out.get(e, False) or written is None or e in written
    for e in written or ():
        out[e] = True
    return out


def _split(start: int, seg: _Seg, at: int) -> _Seg:
    """Split ``seg`` (at ``start``) at ``at``; returns the upper part, which inherits its accesses."""
    upper = _Seg(seg.end, seg.write, dict(seg.reads), seg.freed)
    seg.end = at
    _segs[at] = upper
    bisect.insort(_starts, at)
    return upper


def _cover(lo: int, hi: int) -> list[_Seg]:
    """The ranges covering exactly ``[lo, hi)``, split and created as needed (a split keeps the state)."""
    seg = _segs.get(lo)
    if seg is not None and seg.end == hi:
        return [seg]  # the common case: the same extent as before
    i = bisect.bisect_right(_starts, lo) - 1
    if i >= 0 and _segs[_starts[i]].end > lo and _starts[i] < lo:
        _split(_starts[i], _segs[_starts[i]], lo)
    out = []
    pos = lo
    while pos < hi:
        seg = _segs.get(pos)
        if seg is not None:
            if seg.end > hi:
                _split(pos, seg, hi)
        else:
            i = bisect.bisect_right(_starts, pos)
            end = min(_starts[i], hi) if i < len(_starts) else hi
            seg = _segs[pos] = _Seg(end)
            _starts.insert(i, pos)
        out.append(seg)
        pos = seg.end
    return out


def _overlapping(lo: int, hi: int) -> list[tuple[int, _Seg]]:
    i = bisect.bisect_right(_starts, lo) - 1
    if i < 0 or _segs[_starts[i]].end <= lo:
        i += 1
    out = []
    while i < len(_starts) and _starts[i] < hi:
        out.append((_starts[i], _segs[_starts[i]]))
        i += 1
    return out


# LITERALINCLUDE START: SANITIZER CHECK
def launch(q: Any, buffers: Any, writes: Any, name: str, fn: Any, args: tuple,
           host: bool = False, done: bool = False) -> OpenRegError | None:
    """Check a launch about to be queued on ``q`` and record its accesses; returns the error to raise
    (nothing is recorded then) if it races. ``host``: the host runs it and waits for it (``run_here``),
    so a launch that only reads is a host read (``.item()``, ``.cpu()``). ``done``: no launch, the host
    accesses the bytes itself now, in ``q``'s order after its earlier work (the copy engine's transfers)."""
    if not buffers and not writes:
        return None
    touched = _accesses(buffers, writes)
    if not touched:
        return None
    stack = _stack()
    read = "host read" if host and not any(touched.values()) else "read"
    with _lock:
        key = (q.device, q.id)
        # the number the runtime gives this launch (taken under the queue's lock next); a transfer of the host's
        # own is at the stream's last launch, which it follows
        seq = q.launched if done else q.launched + 1
        clock = _state(key).clock
        plan = []
        for (lo, hi), write in touched.items():
            for seg in _cover(lo, hi):
                prev = seg.write if seg.write is not None and not _ordered(seg.write, key, clock) else None
                if prev is None and write:
                    prev = next((r for r in seg.reads.values() if not _ordered(r, key, clock)), None)
                if prev is not None:
                    current = Access(key, seq, name, stack, "write" if write else read)
                    return _race(current, prev, seg, lo, hi, fn, args)
                plan.append((seg, write))
        access = Access(key, seq, name, stack, read)
        written = None
        for seg, write in plan:
            if write:
                if written is None:
                    written = Access(key, seq, name, stack, "write")
                seg.write, seg.reads, seg.freed = written, {}, None
            else:
                seg.reads[key] = access
    return None
# LITERALINCLUDE END: SANITIZER CHECK


# LITERALINCLUDE START: SANITIZER MEMORY
def allocated(ptr: int, nbytes: int, device: int, stream: int | None = None) -> None:
    """An allocator handed out ``[ptr, ptr + nbytes)`` (for the report's "allocated at")."""
    stack = _stack()
    with _lock:
        _allocs[ptr] = (nbytes, (device, stream), stack)


def freed(ptr: int, nbytes: int, device: int, stream: int) -> None:
    """A caching allocator took a block back: its accesses stay, so that the next tensor the block is handed
    out for is checked against them (the cross-stream reuse hazard), and a report says the block was reused.
    The stack of the free is kept where another stream used the block (the usual hazard) and costs nothing
    otherwise."""
    key = (device, stream)
    with _lock:
        _allocs.pop(ptr, None)
        segs = [seg for _, seg in _overlapping(ptr, ptr + nbytes)]
        shared = any((seg.write is not None and seg.write.stream != key) or any(k != key for k in seg.reads)
                     for seg in segs)
        mark = _Freed(_stack() if shared else (), key)
        for seg in segs:
            seg.freed = mark


def forget(ptr: int) -> None:
    """The driver frees an allocation: nothing can name its bytes again before the address is reused."""
    if not enabled:
        return
    alloc = memory.find(ptr)
    if alloc is None:
        return
    lo, hi = alloc.ptr, alloc.ptr + max(alloc.size, 1)
    with _lock:
        for start, _ in _overlapping(lo, hi):
            del _segs[start]
        _starts[:] = [s for s in _starts if s in _segs]
        for base in [b for b in _allocs if lo <= b < hi]:
            del _allocs[base]
# LITERALINCLUDE END: SANITIZER MEMORY


# -- reports -----------------------------------------------------------------------------------------
def _race(current: Access, previous: Access, seg: _Seg, lo: int, hi: int, fn: Any, args: tuple) -> OpenRegError:
    """The error for ``current`` racing with ``previous`` over the range ``[lo, hi)`` the launch names."""
    kind = ("write" if current.what == "write" else "read") + " after " + previous.what.split()[-1]
    reuse = seg.freed is not None and previous.serial < seg.freed.serial
    tensor = None
    if _describer is not None:
        try:
            tensor = _describer(fn, args, lo, hi)
        except Exception as exc:  # noqa: BLE001 - a report must not fail because a description did
            tensor = f"(the description failed: {type(exc).__name__}: {exc})"
    tensor = tensor or f"a buffer of {hi - lo} bytes"
    race = Race(kind, current, previous, lo, hi, tensor, reuse)
    error = OpenRegError(ErrorCode.STREAM_RACE, _message(race, seg.freed if reuse else None))
    error.race = race
    return error


def _who(access: Access) -> str:
    return f"{access.name}{' (a host read)' if access.what == 'host read' else ''} on {access.where()}"


def _message(race: Race, freed: _Freed | None) -> str:
    cur, prev = race.current, race.previous
    verb = "writes" if cur.what == "write" else "reads"
    past = "wrote" if prev.what == "write" else "read"
    head = f"stream race ({race.kind}): {_who(cur)} {verb} {race.tensor}, which {_who(prev)} {past}"
    if freed is None:
        head += (f", and nothing orders that {prev.what.split()[-1]} before this {cur.what.split()[-1]} (no event "
                 f"wait such as wait_stream, no synchronize or host read of stream {prev.stream[1]} in between)")
        fix = (f"make stream {cur.stream[1]} wait for stream {prev.stream[1]} before this launch "
               f"(current_stream().wait_stream(<stream {prev.stream[1]}>), or an event recorded there and waited "
               f"for here), or synchronize with stream {prev.stream[1]} first")
    else:
        head += (f" when the memory belonged to another tensor; the caching allocator took it back on stream "
                 f"{freed.stream[1]} and handed it out again while that {prev.what.split()[-1]} may still be "
                 f"running (the cross-stream reuse hazard)")
        fix = (f"call record_stream(<stream {prev.stream[1]}>) on a tensor used on a stream other than the one it "
               f"was allocated on, before freeing it, or order stream {cur.stream[1]} after stream "
               f"{prev.stream[1]} before using memory allocated there")
    lines = [head, f"  memory: {race.end - race.start} bytes at 0x{race.start:x}"]
    alloc = _allocation(race.start)
    if alloc is not None:
        nbytes, (device, stream), stack = alloc
        where = f"openreg:{device}" + (f" stream {stream}" if stream is not None else "")
        lines.append(f"  allocated ({nbytes} bytes, on {where}) at:")
        lines.extend(_format(stack))
    lines.append(f"  this {cur.what}: {cur.name} on {cur.where()}, launched at:")
    lines.extend(_format(cur.stack))
    lines.append(f"  the earlier {prev.what}: {prev.name} on {prev.where()}, launched at:")
    lines.extend(_format(prev.stack))
    if freed is not None and freed.stack:
        lines.append(f"  the earlier tensor was freed (stream {freed.stream[1]}) at:")
        lines.extend(_format(freed.stack))
    lines.append(f"  fix: {fix}")
    return "\n".join(lines)


def _allocation(ptr: int) -> tuple | None:
    with _lock:
        found = _allocs.get(ptr)
        if found is None:
            bases = [b for b, (n, _, _) in _allocs.items() if b <= ptr < b + n]
            found = _allocs[max(bases)] if bases else None
    return found


def _format(stack: tuple) -> list[str]:
    """A stack from :func:`_stack`, oldest frame first, as a traceback shows it."""
    lines = []
    if stack and stack[0] is None:
        stack = stack[1:]
        lines.append("    (no frames outside the libraries: launched from C++, e.g. by the autograd engine)")
    for path, lineno, name in reversed(stack):
        lines.append(f'    File "{path}", line {lineno}, in {name}')
        text = linecache.getline(path, lineno).strip()
        if text:
            lines.append(f"      {text}")
    return lines


# LITERALINCLUDE START: SANITIZER HOOK
class _Hook(hooks.LaunchHook):
    """The sanitizer on the launch path: it checks each launch and learns the order the program makes."""

    order = 10  # before the profiler tags a launch: a racing launch is refused before anything records it

    def check(self, q: Any, item: Any, buffers: Any, writes: Any, host: bool) -> None:
        race = launch(q, buffers, writes, item.name, item.fn, item.args, host=host)
        if race is not None:
            raise race

    def host_waited(self, q: Any, seq: int) -> None:
        host_waits(q, seq)

    def stream_wait(self, stream: Any, event: Any) -> bool:
        stream_waits(stream._q, event._clock)  # ordered even when the event's work is done: CUDA promises no less
        return False

    def event_recorded(self, event: Any, stream: Any) -> None:
        event._clock = record(stream._q, event._seq)

    def event_waited(self, event: Any) -> None:
        host_joins(event._clock)

    def host_access(self, q: Any, extent: list, write: bool, name: str, about: Any) -> None:
        race = launch(q, extent, extent if write else (), name, None, (about,), host=True, done=True)
        if race is not None:
            raise race

    allocated = staticmethod(allocated)  # the module's functions, as the allocators call them
    cached = staticmethod(freed)


_hook = _Hook()
# LITERALINCLUDE END: SANITIZER HOOK

if enabled:  # on from the start (OPENREG_STREAM_SANITIZER=1): frees are reported from the first one
    memory.add_free_hook(forget)
    hooks.add(_hook)
