"""``torch.openreg``: the device module, shaped like ``torch.cuda``.

Initialization is lazy (the first call that needs the device runs
``_lazy_init``), calls made before it are queued (``_lazy_call``), and a process
forked after initialization refuses to use the device, like CUDA.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

import torch

import openreg as _rt

from . import amp  # noqa: F401  (torch.openreg.amp)
from .memory import (
    empty_cache,
    get_per_process_memory_fraction,
    host_memory_stats,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from .random import (
    _get_rng_state_offset,  # noqa: F401  (torch.cuda has them too)
    _set_rng_state_offset,  # noqa: F401
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .state import (  # noqa: F401  (torch.openreg._lazy_init and friends, as torch.cuda has them)
    SUPPORTED_DTYPES,
    _index,
    _is_in_bad_fork,
    _lazy_call,
    _lazy_init,
    _queued_calls,
    current_device,
    init,
    is_initialized,
)
from .streams import (
    Event,
    ExternalStream,
    Stream,
    StreamContext,
    current_stream,
    default_stream,
    set_stream,
    stream,
)

# `import torch.openreg.amp` (and .memory, .random, .streams) finds these modules instead of loading copies.
for _name in ("amp", "memory", "random", "streams"):
    sys.modules[f"torch.openreg.{_name}"] = sys.modules[f"{__name__}.{_name}"]

__all__ = [
    "ExternalStream", "StreamContext", "device_of", "is_bf16_supported",
    "Event", "Stream", "current_device", "current_stream", "default_generators", "default_stream", "device",
    "device_count", "get_amp_supported_dtype", "get_device_capability", "get_device_name", "get_device_properties",
    "get_rng_state",
    "get_rng_state_all", "init", "initial_seed", "is_available", "is_initialized", "manual_seed",
    "manual_seed_all", "seed", "seed_all", "set_device", "set_rng_state", "set_rng_state_all", "set_stream",
    "stream", "synchronize",
    "empty_cache", "get_per_process_memory_fraction", "host_memory_stats", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved", "memory_snapshot", "memory_stats",
    "memory_stats_as_nested_dict", "memory_summary", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
    "reset_peak_memory_stats", "set_per_process_memory_fraction",
]


# LITERALINCLUDE START: DRAIN AT EXIT
_pid = os.getpid()


@atexit.register
def _drain_at_exit() -> None:
    """Finish queued device work before the interpreter finalizes.

    A stream worker still running a kernel when finalization starts is killed as it retakes the
    GIL, inside PyTorch's C++ frames: the process aborts ("terminate called without an active
    exception"). Errors of kernels nobody synchronized are dropped, as a driver does at exit.
    """
    if os.getpid() != _pid:
        return  # a forked child: the stream workers stayed in the parent, their queues cannot drain here
    for index in range(_rt.device_count()):
        try:
            _rt.synchronize(index)
        except _rt.OpenRegError:
            pass
# LITERALINCLUDE END: DRAIN AT EXIT


# LITERALINCLUDE START: DEVICE FUNCTIONS
def is_available() -> bool:
    """True when the runtime reports at least one device."""
    return _rt.device_count() > 0


def device_count() -> int:
    """Number of openreg devices."""
    return _rt.device_count()


def set_device(device: Any) -> None:
    """Set the calling thread's current device."""
    _lazy_init()
    index = _index(device)
    if index >= 0:
        torch._C._accelerator_setDeviceIndex(index)


class device:
    """Context manager that changes the current device (like ``torch.cuda.device``)."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        _lazy_init()
        if self.idx >= 0:  # None or a negative index selects nothing, as in torch.cuda.device
            self.prev_idx = torch._C._accelerator_exchangeDevice(self.idx)

    def __exit__(self, *exc: object) -> None:
        if self.prev_idx >= 0:
            self.idx = torch._C._accelerator_maybeExchangeDevice(self.prev_idx)


def synchronize(device: Any = None) -> None:
    """Wait for all work on a device (default: current), raising errors of failed kernels."""
    _lazy_init()
    torch._C._accelerator_synchronizeDevice(_index(device))
# LITERALINCLUDE END: DEVICE FUNCTIONS


def get_device_properties(device: Any = None) -> _rt.DeviceProperties:
    """Name, total memory, capability and processor count of a device."""
    _lazy_init()
    return _rt.get_device_properties(_index(device))


def get_device_name(device: Any = None) -> str:
    """Name of a device."""
    return get_device_properties(device).name


def get_device_capability(device: Any = None) -> tuple[int, int]:
    """``(major, minor)`` of a device."""
    props = get_device_properties(device)
    return props.major, props.minor


def get_amp_supported_dtype() -> list[torch.dtype]:
    """Lower-precision dtypes autocast may use on openreg."""
    return [torch.float16, torch.bfloat16]


def _get_device_index(device: Any = None, optional: bool = False) -> int:
    return _index(device)


class device_of(device):
    """Context manager that makes the device of ``obj`` (a tensor or storage) current, if it is openreg."""

    def __init__(self, obj: Any) -> None:
        idx = obj.get_device() if getattr(obj, "device", None) is not None and obj.device.type == "openreg" else -1
        super().__init__(idx if idx >= 0 else None)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """bfloat16 works on openreg (its kernels are the CPU's)."""
    return True
