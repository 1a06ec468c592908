"""The bridge's block cache: the last freed blocks, reused by allocations of their size on their stream in C++.

A tensor freed and the next one of the same size allocated on the same stream (every step of a loop, an
operator's output after the last one's) cost two calls into Python and the caching allocator's work, about
4 µs of the launch path (docs/performance.md). The bridge (``csrc/block_cache.cpp``) keeps such a freed block
instead, still allocated in the allocator's books, and hands it to the next allocation of exactly that size
on that stream. The policy stays here and in the allocator:

* ``torch_openreg._runtime.block_cache_key`` says, per allocation, whether the cache may serve it (not while
  memory history is recorded, a graph capture or ``use_mem_pool`` routes allocations, the stream sanitizer
  watches them, caching is off or another allocator is plugged);
* whenever the allocator itself runs (an allocation the cache cannot serve) or is looked at
  (``caching_allocator.allocator()``: statistics, snapshots, ``empty_cache``), the cache first gives its
  blocks back and tells it how many reuses happened (``Stats.on_reuse``), so its statistics are those of the
  Python allocator alone, but for ``inactive_split``'s totals and peak (a reuse skips the split bookkeeping
  of the free and the allocation it stands for);
* a block another stream uses (``record_stream``) or a graph watches is freed through the allocator.

``OPENREG_CPP_LAUNCH=0`` leaves the cache off: the allocator then serves every allocation, the reference.
"""

from __future__ import annotations

import openreg
from openreg.settings import CPP_LAUNCH
from torch_openreg import _C

from . import caching_allocator

__all__ = ["enable", "enabled"]


# LITERALINCLUDE START: BLOCK CACHE SWITCH
def enable(on: bool) -> None:
    """Switch the block cache on or off; off, the blocks it holds go back to the allocator first."""
    _C._enable_block_cache(on)
    if not on:
        for device in range(openreg.device_count()):
            _C._flush_block_cache(device)
    caching_allocator.bridge_flush = _C._flush_block_cache if on else None
    caching_allocator.bridge_exclude = _C._block_cache_exclude if on else None
# LITERALINCLUDE END: BLOCK CACHE SWITCH


def enabled() -> bool:
    """Whether the bridge's block cache serves allocations."""
    return _C._block_cache_info()[0]


enable(CPP_LAUNCH)
