"""openreg: a simulated accelerator and its driver/runtime, in pure Python.

The API mirrors the CUDA runtime (see docs/runtime.md for the table). It never
imports torch: PyTorch is one client of this runtime, through ``torch_openreg``.
"""

from . import activity, fault, hooks, launch_blocking, sanitizer, timing  # noqa: F401  (hooks register at import)
from .copy import MemcpyKind, memcpy, memcpy_async, memcpy_dtoh, memcpy_dtoh_into, memcpy_htod, wait_to_load
from .device import (
    DeviceProperties,
    device_capacity,
    device_count,
    exchange_device,
    get_device,
    get_device_properties,
    set_device,
)
from .errors import ErrorCode, OpenRegError
from .event import Event
from .graph import CaptureMode, Graph, begin_capture, end_capture, is_capturing, refuse_capture
from .launch_blocking import LAUNCH_BLOCKING
from .memory import (
    IpcHandle,
    PointerAttributes,
    free,
    host_free,
    host_malloc,
    ipc_export,
    ipc_open,
    mem_get_info,
    memory_used,
    pointer_attributes,
    view_address,
)
from .memory import malloc as _malloc
from .stream import (
    PRIORITY_HIGH,
    PRIORITY_LOW,
    Stream,
    add_launch_observer,
    current_stream,
    default_stream,
    get_stream,
    remove_launch_observer,
    set_launch_hook,
    set_stream,
    synchronize,
)


def malloc(size: int, device: int | None = None) -> int:
    """Allocate device memory on ``device`` (the current device by default)."""
    fault.install()
    device = get_device() if device is None else device
    ptr = _malloc(size, device)
    if hooks.allocated:  # the stream sanitizer: where the memory was handed out, for its reports
        for hook in hooks.allocated:
            hook(ptr, size, device, None)
    return ptr


def launch(fn, *args, buffers=(), stream: Stream | None = None, name: str = "kernel", writes=None,
           cost: timing.Cost | None = None) -> int:
    """Queue ``fn(*args)`` on ``stream`` (the current stream by default) with ``buffers`` pinned (``fn`` reaches
    them through :func:`view_address`);
    ``writes``: those of them it writes (for the stream sanitizer; None: any of them); ``cost`` is what the
    timing model charges for it when simulated time is on (``openreg.timing``)."""
    return (stream or current_stream()).launch(fn, *args, buffers=buffers, name=name, writes=writes, cost=cost)


__all__ = [
    "CaptureMode", "DeviceProperties", "ErrorCode", "Event", "Graph", "begin_capture", "end_capture", "is_capturing",
    "refuse_capture",
    "LAUNCH_BLOCKING", "MemcpyKind", "OpenRegError", "IpcHandle",
    "ipc_export", "ipc_open",
    "PRIORITY_HIGH", "PRIORITY_LOW", "PointerAttributes", "Stream", "add_launch_observer",
    "current_stream", "default_stream", "device_capacity", "device_count", "exchange_device", "free",
    "get_device", "get_device_properties", "get_stream", "host_free", "host_malloc", "launch", "malloc",
    "mem_get_info", "memcpy", "memcpy_async", "memcpy_dtoh", "memcpy_dtoh_into", "memcpy_htod", "memory_used",
    "pointer_attributes", "view_address", "wait_to_load",
    "remove_launch_observer", "set_device", "set_launch_hook", "set_stream", "synchronize",
]
