"""The simulated clock: each stream's time advances by its launches' predicted durations.

Everything happens on the launching host thread, at the launch. The host has its own simulated time:
issuing a launch costs it the profile's host cost for that launch (PyTorch eager's Python, dispatch
and driver launch: ``host_us``), and a view costs it too. A launch starts once its stream's previous
launch has ended plus the gap between back-to-back kernels, and not before the host has issued it;
it ends its predicted duration later. A stream that waits for an event
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
        self.host = 0.0  # the host's simulated time: launches it issued, waits it made
        self.collectors: list[list[Launch]] = []  # reports recording launches
        self.trace: list | None = None  # what the clock was told, for a replay on another profile (.calibrate)
        self.l2: collections.OrderedDict = collections.OrderedDict()  # (device, pointer) -> bytes, oldest first
        self.l2_bytes = 0

    def launch(self, device: int, stream: int, seq: int, name: str, cost: model.Cost | None,
               buffers=None) -> Launch:
        cost = _UNPRICED if cost is None else cost
        profile, key = self.profile, (device, stream)
        issue = issue_seconds(cost, profile)
        with self.lock:
            if self.trace is not None:
                self.trace.append(("launch", device, stream, seq, name, cost,
                                   [tuple(b[:2]) for b in buffers] if buffers else None))
            cached = self._cache(device, buffers) if buffers and cost.link is None else None
            prediction = model.predict(cost, profile, cached)
            gap = max(profile.launch_latency_us - profile.kernel_floor_us, 0.0) * 1e-6 if prediction.seconds else 0.0
            self.host += issue
            previous = self.streams.get(key)
            start = max(self.host, previous + gap if previous is not None else 0.0)
            end = start + prediction.seconds
            self.streams[key] = end
            ends = self.ends.get(key)
            if ends is None:
                ends = self.ends[key] = collections.deque()
            ends.append((seq, end))
            record = Launch(name, device, stream, start, end, cost if cost is not _UNPRICED else None, prediction)
            for collector in self.collectors:
                collector.append(record)
        return record

    def _cache(self, device: int, buffers) -> float | None:
        """The share of a launch's buffers found in the L2 cache (an LRU of the buffers recent launches
        touched, as large as the profile's L2); the launch's buffers become the most recent."""
        capacity = self.profile.l2_cache_mib * (1 << 20)
        if not capacity:
            return None
        # (a buffer named by its pointer alone, as Stream.launch accepts, has no known size: it is not cached)
        extents = {(device, b[0]): b[1] for b in buffers if not isinstance(b, int)}
        total = sum(extents.values())
        hit = sum(n for k, n in extents.items() if self.l2.get(k) == n)
        hit = max(hit - max(total - capacity, 0), 0)  # a launch larger than the cache evicts its own hits first
        for k, n in extents.items():
            old = self.l2.pop(k, None)
            if old is not None:
                self.l2_bytes -= old
            if n <= capacity:
                self.l2[k] = n
                self.l2_bytes += n
        while self.l2_bytes > capacity:
            self.l2_bytes -= self.l2.popitem(last=False)[1]
        return hit / total if total else None

    def host_spends(self, kind: str) -> None:
        """The host does work that launches nothing (``kind``: a key of the profile's ``host_us``)."""
        with self.lock:
            if self.trace is not None:
                self.trace.append(("host", kind))
            self.host += self.profile.host_us[kind] * 1e-6

    def mark(self, device: int, stream: int) -> float:
        """An event recorded on the stream now: when it completes (the trace keeps the point)."""
        with self.lock:
            if self.trace is not None:
                self.trace.append(("mark", device, stream))
            return max(self.streams.get((device, stream), 0.0), self.host)

    def now(self, device: int, stream: int) -> float:
        """When work launched on the stream now would start: its last launch's end, or the host's time."""
        return max(self.streams.get((device, stream), 0.0), self.host)

    def host_waits(self, device: int, stream: int, seq: int) -> None:
        """The host blocks until launch ``seq`` of the stream has finished."""
        with self.lock:
            if self.trace is not None:
                self.trace.append(("wait", device, stream, seq))
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


# LITERALINCLUDE START: TIMING HOST COST
def issue_seconds(cost: model.Cost, profile) -> float:
    """What issuing a launch of ``cost`` costs the host on ``profile`` (its ``host_us`` table)."""
    if cost.host == "none":
        return 0.0
    return profile.host_us[cost.host] * 1e-6
# LITERALINCLUDE END: TIMING HOST COST
