"""The one error type of the simulated driver, with CUDA-like numeric codes.

Every runtime call that fails raises :class:`OpenRegError`; the code says what
kind of failure it is (so callers can map it, e.g. OUT_OF_MEMORY to
``torch.OutOfMemoryError``) and the message names the device, pointer and size.
"""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Driver error codes; the numbers follow ``cudaError_t`` where one exists."""

    INVALID_VALUE = 1
    OUT_OF_MEMORY = 2
    NOT_INITIALIZED = 3
    INVALID_POINTER = 17
    INVALID_MEMCPY_DIRECTION = 21
    INVALID_DEVICE = 101
    INVALID_HANDLE = 400
    NOT_READY = 600
    DOUBLE_FREE = 701
    LAUNCH_FAILURE = 719
    NOT_SUPPORTED = 801
    STREAM_CAPTURE_UNSUPPORTED = 900
    STREAM_CAPTURE_INVALIDATED = 901
    STREAM_CAPTURE_MERGE = 902
    STREAM_CAPTURE_UNMATCHED = 903
    STREAM_CAPTURE_UNJOINED = 904
    STREAM_CAPTURE_ISOLATION = 905
    STREAM_CAPTURE_IMPLICIT = 906
    CAPTURED_EVENT = 907


# LITERALINCLUDE START: ERROR CLASS
class OpenRegError(RuntimeError):
    """A failed driver call: ``code`` is an :class:`ErrorCode`, ``str()`` is the message.

    ``OpenRegError(code, message)`` creates an instance of the class a client registered with
    :func:`set_error_class` (a subclass that is also the client framework's device error type:
    ``torch.AcceleratorError`` for torch_openreg), so every driver error is one for the client too.
    """

    def __new__(cls, *args: object, **kwargs: object) -> OpenRegError:
        if cls is OpenRegError and _error_class is not None:
            cls = _error_class
        return super().__new__(cls, *args, **kwargs)

    def __init__(self, code: ErrorCode, message: str) -> None:
        self.code = ErrorCode(code)
        self.message = message
        super().__init__(f"openreg error {self.code.name} ({int(self.code)}): {message}")


_error_class: type[OpenRegError] | None = None


def set_error_class(cls: type[OpenRegError] | None) -> None:
    """Make ``OpenRegError(...)`` create instances of ``cls`` (a subclass of OpenRegError; None: itself)."""
    global _error_class
    if cls is not None and not issubclass(cls, OpenRegError):
        raise TypeError(f"{cls!r} is not a subclass of OpenRegError")
    _error_class = cls
    _failure_types.clear()
# LITERALINCLUDE END: ERROR CLASS


# LITERALINCLUDE START: LAUNCH FAILURE
_failure_types: dict[type, type] = {}


def launch_failure(message: str, cause: BaseException) -> OpenRegError:
    """The LAUNCH_FAILURE a kernel that raised ``cause`` reports at the next synchronizing call.

    It is an :class:`OpenRegError` and also an instance of the kernel's own exception type
    (``except IndexError`` catches an out-of-bounds index found asynchronously, as it catches the
    CPU's), where Python can combine the two; the kernel's exception is its ``__cause__``.
    """
    kind = type(cause)
    cls = _failure_types.get(kind)
    if cls is None:
        cls = base = _error_class or OpenRegError
        if issubclass(kind, Exception) and not issubclass(kind, OpenRegError):
            try:
                cls = type(f"OpenReg{kind.__name__}", (base, kind), {"__module__": __name__})
            except TypeError:  # an exception type with its own instance layout: not combinable
                pass
        _failure_types[kind] = cls
    error = cls(ErrorCode.LAUNCH_FAILURE, message)
    error.__cause__ = cause
    return error
# LITERALINCLUDE END: LAUNCH FAILURE
