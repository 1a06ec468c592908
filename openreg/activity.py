"""Device activity: when each device's streams ran work, for ``nvidia-smi``-style utilization.

Every finished launch leaves its ``(start_ns, end_ns, name)`` here (the stream worker or the host
thread that ran it records it); :func:`busy_fraction` answers "what fraction of the last sample period
was at least one launch running", the way NVML samples a GPU's utilization (its period is 1/6 s to
1 s). Work still running when asked is not counted yet. Recording costs one deque append per launch.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from .device import check_device, device_count

SAMPLE_PERIOD = 1.0  # seconds, as NVML's longest sample period
_KEPT = 1 << 16  # launches remembered per device: more than a 2-core host finishes in a sample period

_finished: list[collections.deque] = [collections.deque(maxlen=_KEPT) for _ in range(device_count())]


class _Running(threading.local):
    """The launch this thread is running now, ``(name, device, stream id)`` or None: a native fault inside a
    kernel (a CPU kernel reading past a buffer) is reported with the operator that was running."""

    kernel: tuple[str, int, int] | None = None


running = _Running()


def record(device: int, start_ns: int, end_ns: int, name: str) -> None:
    """Note that launch ``name`` ran on ``device`` from ``start_ns`` to ``end_ns`` (``time.perf_counter_ns``)."""
    _finished[device].append((start_ns, end_ns, name))


# LITERALINCLUDE START: BUSY FRACTION
def busy_fraction(device: int, period: float = SAMPLE_PERIOD, counts: Callable[[str], bool] | None = None) -> float:
    """Fraction of the last ``period`` seconds in which one or more launches ran on ``device``.

    ``counts(name)`` selects the launches that count (all by default). Overlapping launches on
    different streams count once: the union of their intervals is measured.
    """
    check_device(device)
    now = time.perf_counter_ns()
    since = now - int(period * 1e9)
    spans = sorted((max(s, since), e) for s, e, name in list(_finished[device])
                   if e > since and (counts is None or counts(name)))
    busy, end = 0, since
    for start, stop in spans:
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy / (now - since)
# LITERALINCLUDE END: BUSY FRACTION
