// Device and pinned-host allocators: thin c10::Allocator shells over the
// runtime's malloc/free and host_malloc/host_free.
#include "allocator.h"

#include <c10/core/CPUAllocator.h>

#include "bridge.h"

namespace openreg {
namespace {

void free_device(void* ptr) { call_quietly("free", reinterpret_cast<uintptr_t>(ptr)); }

void free_host(void* ptr) { call_quietly("host_free", reinterpret_cast<uintptr_t>(ptr)); }

// LITERALINCLUDE START: DEVICE ALLOCATOR
struct DeviceAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    auto index = call<c10::DeviceIndex>("get_device");
    void* ptr = nbytes ? reinterpret_cast<void*>(call<uintptr_t>("malloc", nbytes, index)) : nullptr;
    return {ptr, ptr, &free_device, device(index)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_device; }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    call("copy_device_to_device", reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), count,
         call<c10::DeviceIndex>("get_device"));
  }
};
// LITERALINCLUDE END: DEVICE ALLOCATOR

// LITERALINCLUDE START: HOST ALLOCATOR
struct HostAllocator final : public c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* ptr = nbytes ? reinterpret_cast<void*>(call<uintptr_t>("host_malloc", nbytes)) : nullptr;
    return {ptr, ptr, &free_host, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &free_host; }
  void copy_data(void* dst, const void* src, std::size_t count) const override {
    default_copy_data(dst, src, count);
  }
};
// LITERALINCLUDE END: HOST ALLOCATOR

DeviceAllocator g_device_allocator;
HostAllocator g_host_allocator;

} // namespace

c10::Allocator* device_allocator() { return &g_device_allocator; }
c10::Allocator* host_allocator() { return &g_host_allocator; }

// LITERALINCLUDE START: REGISTER ALLOCATOR
REGISTER_ALLOCATOR(c10::DeviceType::PrivateUse1, &g_device_allocator);
// LITERALINCLUDE END: REGISTER ALLOCATOR

} // namespace openreg
