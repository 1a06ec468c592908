"""The simulated clock: each stream's time advances by its launches' predicted durations.

Everything happens on the launching host thread, at the launch: a launch starts when its stream's
previous launch ends (stream order) and not before the host could have issued it (the simulated time
the host last waited for), and ends its predicted duration later. A stream that waits for an event
cannot run ahead of the event's time; a host that waits for a launch (synchronize, ``.item()``, a copy
to pageable memory) is at that launch's end from then on. So the simulated times do not depend on how
fast the host CPU runs the kernels, and copies and compute on different streams overlap as they would
on the device.
"""

from __future__ import annotations

import collections
import threading

from . import model


class Launch:
    """One launch as the clock saw it (seconds since the clock started)."""

    __slots__ = ("name", "device", "stream", "start", "end", "cost", "prediction")

    def __init__(self, name: str, device: int, stream: int, start: float, end: float, cost, prediction) -> None:
        self.name, self.device, self.stream, self.start, self.end = name, device, stream, start, end
        self.cost, self.prediction = cost, prediction  # cost None: the launch came without one

    def __repr__(self) -> str:
        return (f"Launch({self.name!r}, openreg:{self.device} stream {self.stream}, "
                f"{self.start * 1e6:.3f}-{self.end * 1e6:.3f} us, {self.prediction.bound})")


_UNPRICED = model.Cost("elementwise")  # a launch nobody priced: its launch latency only


# LITERALINCLUDE START: TIMING CLOCK
class Clock:
    """Simulated time per stream, and the host's, on one profile."""

    def __init__(self, profile) -> None:
        self.profile = profile
        self.lock = threading.Lock()
        self.streams: dict[tuple[int, int], float] = {}  # (device, stream id) -> when its last launch ends
        self.ends: dict[tuple[int, int], collections.deque] = {}  # (seq, end) of launches the host may wait for
        self.host = 0.0  # the simulated time the host has waited up to
        self.collectors: list[list[Launch]] = []  # reports recording launches

    def launch(self, device: int, stream: int, seq: int, name: str, cost: model.Cost | None) -> Launch:
        prediction = model.predict(_UNPRICED if cost is None else cost, self.profile)
        key = (device, stream)
        with self.lock:
            start = max(self.streams.get(key, 0.0), self.host)
            end = start + prediction.seconds
            self.streams[key] = end
            ends = self.ends.get(key)
            if ends is None:
                ends = self.ends[key] = collections.deque()
            ends.append((seq, end))
            record = Launch(name, device, stream, start, end, cost, prediction)
            for collector in self.collectors:
                collector.append(record)
        return record

    def now(self, device: int, stream: int) -> float:
        """When work launched on the stream now would start: its last launch's end, or the host's time."""
        return max(self.streams.get((device, stream), 0.0), self.host)

    def host_waits(self, device: int, stream: int, seq: int) -> None:
        """The host blocks until launch ``seq`` of the stream has finished."""
        with self.lock:
            ends = self.ends.get((device, stream))
            reached = None
            while ends and ends[0][0] <= seq:
                reached = ends.popleft()[1]
            if reached is not None and reached > self.host:
                self.host = reached

    def stream_waits(self, device: int, stream: int, when: float) -> None:
        """Later work on the stream starts no earlier than ``when`` (an event's time)."""
        with self.lock:
            key = (device, stream)
            if when > self.streams.get(key, 0.0):
                self.streams[key] = when
# LITERALINCLUDE END: TIMING CLOCK
