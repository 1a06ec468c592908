"""A user's allocator in place of the caching allocator (``torch.cuda.CUDAPluggableAllocator``).

CUDA's pluggable allocator is a pair of C functions in a shared library, called with a size, a device
and a stream. The openreg driver's API is Python (``openreg.malloc`` / ``openreg.free``), so openreg's
pluggable allocator is a pair of Python callables with the same arguments; the bridge does not change:
it asks ``torch_openreg._runtime`` for memory, and that now forwards to the pair.

As with CUDA, the swap must happen before the first device allocation, the allocator keeps no memory
statistics (``torch.openreg.memory_stats`` and friends raise), and ``record_stream`` and
``empty_cache`` call the user's functions when given.
"""

from __future__ import annotations

from collections.abc import Callable

import openreg

from .caching_allocator import _owners


# LITERALINCLUDE START: PLUGGABLE ALLOCATOR
class PluggableAllocator:
    """``alloc_fn(size, device, stream_id) -> ptr`` and ``free_fn(ptr, size, device, stream_id)``.

    Optional: ``record_stream_fn(ptr, stream_id)`` and ``empty_cache_fn()``.
    """

    def __init__(self, alloc_fn: Callable[[int, int, int], int], free_fn: Callable[[int, int, int, int], None],
                 record_stream_fn: Callable[[int, int], None] | None = None,
                 empty_cache_fn: Callable[[], None] | None = None) -> None:
        for name, fn in (("alloc_fn", alloc_fn), ("free_fn", free_fn)):
            if not callable(fn):
                raise TypeError(f"{name} must be callable, got {fn!r}")
        self.alloc_fn, self.free_fn = alloc_fn, free_fn
        self.record_stream_fn, self.empty_cache_fn = record_stream_fn, empty_cache_fn

    def for_device(self, device: int) -> _DeviceAllocator:
        return _DeviceAllocator(self, device)


class _DeviceAllocator:
    """What the runtime bridge calls for one device: the caching allocator's interface, forwarded."""

    def __init__(self, plugged: PluggableAllocator, device: int) -> None:
        self.plugged, self.device = plugged, device
        self.sizes: dict[int, tuple[int, int]] = {}  # ptr -> (size, stream id), for free_fn

    def malloc(self, size: int, stream: openreg.Stream) -> int:
        ptr = int(self.plugged.alloc_fn(size, self.device, stream.id))
        if ptr == 0 and size:
            raise openreg.OpenRegError(openreg.ErrorCode.OUT_OF_MEMORY,
                                       f"the pluggable allocator returned no memory for {size} bytes on "
                                       f"openreg:{self.device}")
        self.sizes[ptr] = (size, stream.id)
        _owners[ptr] = self  # the bridge's free finds the allocator of a pointer here
        return ptr

    def free(self, ptr: int) -> None:
        size, stream_id = self.sizes.pop(ptr)
        del _owners[ptr]
        self.plugged.free_fn(ptr, size, self.device, stream_id)

    def record_stream(self, ptr: int, stream: openreg.Stream) -> None:
        if self.plugged.record_stream_fn is not None:
            self.plugged.record_stream_fn(ptr, stream.id)

    def empty_cache(self) -> None:
        if self.plugged.empty_cache_fn is not None:
            self.plugged.empty_cache_fn()
# LITERALINCLUDE END: PLUGGABLE ALLOCATOR
