"""The activities of openreg's Kineto profiler (the session in ``csrc/profiler.cpp`` calls these).

While a trace runs, every launch is tagged with the correlation id of the operator that made it
(:mod:`.launches`) and timed when it runs (a tagged launch observer). When the trace stops, Kineto
asks for its activities and :func:`collect` turns each record into what a CUDA trace has for a
kernel launch:

* a runtime activity on the launching thread (``openregLaunchKernel``, like ``cudaLaunchKernel``),
  the start of an ``ac2g`` flow arrow;
* a device activity (kernel, or memcpy for copies) on its device's row and its stream's track, with
  its real start and end, the end of that arrow; both are linked to the operator's correlation id,
  which is how ``key_averages()`` charges the device time to the operator;
* a ``gpu_user_annotation`` span per ``record_function`` range and stream, around the device work
  launched inside it (nested ranges give nested spans).

Event records and stream waits are runtime calls (``openregEventRecord``, ``openregStreamWaitEvent``):
they get no device activity, as in CUDA traces.
"""

from __future__ import annotations

import threading
import time

import openreg

from . import launches

# Kineto's libkineto::ActivityType values (kineto/ActivityType.h of the 2.13 headers).
GPU_USER_ANNOTATION = 2
GPU_MEMCPY = 3
CONCURRENT_KERNEL = 5
PRIVATEUSE1_RUNTIME = 24

_SORT_DEVICES = 0x1000000  # device rows after the host's, as Kineto sorts GPUs

# LITERALINCLUDE START: KINETO RECORDS
_records: list[tuple] = []
_lock = threading.Lock()
_offset_ns = 0  # time.time_ns() - time.perf_counter_ns(): Kineto's clock is Unix time


def _observe(name: str, device: int, stream: int, start_ns: int, end_ns: int, tag: object) -> None:
    _records.append((name, device, stream, start_ns, end_ns, tag))


def start() -> None:
    """A trace starts: tag and record every launch from now on."""
    global _offset_ns
    with _lock:
        _records.clear()
        _offset_ns = _clock_offset()
        openreg.add_launch_observer(_observe, tagged=True)
        launches.set_tracing(True)


def stop() -> None:
    """The trace stops (after PyTorch synchronized the device): stop recording."""
    with _lock:
        launches.set_tracing(False)
        try:
            openreg.remove_launch_observer(_observe)
        except ValueError:  # stop without start
            pass
# LITERALINCLUDE END: KINETO RECORDS


def _clock_offset() -> int:
    """``time_ns() - perf_counter_ns()``, from the closest of a few paired readings."""
    best = None
    for _ in range(5):
        before = time.perf_counter_ns()
        wall = time.time_ns()
        after = time.perf_counter_ns()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) // 2)
    return best[1]


def _kind(name: str) -> tuple[int | None, str]:
    """(device activity type or None, runtime call name) of a launch, from the name it was launched with."""
    if name == "event_record":
        return None, "openregEventRecord"
    if name == "wait_event":
        return None, "openregStreamWaitEvent"
    if name.startswith(("copy", "memcpy")):
        return GPU_MEMCPY, "openregMemcpyAsync"
    return CONCURRENT_KERNEL, "openregLaunchKernel"


# LITERALINCLUDE START: KINETO COLLECT
def collect(start_ns: int, end_ns: int, pid: int) -> tuple[list, list, list]:
    """(device rows, stream tracks, activities) of the launches recorded since :func:`start`."""
    with _lock:
        records, _records[:] = list(_records), []
    offset = _offset_ns
    devices: dict[int, set[int]] = {}
    activities: list[tuple] = []
    spans: dict[tuple[int, int, int], list[int]] = {}  # (device, stream, record_function id) -> [start, end]
    flow = 0
    for name, device, stream, started, ended, tag in records:
        started, ended = started + offset, ended + offset
        kind, call = _kind(name)
        traced = isinstance(tag, launches.Launch) and tag.launched_ns
        if kind is None and not traced:
            continue
        correlation = tag.correlation if traced else 0
        if traced:
            flow += 1
            launched = tag.launched_ns + offset
            activities.append((PRIVATEUSE1_RUNTIME, call, pid, tag.thread, launched, launched, correlation, correlation,
                               flow if kind is not None else 0, True, {"device": device, "stream": stream}))
        if kind is None:
            continue
        devices.setdefault(device, set()).add(stream)
        metadata = {"device": device, "stream": stream, "correlation": correlation}
        if traced and tag.simulated is not None:  # the timing model's prediction (docs/timing.md)
            metadata["simulated_us"] = round((tag.simulated[1] - tag.simulated[0]) * 1e6, 3)
        activities.append((kind, name, device, stream, started, ended, correlation, correlation,
                           flow if traced else 0, False, metadata))
        for user in tag.user_correlation if traced else ():  # every record_function range open at the launch
            span = spans.setdefault((device, stream, user), [started, ended])
            span[0], span[1] = min(span[0], started), max(span[1], ended)
    for (device, stream, user), (first, last) in spans.items():
        # named after the record_function range by the bridge (an empty name: the linked activity's)
        activities.append((GPU_USER_ANNOTATION, "", device, stream, first, last, user, 0, 0, False, {}))
    rows = [(d, _SORT_DEVICES + d, "openreg", f"openreg:{d}") for d in sorted(devices)]
    tracks = [(s, s, d, f"stream {s}") for d in sorted(devices) for s in sorted(devices[d])]
    return rows, tracks, activities
# LITERALINCLUDE END: KINETO COLLECT
