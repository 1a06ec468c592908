"""``profile_memory=True``: the caching allocator's events, as the bridge reports them to the profiler.

CUDA's caching allocator calls ``c10::reportMemoryUsageToProfiler`` for each block it hands out or
takes back, with its totals after the change. openreg's allocator is Python, so the bridge makes the
report (only while a profiler records memory on that thread) and asks these for the numbers.
"""

from __future__ import annotations

from torch_openreg import _runtime
from torch_openreg.memory import owner


# LITERALINCLUDE START: PROFILED MEMORY
def allocated(ptr: int) -> tuple[int, int, int]:
    """(block size, allocated bytes, reserved bytes) just after the block at ``ptr`` was handed out."""
    alloc = owner(ptr)
    return alloc.active[ptr].size, alloc.stats.current("allocated_bytes"), alloc.stats.current("reserved_bytes")


def free(ptr: int) -> tuple[int, int, int, int] | None:
    """Free the block at ``ptr``; (device, block size, allocated, reserved) after it, or None if unknown."""
    try:
        alloc = owner(ptr)
        size = alloc.active[ptr].size
    except Exception:  # noqa: BLE001 - not a block of the caching allocator: free it the ordinary way
        _runtime.free(ptr)
        return None
    alloc.free(ptr)
    return alloc.device, size, alloc.stats.current("allocated_bytes"), alloc.stats.current("reserved_bytes")
# LITERALINCLUDE END: PROFILED MEMORY
