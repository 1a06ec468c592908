"""``torch.openreg.Stream`` / ``Event`` and the current-stream functions.

They subclass the device-agnostic ``torch.Stream`` and ``torch.Event``, whose
methods reach the runtime through the bridge's DeviceGuardImpl.
"""

from __future__ import annotations

from typing import Any

import torch


class Stream(torch.Stream):
    """An openreg stream: ``Stream(device=None, priority=0)``; lower priority numbers are more urgent."""

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        if "stream_id" in kwargs:
            return super().__new__(cls, **kwargs)
        from . import _index, _lazy_init

        _lazy_init()
        return super().__new__(cls, device=torch.device("openreg", _index(device)), priority=priority)

    def __repr__(self) -> str:
        return f"<torch.openreg.Stream device={self.device} stream_id={self.stream_id}>"


class Event(torch.Event):
    """An openreg event: ``Event(enable_timing=False)``."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> Event:
        return super().__new__(cls, device="openreg", enable_timing=enable_timing, blocking=blocking,
                               interprocess=interprocess)


def _wrap(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


def current_stream(device: Any = None) -> Stream:
    """The calling thread's current stream on a device."""
    from . import _index, _lazy_init

    _lazy_init()
    return _wrap(torch._C._accelerator_getStream(_index(device)))


def default_stream(device: Any = None) -> Stream:
    """The default stream (id 0) of a device."""
    s = current_stream(device)
    return Stream(stream_id=0, device_index=s.device_index, device_type=s.device_type)


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream`` the current stream of its device."""
    if stream is not None:
        torch._C._accelerator_setStream(stream)


class stream:
    """Context manager selecting a stream (and its device), like ``torch.cuda.stream``."""

    def __init__(self, stream: torch.Stream | None) -> None:
        self.stream = stream

    def __enter__(self) -> torch.Stream | None:
        if self.stream is not None:
            self.prev = current_stream(self.stream.device_index)
            self.prev_device = torch._C._accelerator_exchangeDevice(self.stream.device_index)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc: object) -> None:
        if self.stream is not None:
            set_stream(self.prev)
            torch._C._accelerator_exchangeDevice(self.prev_device)
