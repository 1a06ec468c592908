"""``torch.openreg.Stream`` / ``Event`` and the current-stream functions.

They subclass the device-agnostic ``torch.Stream`` and ``torch.Event``, whose
methods reach the runtime through the bridge's DeviceGuardImpl.
"""

from __future__ import annotations

from typing import Any

import torch

import openreg

from .state import _index, _lazy_init


# LITERALINCLUDE START: STREAM CLASSES
class _OpenRegType(type):
    """``isinstance(x, torch.openreg.Stream)`` holds for any openreg ``torch.Stream`` (same for Event)."""

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, cls._base) and obj.device.type == "openreg"


class Stream(torch.Stream, metaclass=_OpenRegType):
    """``torch.openreg.Stream(device=None, priority=0)``: a ``torch.Stream`` on an openreg device.

    A subclass for what ``torch.cuda.Stream`` adds to ``torch.Stream``: ``priority`` (the runtime
    stream's, so a priority outside :meth:`priority_range` reads back as the nearest one, as on CUDA)
    and ``priority_range()``. PyTorch's C++ methods take it as a ``torch.Stream``. ``current_stream``
    and ``default_stream`` return it too, as ``torch.cuda``'s return ``torch.cuda.Stream``.
    """

    _base = torch.Stream

    def __new__(cls, device: Any = None, priority: int = 0, **kwargs: Any) -> Stream:
        if "stream_id" in kwargs:  # an existing stream (stream_id, device_index, device_type), as torch.Stream takes
            return super().__new__(cls, **kwargs)
        _lazy_init()
        if isinstance(device, int) and device < 0:
            device = None  # a negative index is the current device, as torch.cuda.Stream takes it
        return super().__new__(cls, device=torch.device("openreg", _index(device)), priority=priority)

    @property
    def priority(self) -> int:
        """The stream's priority, 0 (the default, least urgent) to -3; lower numbers are higher priorities, as
        on CUDA. A higher-priority stream's kernels take the device's next free execution slot first."""
        return openreg.get_stream(self.device_index, self.stream_id).priority

    @staticmethod
    def priority_range() -> tuple[int, int]:
        """``(least, greatest)`` priority, as ``torch.cuda.Stream.priority_range()`` on current GPUs: ``(0, -3)``."""
        return openreg.PRIORITY_LOW, openreg.PRIORITY_HIGH


def _as_stream(s: torch.Stream) -> Stream:
    return Stream(stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type)


class Event(metaclass=_OpenRegType):
    """``torch.openreg.Event(enable_timing=False)``: a ``torch.Event`` on openreg."""

    _base = torch.Event

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> torch.Event:
        return torch.Event(device="openreg", enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
# LITERALINCLUDE END: STREAM CLASSES


# LITERALINCLUDE START: CURRENT STREAM
def current_stream(device: Any = None) -> Stream:
    """The calling thread's current stream on a device."""
    _lazy_init()
    return _as_stream(torch._C._accelerator_getStream(_index(device)))


def default_stream(device: Any = None) -> Stream:
    """The default stream (id 0) of a device."""
    s = current_stream(device)
    return Stream(stream_id=0, device_index=s.device_index, device_type=s.device_type)


def _check_openreg(stream: torch.Stream) -> None:
    if not isinstance(stream, Stream):  # (the metaclass's test: a torch.Stream on an openreg device)
        raise ValueError(f"expected an openreg stream, got a stream on {stream.device}")


def set_stream(stream: torch.Stream) -> None:
    """Make ``stream`` the current stream of its device."""
    if stream is not None:
        _check_openreg(stream)
        torch._C._accelerator_setStream(stream)


class stream:
    """Context manager selecting a stream (and its device), like ``torch.cuda.stream``."""

    def __init__(self, stream: torch.Stream | None) -> None:
        if stream is not None:
            _check_openreg(stream)
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
# LITERALINCLUDE END: CURRENT STREAM


StreamContext = stream  # torch.cuda's name for the same context manager


def ExternalStream(stream_id: int, device: Any = None) -> Stream:  # noqa: N802 - torch.cuda's class name
    """A ``torch.Stream`` for a stream created directly with the runtime (``openreg.Stream``).

    Like ``torch.cuda.ExternalStream``, PyTorch does not own it: the runtime stream object must stay
    alive while PyTorch uses it.
    """
    index = _index(device)
    openreg.get_stream(index, stream_id)  # raises INVALID_HANDLE for an unknown stream
    return Stream(stream_id=stream_id, device_index=index, device_type=current_stream(index).device_type)


def get_stream_from_external(data_ptr: int, device: Any = None) -> torch.Stream:
    """``torch.cuda.get_stream_from_external``: a ``torch.Stream`` for a runtime stream, named by its id
    (openreg's stream handle, as ``cudaStream_t`` is CUDA's): :func:`ExternalStream`."""
    return ExternalStream(data_ptr, device)
