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

import openreg
from torch_openreg._runtime import SUPPORTED_DTYPES  # noqa: F401  (torch.openreg.SUPPORTED_DTYPES)
from torch_openreg.sync_debug import get_sync_debug_mode, set_sync_debug_mode
from torch_openreg.timing import device_profiles, get_device_profile, set_device_profile, simulate  # noqa: E402, I001

from . import amp, sanitizer  # noqa: F401  (torch.openreg.amp, torch.openreg.sanitizer)
from . import memory as _memory
from .graphed_callables import make_graphed_callables
from .graphs import (
    Graph,
    MemPool,
    graph,
    graph_pool_handle,
    is_current_stream_capturing,
    use_mem_pool,
)
from .legacy import STORAGE_TYPES, TENSOR_TYPES
from .memory import (
    OpenRegPluggableAllocator,
    caching_allocator_alloc,
    caching_allocator_delete,
    caching_allocator_disabled,
    caching_allocator_enable,
    change_current_allocator,
    device_memory_used,
    empty_cache,
    get_allocator_backend,
    get_per_process_memory_fraction,
    host_memory_stats,
    host_memory_stats_as_nested_dict,
    list_gpu_processes,
    max_memory_allocated,
    max_memory_cached,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_cached,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_stats_as_nested_dict,
    memory_summary,
    reset_accumulated_host_memory_stats,
    reset_accumulated_memory_stats,
    reset_max_memory_allocated,
    reset_max_memory_cached,
    reset_peak_host_memory_stats,
    reset_peak_memory_stats,
    set_per_process_memory_fraction,
)
from .monitoring import clock_rate, memory_usage, power_draw, temperature, utilization
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
    DeferredOpenRegCallError,
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
    get_stream_from_external,
    set_stream,
    stream,
)

_memory.MemPool, _memory.use_mem_pool = MemPool, use_mem_pool  # torch.cuda.memory has them too
globals().update(TENSOR_TYPES)  # torch.openreg.FloatTensor, ...
globals().update(STORAGE_TYPES)  # torch.openreg.FloatStorage, ...
OutOfMemoryError = torch.OutOfMemoryError  # what an openreg allocation that does not fit raises
AcceleratorError = torch.AcceleratorError  # what every other openreg driver error is an instance of
has_half = True

# `import torch.openreg.amp` (and .memory, .random, .streams) finds these modules instead of loading copies.
for _name in ("amp", "graphs", "memory", "monitoring", "random", "sanitizer", "streams"):
    sys.modules[f"torch.openreg.{_name}"] = sys.modules[f"{__name__}.{_name}"]

__all__ = [
    "ExternalStream", "StreamContext", "device_of", "is_bf16_supported",
    "Event", "Stream", "current_device", "current_stream", "default_generators", "default_stream", "device",
    "device_count", "get_amp_supported_dtype", "get_device_capability", "get_device_name", "get_device_properties",
    "get_rng_state",
    "get_rng_state_all", "init", "initial_seed", "is_available", "is_initialized", "manual_seed",
    "manual_seed_all", "seed", "seed_all", "set_device", "set_rng_state", "set_rng_state_all", "set_stream",
    "stream", "synchronize",
    # the timing model (docs/timing.md): simulated device time on a device profile
    "device_profiles", "get_device_profile", "set_device_profile", "simulate",
    "empty_cache", "get_per_process_memory_fraction", "host_memory_stats", "max_memory_allocated",
    "max_memory_reserved", "mem_get_info", "memory_allocated", "memory_reserved", "memory_snapshot", "memory_stats",
    "memory_stats_as_nested_dict", "memory_summary", "reset_accumulated_memory_stats", "reset_max_memory_allocated",
    "reset_peak_memory_stats", "set_per_process_memory_fraction",
    # the rest of torch.cuda's names that apply to openreg (docs/cuda_api.md maps every one)
    "AcceleratorError", "DeferredOpenRegCallError", "OpenRegPluggableAllocator", "OutOfMemoryError",
    "caching_allocator_alloc", "caching_allocator_delete", "caching_allocator_disabled", "caching_allocator_enable",
    "can_device_access_peer", "change_current_allocator", "clock_rate", "device_memory_used",
    "get_allocator_backend", "get_arch_list", "get_stream_from_external", "get_sync_debug_mode", "has_half",
    "host_memory_stats_as_nested_dict", "ipc_collect", "is_tf32_supported", "list_gpu_processes",
    "max_memory_cached", "memory_cached", "memory_usage", "power_draw", "reset_accumulated_host_memory_stats",
    "reset_max_memory_cached", "reset_peak_host_memory_stats", "set_sync_debug_mode", "temperature", "utilization",
    *TENSOR_TYPES, *STORAGE_TYPES,
    "Graph", "MemPool", "graph", "graph_pool_handle", "is_current_stream_capturing", "make_graphed_callables",
    "use_mem_pool",
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
    for index in range(openreg.device_count()):
        try:
            openreg.synchronize(index)
        except openreg.OpenRegError:
            pass
# LITERALINCLUDE END: DRAIN AT EXIT


# LITERALINCLUDE START: DEVICE FUNCTIONS
def is_available() -> bool:
    """True when the runtime reports at least one device."""
    return openreg.device_count() > 0


def device_count() -> int:
    """Number of openreg devices."""
    return openreg.device_count()


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


def get_device_properties(device: Any = None) -> openreg.DeviceProperties:
    """Name, total memory, capability and processor count of a device."""
    _lazy_init()
    return openreg.get_device_properties(_index(device))


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
    """bfloat16 works on openreg (its kernels are the CPU's); False without a device, as torch.cuda's."""
    return is_available()


# LITERALINCLUDE START: PEERS AND ARCHITECTURES
def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    """Whether ``device`` can read ``peer_device``'s memory directly: every two distinct openreg devices
    can (peer copies run on the destination's stream); a device is not its own peer, as in CUDA."""
    index, peer = _index(device), _index(peer_device)
    openreg.device.check_device(index)
    openreg.device.check_device(peer)
    return index != peer


def get_arch_list() -> list[str]:
    """The device architectures openreg's kernels are built for: ``or_<major><minor>`` of each device's
    capability (``f"or_{major}{minor}" in get_arch_list()`` checks support, as ``sm_XY`` does for CUDA)."""
    return sorted({f"or_{p.major}{p.minor}" for p in map(openreg.get_device_properties, range(openreg.device_count()))})


def is_tf32_supported() -> bool:
    """TF32 matmuls are computed on openreg (``torch.backends.openreg.matmul.allow_tf32``); False without a
    device, as torch.cuda's."""
    return is_available()
# LITERALINCLUDE END: PEERS AND ARCHITECTURES


def ipc_collect() -> None:
    """Release what openreg's IPC holds once tensors shared with other processes are gone.

    A received tensor's mapping is closed as soon as its last tensor dies, and a sender's allocation
    follows its tensor (there are no reference-count files, unlike CUDA's). What remains is Python
    garbage that still holds received or sent storages, and cached blocks of exported allocations:
    both are collected here.
    """
    import gc

    _lazy_init()
    gc.collect()
    for index in range(openreg.device_count()):
        synchronize(index)
    empty_cache()
