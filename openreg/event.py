"""Events: points recorded on a stream, for ordering and timing (``cudaEvent_t``)."""

from __future__ import annotations

import time

from . import hooks, timing
from .device import check_device, get_device
from .errors import ErrorCode, OpenRegError
from .stream import Stream, _Queue, current_stream


class Event:
    """A marker on a stream. ``enable_timing`` makes it take a timestamp when reached."""

    def __init__(self, enable_timing: bool = False, device: int | None = None) -> None:
        self.enable_timing = bool(enable_timing)
        self.device = None if device is None else check_device(device)
        self._queue: _Queue | None = None
        self._seq = 0
        self._time_ns: int | None = None
        self._clock: dict | None = None  # the stream sanitizer's clock of the recorded point
        self._sim_time: float | None = None  # simulated seconds at the record, when simulated time is on
        self.capture = None  # the graph capture (openreg.graph) the last record was made into, if any
        self.point = None  # where in that capture

    def __repr__(self) -> str:
        recorded = self._queue is not None
        return f"openreg.Event(device={self.device}, enable_timing={self.enable_timing}, recorded={recorded})"

    # LITERALINCLUDE START: EVENT RECORD
    def record(self, stream: Stream | None = None) -> None:
        """Capture all work launched on ``stream`` so far (current stream by default)."""
        stream = current_stream(get_device() if self.device is None else self.device) if stream is None else stream
        if self.device is not None and stream.device != self.device:
            raise OpenRegError(
                ErrorCode.INVALID_HANDLE,
                f"event on openreg:{self.device} cannot be recorded on a stream of openreg:{stream.device}",
            )
        self.device = stream.device
        self._time_ns = None
        for hook in hooks.event_record:
            if hook(self, stream._q):
                self._queue = self._clock = self._sim_time = None
                return  # a point of the capture (openreg.graph), for the streams that fork from or join it
        self.capture = None
        if self.enable_timing:
            self._seq = stream.launch(self._stamp, name="event_record", cost=timing.FREE)
        else:
            self._seq = stream.launched
        self._queue = stream._q
        self._clock = self._sim_time = None  # the sanitizer's clock and the timing model's time, while they are on
        for hook in hooks.event_recorded:
            hook(self, stream)

    def _stamp(self) -> None:
        self._time_ns = time.perf_counter_ns()
    # LITERALINCLUDE END: EVENT RECORD

    def pending(self) -> tuple[_Queue, int] | None:
        """``(queue, seq)`` still to be reached, or None if recorded work is done (or never recorded)."""
        if self._queue is None or self._queue.done >= self._seq:
            return None
        return self._queue, self._seq

    def query(self) -> bool:
        """True if the work captured by the last record has finished (or nothing was recorded)."""
        if self.capture is not None:
            return self.capture.event_done(self, "a query")
        if self.pending() is not None:
            return False
        if self._queue is not None:
            self._queue.settle()  # a host that saw its work finish finds device memory closed
        for hook in hooks.event_waited:  # and is ordered after it (the sanitizer)
            hook(self)
        return True

    def synchronize(self) -> None:
        """Block until the captured work has finished."""
        if self.capture is not None:
            self.capture.event_done(self, "a synchronize")
        elif self._queue is not None:
            self._queue.wait_for(self._seq)
            for hook in hooks.event_waited:
                hook(self)

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds between this event and ``end``, both recorded, timed and complete."""
        for event, which in ((self, "start"), (end, "end")):
            if not event.enable_timing:
                raise OpenRegError(
                    ErrorCode.INVALID_HANDLE,
                    f"elapsed_time: the {which} event was created without enable_timing=True",
                )
            if event.capture is not None:
                raise OpenRegError(ErrorCode.CAPTURED_EVENT,
                                   f"elapsed_time: the {which} event was recorded into a graph capture: it has no time")
            if event._queue is None:
                raise OpenRegError(ErrorCode.INVALID_HANDLE, f"elapsed_time: the {which} event was never recorded")
        if self.device != end.device:
            raise OpenRegError(
                ErrorCode.INVALID_VALUE,
                f"elapsed_time: events are on different devices (openreg:{self.device} and openreg:{end.device})",
            )
        if not (self.query() and end.query()):
            raise OpenRegError(ErrorCode.NOT_READY, "elapsed_time: an event has not completed yet; synchronize first")
        # LITERALINCLUDE START: EVENT SIMULATED TIME
        if (self._sim_time is None) != (end._sim_time is None):
            raise OpenRegError(
                ErrorCode.INVALID_VALUE,
                "elapsed_time: one event was recorded with simulated time on and the other with it off",
            )
        if self._sim_time is not None:  # the timing model's clock (openreg/timing): simulated milliseconds
            return (end._sim_time - self._sim_time) * 1e3
        # LITERALINCLUDE END: EVENT SIMULATED TIME
        return (end._time_ns - self._time_ns) / 1e6
