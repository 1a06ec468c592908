"""Devices of the simulated accelerator: how many, their properties, the current one.

How many devices there are and their capacity come from the environment
(``OPENREG_DEVICE_COUNT``, ``OPENREG_DEVICE_MEMORY``: :mod:`openreg.settings`).
Capacity is accounted, not reserved: pages are only committed when a kernel or
copy writes them.

The current device is thread-local, like the current CUDA context.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from . import settings
from .errors import ErrorCode, OpenRegError

_COUNT = settings.DEVICE_COUNT
_CAPACITY = settings.DEVICE_MEMORY


@dataclass(frozen=True)
class DeviceProperties:
    """What ``cudaGetDeviceProperties`` would report, for the simulated device."""

    index: int
    name: str
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int


# LITERALINCLUDE START: RUNTIME DEVICE
def device_count() -> int:
    """Number of simulated devices (``OPENREG_DEVICE_COUNT``)."""
    return _COUNT


def check_device(index: int) -> int:
    """Return ``index`` if it names a device, else raise INVALID_DEVICE."""
    if type(index) is int and 0 <= index < _COUNT:
        return index
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < _COUNT:
        raise OpenRegError(
            ErrorCode.INVALID_DEVICE,
            f"invalid device ordinal {index!r}: openreg has {_COUNT} device(s)"
            + (f", valid ordinals are 0..{_COUNT - 1}" if _COUNT else ""),
        )
    return index


class _Local(threading.local):
    """The calling thread's current device; the class default (0, like a fresh CUDA thread) spares
    threads that never set one an ``AttributeError`` raised and caught on every look-up."""

    device = 0


_local = _Local()


def get_device() -> int:
    """The calling thread's current device (0 until set, like a fresh CUDA thread)."""
    return _local.device


def set_device(index: int) -> None:
    """Make ``index`` the calling thread's current device."""
    _local.device = check_device(index)


def exchange_device(index: int) -> int:
    """Set the current device and return the previous one (for device guards)."""
    previous = get_device()
    if index != previous:
        set_device(index)
    return previous
# LITERALINCLUDE END: RUNTIME DEVICE


# LITERALINCLUDE START: FORK POISON
# A child forked after the runtime started has copies of its state but none of its
# worker threads: like a CUDA context, the runtime cannot be used there.
_started = False
_forked = False


def start() -> None:
    """Mark the runtime in use (first allocation or stream); refuse if this is a forked child."""
    global _started
    if _forked:
        raise OpenRegError(
            ErrorCode.NOT_INITIALIZED,
            "Cannot re-initialize OpenReg in forked subprocess. To use OpenReg with multiprocessing, "
            "you must use the 'spawn' start method",
        )
    _started = True


def _after_fork_in_child() -> None:
    global _forked
    _forked = _forked or _started


def forked() -> bool:
    """True in a child forked after the runtime started (the runtime is unusable there)."""
    return _forked


os.register_at_fork(after_in_child=_after_fork_in_child)
# LITERALINCLUDE END: FORK POISON


_CORES = os.cpu_count() or 1  # asked once: os.cpu_count() reads sysfs (~17 us), and PyTorch asks per backward


def get_device_properties(index: int) -> DeviceProperties:
    """Static properties of a device."""
    check_device(index)
    return DeviceProperties(
        index=index,
        name="OpenReg Simulated Device",
        total_memory=_CAPACITY,
        major=1,
        minor=0,
        multi_processor_count=_CORES,
    )


def device_capacity(index: int) -> int:
    """Bytes of memory the device has."""
    check_device(index)
    return _CAPACITY


def clock_rate(index: int) -> int:
    """The device's clock in MHz: the host CPU's current average, since its cores run the device's kernels."""
    check_device(index)
    try:
        with open("/proc/cpuinfo") as f:
            rates = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
    except OSError:
        rates = []
    if not rates:
        raise OpenRegError(ErrorCode.NOT_SUPPORTED, f"openreg:{index}: the host does not report its clock rate")
    return round(sum(rates) / len(rates))
