"""The timing model: what openreg work would take on a real accelerator, without the hardware.

With a device profile selected (``OPENREG_DEVICE_PROFILE=h100-sxm``, or :func:`set_profile`), the
runtime keeps a simulated clock beside the real one: every launch carries a :class:`Cost` (the torch
layer prices operators with PyTorch's FLOP formulas; runtime copies price themselves), the model
predicts its device duration on the profile, and each stream's simulated time advances by it
(:mod:`.clock`). Events created with ``enable_timing`` then report simulated ``elapsed_time``.

Off (the default), nothing of this is on the launch path: the model's launch hook (below) is registered
while simulated time is on. ``OPENREG_DEVICE_PROFILE`` is read
once, at import, with every other setting (``openreg/settings.py``), and selected here.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping

from .. import hooks, settings
from . import model
from .clock import _UNPRICED, Clock, Launch
from .model import COLLECTIVES, EFFICIENCY, FREE, HOST, HOST_US, KINDS, Cost, Prediction, predict
from .profiles import DTYPES, DeviceProfile, builtin, from_dict, load_file, resolve

ENV = "OPENREG_DEVICE_PROFILE"

active = False  # the launch path's one test: is a simulated clock running?
pricing = False  # do the launch sites price their launches: simulated time on, or a graph capture under way
_captures = 0
_clock: Clock | None = None
_lock = threading.Lock()
_pending = threading.local()


def profiles() -> dict[str, DeviceProfile]:
    """The built-in device profiles, by name."""
    return builtin()


def get_profile() -> DeviceProfile | None:
    """The profile the simulated clock runs on, or None when simulated time is off."""
    clock = _clock
    return clock.profile if clock is not None else None


# LITERALINCLUDE START: TIMING SET PROFILE
def set_profile(spec: str | os.PathLike | Mapping | DeviceProfile | None) -> DeviceProfile | None:
    """Run the simulated clock on ``spec`` (a built-in name, a profile file, a dict of fields); None
    turns simulated time off. Returns the previous profile. Changing the profile keeps the clock's
    times (events recorded before stay comparable); turning it off forgets them."""
    global active, _clock
    profile = None if spec is None else resolve(spec)
    with _lock:
        previous = _clock.profile if _clock is not None else None
        if profile is None:
            active, _clock = False, None
            hooks.remove(_hook)
        elif _clock is None:
            _clock = Clock(profile)
            active = True
            hooks.add(_hook)
        else:
            _clock.profile = profile
        _set_pricing()
    return previous


def _set_pricing() -> None:
    global pricing
    pricing = active or _captures > 0


def capture_began() -> None:
    """A graph capture began: its launches are priced (their nodes keep the costs) even while simulated
    time is off, so a replay simulated later is priced."""
    global _captures
    with _lock:
        _captures += 1
        _set_pricing()


def capture_ended() -> None:
    global _captures
    with _lock:
        _captures = max(_captures - 1, 0)
        _set_pricing()
# LITERALINCLUDE END: TIMING SET PROFILE


@contextlib.contextmanager
def recording() -> Iterator[list[Launch]]:
    """Collect the :class:`~.clock.Launch` records of the launches made inside the block (simulated
    time must be on)."""
    clock = _clock
    if clock is None:
        raise RuntimeError("openreg.timing.recording() needs simulated time on (set_profile first)")
    launches: list[Launch] = []
    with clock.lock:
        clock.collectors.append(launches)
    try:
        yield launches
    finally:
        with clock.lock:
            clock.collectors.remove(launches)


def pending(name: str) -> bool:
    """Whether the calling thread's next launch named ``name`` has a cost handed over already."""
    value = getattr(_pending, "value", None)
    return value is not None and value[0] == name


def host_spends(kind: str) -> None:
    """The host did work that launches nothing (``kind`` ``"python"``: a call into PyTorch's Python
    code): its simulated time advances by the profile's ``host_us[kind]``."""
    clock = _clock
    if clock is not None:
        clock.host_spends(kind)


def next_cost(name: str, cost: Cost | None, host_waits: bool = True) -> None:
    """Price the calling thread's next launch named ``name`` (for a client whose launch is made further
    down, by code that does not know the operator). A launch with another name drops it. ``host_waits``
    False: if that launch is run synchronously (``Stream.run_here``), it is for the simulator's sake (the
    fallback checks the first call of each call shape that way), not because a device would make the
    host wait, so the simulated host does not wait for it."""
    _pending.value = (name, cost, host_waits)


