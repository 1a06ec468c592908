// The device allocator's block cache (block_cache.cpp): freed blocks reused by the next allocation of the
// same size on the same stream, without Python.
#pragma once

#include <c10/core/Device.h>

#include <cstddef>
#include <cstdint>

namespace openreg {

// Whether the cache is on (OPENREG_CPP_LAUNCH; set from Python at import).
bool block_cache_enabled();
// Whether a block of exactly ``nbytes`` is held (for any stream, on any device).
bool block_cache_holds(size_t nbytes);
// A held block of exactly ``nbytes`` for ``stream`` on ``device`` (its reuse counted), or nullptr.
void* block_cache_take(c10::DeviceIndex device, int64_t stream, size_t nbytes);
// A block the Python allocator handed out while the cache was allowed: its free may be held.
void block_cache_adopt(void* ptr, c10::DeviceIndex device, int64_t stream, size_t nbytes);
// Hold a freed block; false: not one the cache may hold (free it through Python, after block_cache_forget).
bool block_cache_put(void* ptr);
// Stop knowing a block that is freed through Python, telling the allocator its reuses (GIL not needed).
void block_cache_forget(void* ptr);
// Give ``device``'s (-1: every device's) held blocks back and tell the allocator the reuses (a Python error
// is raised as c10's).
void block_cache_flush(c10::DeviceIndex device);

} // namespace openreg
