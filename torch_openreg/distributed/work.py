"""The ``Work`` an occl collective returns: a point on the stream it was launched on, like NCCL's.

``wait()`` makes the caller's current stream wait for that point and returns at once: the host
only blocks when asked (a timeout, ``OCCL_BLOCKING_WAIT=1``, or a barrier, whose point is to
hold the host). ``get_future()`` is complete and carries events of the collective's stream, so
``value()`` and callbacks are ordered on the stream too (what DDP's communication hooks use).
A collective that fails reports like any kernel: at the next synchronizing call, as an
``OpenRegError`` whose cause is the transport's error; the Work also keeps the error.
"""

from __future__ import annotations

import time

import torch

import openreg

from .streams import GroupStream

BLOCKING_WAIT = openreg.settings.OCCL_BLOCKING_WAIT


class Work:
    """Completion of one launch (or of a group of coalesced calls) on one device's stream."""

    def __init__(self, name: str, device: int, outputs: list[torch.Tensor], *, blocking: bool = False) -> None:
        self.name, self.device, self.outputs = name, device, outputs
        self.blocking = blocking  # barrier, receive from any source: wait() holds the host
        self.event = openreg.Event(device=device)
        self.stream: openreg.Stream | None = None  # the process group's stream the collective runs on
        self.caller: openreg.Stream | None = None  # the stream it was launched from, which gets its error
        self.group_stream: GroupStream | None = None
        self.kernel = f"occl:{name}"  # the kernel's name, in profiles and error messages
        self.ran = False  # its kernel has started
        self.error: str | None = None  # "Type: message" of the collective's failure
        self.source = -1  # the sender, once a receive from any source has run
        self._future: torch.futures.Future | None = None

    # LITERALINCLUDE START: OCCL WORK RECORD
    def record(self, stream: openreg.Stream) -> None:
        """Mark the launch just made on ``stream`` (the process group's stream) as this work's end."""
        self.stream = stream
        self.event.record(stream)

    def wait(self, timeout_ms: int = 0) -> bool:
        """Order the caller's current stream after the collective; block the host only if asked."""
        self.synchronize()
        if timeout_ms > 0 or self.blocking or BLOCKING_WAIT:
            self.block(timeout_ms)
        return True

    def synchronize(self) -> None:
        """``cudaStreamWaitEvent`` on the current stream of the collective's device."""
        stream = openreg.current_stream(self.device)
        before = stream.launched
        stream.wait_event(self.event)
        if self.group_stream is not None:
            self.group_stream.waited(stream, before)
    # LITERALINCLUDE END: OCCL WORK RECORD

    def block(self, timeout_ms: int = 0) -> None:
        """Hold the host until the collective ran, then report its error (and any earlier kernel's
        on its stream) as a synchronizing call does; ``timeout_ms > 0`` bounds the wait."""
        if timeout_ms > 0:
            deadline, nap = time.monotonic() + timeout_ms / 1000, 5e-5
            while not self.event.query():  # the stream's worker runs the collective meanwhile
                if time.monotonic() > deadline:
                    raise RuntimeError(f"occl: {self.name} on openreg:{self.device} did not complete within "
                                       f"{timeout_ms} ms (Work.wait timeout)")
                time.sleep(nap)
                nap = min(2 * nap, 5e-3)
        else:
            self.event.synchronize()
        if self.caller is not None:
            self.caller.check_error()

    def is_completed(self) -> bool:
        return self.event.query()

    def is_success(self) -> bool:
        return self.event.query() and self.error is None

    def error_message(self) -> str | None:
        return self.error

    def source_rank(self) -> int:
        if self.source < 0:
            raise RuntimeError("occl: the source rank is known once a receive from any source has completed")
        return self.source

    def result(self) -> list[torch.Tensor]:
        return self.outputs

    # LITERALINCLUDE START: OCCL FUTURE
    def get_future(self) -> torch.futures.Future:
        """A future that is complete, over events on the collective's stream: ``value()`` and callbacks
        make the caller's stream wait, the way ProcessGroupNCCL's futures do (``c10::ivalue::Future``
        with devices records and blocks on events through the device guard)."""
        if self._future is None:
            future = torch.futures.Future(devices=[torch.device("openreg", self.device)])
            previous = openreg.set_stream(self.stream)  # set_result records on the current stream
            try:
                future.set_result(self.outputs)
            finally:
                openreg.set_stream(previous)
            self._future = future
        return self._future
    # LITERALINCLUDE END: OCCL FUTURE

    def abort(self) -> None:
        """Nothing to cancel: a launched collective runs (or fails on the transport's timeout)."""


class Coalesced(Work):
    """A call made between ``start_coalescing`` and ``end_coalescing``: it completes with the group."""

    def __init__(self, name: str, device: int, outputs: list[torch.Tensor]) -> None:
        super().__init__(name, device, outputs)
        self.group: Work | None = None

    def join(self, group: Work) -> None:
        self.group = group
        self.event, self.stream = group.event, group.stream
        self.caller, self.group_stream = group.caller, group.group_stream

    def get_future(self) -> torch.futures.Future:
        if self.group is None:
            raise RuntimeError(f"occl: {self.name} was called inside a coalescing group; its future exists once "
                               "the group ends")
        return self.group.get_future()

    def synchronize(self) -> None:
        if self.group is None:
            raise RuntimeError(f"occl: {self.name} was called inside a coalescing group; wait for it after the "
                               "group ends (the work returned by end_coalescing or the coalescing manager)")
        super().synchronize()

    @property
    def error(self) -> str | None:  # type: ignore[override]
        return None if self.group is None else self.group.error

    @error.setter
    def error(self, value: str | None) -> None:
        pass