# LITERALINCLUDE START: TIMING HOOK
class _Hook(hooks.LaunchHook):
    """The timing model on the launch path, registered while simulated time is on: each launch gets its
    simulated start and end, host waits and stream waits move the clocks, events keep their simulated time."""

    order = 30  # after the profiler's tag (which shows the simulated times), before launch blocking waits

    def queued(self, stream, item, buffers, cost) -> None:
        if not launched(stream, item.seq, item.name, cost, item.tag, buffers) and item.owner:
            _pending.quiet = (stream._q, item.seq)  # run_here's wait for it is the simulator's, not the program's

    def host_wait(self, q, seq: int, simulated: bool) -> None:
        quiet = getattr(_pending, "quiet", None)
        if quiet is not None and quiet[0] is q and quiet[1] == seq:
            _pending.quiet = None
        elif simulated:
            host_waits(q.device, q.id, seq)

    def stream_wait(self, stream, event) -> bool:
        stream_waits(stream, event._sim_time)
        return False

    def event_recorded(self, event, stream) -> None:
        event._sim_time = stream_time(stream)


_hook = _Hook()
# LITERALINCLUDE END: TIMING HOOK


def _priced(cost):
    """A launch's cost: given, or computed now by the function the launch site handed over instead."""
    return cost() if callable(cost) else cost


def launched(stream, seq: int, name: str, cost: Cost | None, tag=None, buffers=None) -> bool:
    """A launch was queued: give it its simulated start and end (``buffers``: the ``(pointer, bytes)``
    extents it touches, for the L2 model). Returns whether a host that waits for it at once
    (``run_here``) waits in simulated time too (see :func:`next_cost`)."""
    clock = _clock
    if clock is None:
        return True
    host_waits = True
    cost = _priced(cost)
    if cost is None:
        pending = getattr(_pending, "value", None)
        if pending is not None:
            _pending.value = None
            if pending[0] == name:
                cost, host_waits = pending[1], pending[2]
    record = clock.launch(stream.device, stream.id, seq, name, cost, buffers)
    if tag is not None and hasattr(tag, "simulated"):
        tag.simulated = (record.start, record.end)  # the profiler shows it beside the host's time
    return host_waits


def captured(graph, name: str, cost: Cost | None) -> None:  # noqa: D401
    """A launch was recorded into a graph capture instead of queued: its node keeps the cost."""
    cost = _priced(cost)
    if cost is None:
        pending = getattr(_pending, "value", None)
        if pending is not None:
            _pending.value = None
            cost = pending[1] if pending[0] == name else None
    if graph.nodes:
        graph.nodes[-1].cost = cost


def graph_cost(costs: list[Cost | None]) -> Cost:
    """The cost of a graph replay: its kernels' costs as parts of one launch (one host issue for all;
    unpriced kernels: the kernel floor)."""
    parts = tuple(c if c is not None else _UNPRICED for c in costs if c is not FREE)
    if not parts:
        return FREE
    return combined(parts)


def combined(parts: tuple) -> Cost:
    """One launch that runs ``parts`` back to back (a graph replay, a fused operator's stages)."""
    biggest = max(parts, key=lambda c: c.flops + c.bytes)
    return Cost(biggest.kind, sum(c.flops for c in parts), sum(c.bytes for c in parts), biggest.dtype,
                formula=all(c.formula or not c.flops for c in parts), parts=parts,
                scratch=max(c.scratch for c in parts))


def host_waits(device: int, stream_id: int, seq: int) -> None:
    clock = _clock
    if clock is not None:
        clock.host_waits(device, stream_id, seq)


def stream_time(stream) -> float | None:
    """Simulated time of the end of the work launched on ``stream`` so far (None when off)."""
    clock = _clock
    return None if clock is None else clock.now(stream.device, stream.id)


@contextlib.contextmanager
def tracing() -> Iterator[list]:
    """Keep what the clock is told inside the block (launches, host costs, waits, marks), for
    :func:`.calibrate.replay` on other profiles."""
    clock = _clock
    if clock is None:
        raise RuntimeError("openreg.timing.tracing() needs simulated time on (set_profile first)")
    trace: list = []
    clock.trace = trace
    try:
        yield trace
    finally:
        clock.trace = None


def mark(stream) -> float | None:
    """When an event recorded on ``stream`` now would complete, in simulated seconds (a traced point)."""
    clock = _clock
    return None if clock is None else clock.mark(stream.device, stream.id)


def host_time() -> float | None:
    """The host's simulated time (None when off)."""
    clock = _clock
    return None if clock is None else clock.host


def stream_waits(stream, when: float | None) -> None:
    clock = _clock
    if clock is not None and when is not None:
        clock.stream_waits(stream.device, stream.id, when)


if settings.DEVICE_PROFILE:
    set_profile(settings.DEVICE_PROFILE)

__all__ = [
    "COLLECTIVES", "DTYPES", "HOST", "HOST_US", "Cost", "DeviceProfile", "EFFICIENCY", "ENV", "FREE", "KINDS",
    "Launch", "Prediction", "combined", "from_dict", "get_profile", "host_spends", "host_time", "load_file", "mark",
    "model", "next_cost", "predict", "profiles", "recording", "resolve", "set_profile", "tracing",
]
