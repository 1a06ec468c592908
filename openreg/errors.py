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


class OpenRegError(RuntimeError):
    """A failed driver call: ``code`` is an :class:`ErrorCode`, ``str()`` is the message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        self.code = ErrorCode(code)
        self.message = message
        super().__init__(f"openreg error {self.code.name} ({int(self.code)}): {message}")


def fail(code: ErrorCode, message: str) -> OpenRegError:
    """Build the error to raise; keeps call sites on one line."""
    return OpenRegError(code, message)
