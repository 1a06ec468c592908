// Device and pinned-host allocators: c10 allocator shells whose every decision
// (caching, pools, streams, statistics) is made by torch_openreg.memory in
// Python. The C++ side only converts between DataPtrs and plain pointers and
// copies statistics into PyTorch's structs.
#include "allocator.h"

#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/CPUAllocator.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <vector>

#include "block_cache.h"
#include "bridge.h"

namespace openreg {
namespace {

namespace cda = c10::CachingDeviceAllocator;
} // namespace

// profile_memory=True (profiler.cpp): report an allocation; free and report a free (false: not profiling).
void report_allocation(void* ptr, c10::DeviceIndex index);
bool free_reported(void* ptr) noexcept;

namespace {

void free_device(void* ptr) {
  block_cache_forget(ptr); // a block the cache knew, freed through Python: its reuses are told first
  if (free_reported(ptr)) return; // profile_memory=True: freed by the profiler, which reports it
  call_quietly("free", reinterpret_cast<uintptr_t>(ptr));
}

// LITERALINCLUDE START: CACHED ALLOCATE
// The deleter of a block allocated while the block cache was allowed: held for the next allocation of its
// size on its stream, unless a memory profile reports frees or the cache may not hold it.
void free_cached(void* ptr) {
  if (!c10::memoryProfilingEnabled() && block_cache_put(ptr)) return;
  free_device(ptr);
}

// The block cache's allocation, by the allocator of device ``fixed`` (-1: the current device). Python's keys
// say the device, and its current stream + 1 when the cache may hold or serve the block (0: not now). When
// the cache holds a block of this size, one call asks for the key and a block held for that stream is handed
// out; else the caching allocator allocates (after the cache has given its blocks back), in one call that
// also returns the key.
c10::DataPtr allocate_cached(size_t nbytes, c10::DeviceIndex fixed) {
  py::gil_scoped_acquire gil;
  if (block_cache_holds(nbytes)) {
    auto key = call<int64_t>("block_cache_key", fixed);
    auto where = static_cast<c10::DeviceIndex>(key & 0xffff);
    if (key >> 16) {
      if (void* ptr = block_cache_take(where, (key >> 16) - 1, nbytes)) return {ptr, ptr, &free_cached, device(where)};
    }
  }
  block_cache_flush(fixed);
  auto [address, key] = call<std::pair<uintptr_t, int64_t>>("block_cache_malloc", nbytes, fixed);
  void* ptr = reinterpret_cast<void*>(address);
  auto where = static_cast<c10::DeviceIndex>(key & 0xffff);
  if (!(key >> 16)) return {ptr, ptr, &free_device, device(where)};
  block_cache_adopt(ptr, where, (key >> 16) - 1, nbytes);
  return {ptr, ptr, &free_cached, device(where)};
}
// LITERALINCLUDE END: CACHED ALLOCATE

void free_host(void* ptr) { call_quietly("host_free", reinterpret_cast<uintptr_t>(ptr)); }

void fill(c10::CachingAllocator::Stat& stat, const py::dict& values) {
  stat.current = values["current"].cast<int64_t>();
  stat.peak = values["peak"].cast<int64_t>();
  stat.allocated = values["allocated"].cast<int64_t>();
  stat.freed = values["freed"].cast<int64_t>();
}

void fill(cda::StatArray& array, const py::dict& pools) {
  fill(array[0], pools["all"].cast<py::dict>());
  fill(array[1], pools["small_pool"].cast<py::dict>());
  fill(array[2], pools["large_pool"].cast<py::dict>());
}

// LITERALINCLUDE START: DEVICE ALLOCATOR
// One instance allocates on the current device (the one registered for
// PrivateUse1); one per device allocates there directly, so that factories
// need no device guard (two runtime calls fewer per tensor).
struct DeviceAllocator final : public c10::DeviceAllocator {
  explicit DeviceAllocator(c10::DeviceIndex fixed = -1) : fixed_(fixed) {}
  c10::DeviceIndex index() const { return fixed_ >= 0 ? fixed_ : call<c10::DeviceIndex>("get_device"); }
  c10::DataPtr allocate(size_t nbytes) override {
    if (nbytes && block_cache_enabled()) {
      if (!c10::memoryProfilingEnabled()) return allocate_cached(nbytes, fixed_);
      block_cache_flush(fixed_); // a memory profile reports every allocation: the allocator serves it, exact
    }
    auto where = index();
    void* ptr = nbytes ? reinterpret_cast<void*>(call<uintptr_t>("malloc", nbytes, where)) : nullptr;
    report_allocation(ptr, where); // profile_memory=True only
    return {ptr, ptr, &free_device, device(where)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_device; }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    call("copy_device_to_device", reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), count,
         index());
  }

  bool initialized() override { return true; }
  void emptyCache(c10::MempoolId_t) override { call("empty_cache"); }
  void recordStream(const c10::DataPtr& ptr, c10::Stream stream) override {
    if (ptr.get()) call("record_stream", reinterpret_cast<uintptr_t>(ptr.get()), stream.device_index(), stream.id());
  }
  cda::DeviceStats getDeviceStats(c10::DeviceIndex index) override {
    py::gil_scoped_acquire gil;
    py::dict stats = call<py::dict>("device_stats", index);
    cda::DeviceStats out;
    fill(out.allocation, stats["allocation"]);
    fill(out.segment, stats["segment"]);
    fill(out.active, stats["active"]);
    fill(out.inactive_split, stats["inactive_split"]);
    fill(out.allocated_bytes, stats["allocated_bytes"]);
    fill(out.reserved_bytes, stats["reserved_bytes"]);
    fill(out.active_bytes, stats["active_bytes"]);
    fill(out.inactive_split_bytes, stats["inactive_split_bytes"]);
    fill(out.requested_bytes, stats["requested_bytes"]);
    out.num_alloc_retries = stats["num_alloc_retries"].cast<int64_t>();
    out.num_ooms = stats["num_ooms"].cast<int64_t>();
    out.num_sync_all_streams = stats["num_sync_all_streams"].cast<int64_t>();
    out.num_device_alloc = stats["num_device_alloc"].cast<int64_t>();
    out.num_device_free = stats["num_device_free"].cast<int64_t>();
    fill(out.oversize_allocations, stats["oversize_allocations"].cast<py::dict>());
    fill(out.oversize_segments, stats["oversize_segments"].cast<py::dict>());
    return out;
  }
  void resetAccumulatedStats(c10::DeviceIndex index) override { call("reset_accumulated_stats", index); }
  void resetPeakStats(c10::DeviceIndex index) override { call("reset_peak_stats", index); }
  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex index) override {
    return call<std::pair<size_t, size_t>>("mem_get_info", index);
  }

 private:
  c10::DeviceIndex fixed_;
};
// LITERALINCLUDE END: DEVICE ALLOCATOR

// LITERALINCLUDE START: HOST ALLOCATOR
struct HostAllocator final : public at::HostAllocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nbytes ? reinterpret_cast<void*>(call<uintptr_t>("host_malloc", nbytes)) : nullptr;
    return {ptr, ptr, &free_host, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_host; }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    default_copy_data(dst, src, count);
  }
  bool record_event(void* ptr, void*, c10::Stream stream) override {
    return call<bool>("host_record_event", reinterpret_cast<uintptr_t>(ptr), stream.device_index(), stream.id());
  }
  void empty_cache() override { call("host_empty_cache"); }
  at::HostStats get_stats() override {
    py::gil_scoped_acquire gil;
    py::dict stats = call<py::dict>("host_stats");
    at::HostStats out;
    fill(out.allocations, stats["allocations"].cast<py::dict>());
    fill(out.allocated_bytes, stats["allocated_bytes"].cast<py::dict>());
    fill(out.active_requests, stats["active_requests"].cast<py::dict>());
    fill(out.active_bytes, stats["active_bytes"].cast<py::dict>());
    out.num_host_alloc = stats["num_host_alloc"].cast<int64_t>();
    out.num_host_free = stats["num_host_free"].cast<int64_t>();
    return out;
  }
  void reset_accumulated_stats() override { call("host_reset_accumulated_stats"); }
  void reset_peak_stats() override { call("host_reset_peak_stats"); }
};
// LITERALINCLUDE END: HOST ALLOCATOR

DeviceAllocator g_device_allocator;
HostAllocator g_host_allocator;

} // namespace

c10::Allocator* device_allocator() { return &g_device_allocator; }

c10::Allocator* device_allocator(c10::DeviceIndex index) {
  static std::once_flag once;
  static std::vector<std::unique_ptr<DeviceAllocator>> per_device;
  std::call_once(once, [] {
    auto count = call<c10::DeviceIndex>("device_count");
    for (c10::DeviceIndex i = 0; i < count; ++i) per_device.push_back(std::make_unique<DeviceAllocator>(i));
  });
  if (index == -1) return &g_device_allocator;
  if (index < 0 || index >= static_cast<c10::DeviceIndex>(per_device.size())) {
    call("check_device", index); // raises the runtime's INVALID_DEVICE error
  }
  return per_device[index].get();
}
c10::Allocator* host_allocator() { return &g_host_allocator; }

// LITERALINCLUDE START: REGISTER ALLOCATOR
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);
REGISTER_HOST_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_host_allocator);
// LITERALINCLUDE END: REGISTER ALLOCATOR

} // namespace openreg
