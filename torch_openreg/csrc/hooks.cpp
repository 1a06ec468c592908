// PrivateUse1HooksInterface: how ATen asks the backend about itself (init,
// availability, devices, generators, pinned memory, pointers, storage resize).
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <c10/core/DeviceGuard.h>

#include <algorithm>

#include "allocator.h"
#include "bridge.h"

namespace openreg {
namespace {

// LITERALINCLUDE START: HOOKS
struct Hooks final : public at::PrivateUse1HooksInterface {
  bool isBuilt() const override { return true; }
  bool isAvailable() const override {
    try {
      return deviceCount() > 0;
    } catch (...) {
      return false; // must not throw: a broken runtime is "not available"
    }
  }
  void init() const override { call("init"); }
  bool hasPrimaryContext(c10::DeviceIndex index) const override {
    return call<bool>("has_primary_context", index);
  }
  c10::DeviceIndex deviceCount() const override { return call<c10::DeviceIndex>("device_count"); }
  c10::DeviceIndex getCurrentDevice() const override { return call<c10::DeviceIndex>("get_device"); }
  void setCurrentDevice(c10::DeviceIndex index) const override { call("set_device", index); }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex index) const override {
    return call<c10::DeviceIndex>("exchange_device", index);
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex index) const override { return exchangeDevice(index); }

  const at::Generator& getDefaultGenerator(c10::DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex index) const override { return new_generator(index); }

  at::Device getDeviceFromPtr(void* data) const override {
    auto index = call<c10::DeviceIndex>("pointer_device", reinterpret_cast<uintptr_t>(data));
    TORCH_CHECK(index >= 0, "pointer ", data, " is not openreg device memory");
    return device(index);
  }
  bool isPinnedPtr(const void* data) const override {
    return call<bool>("is_pinned", reinterpret_cast<uintptr_t>(data));
  }
  at::Allocator* getPinnedMemoryAllocator() const override { return host_allocator(); }

  // Grow or shrink a storage in place: new memory, a stream-ordered copy of the
  // bytes that fit, and the old block freed (the runtime defers it past the copy).
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    TORCH_CHECK(storage.resizable(), "Trying to resize storage that is not resizable");
    c10::DeviceGuard guard(storage.device());
    c10::DataPtr fresh = storage.allocator()->allocate(nbytes);
    size_t keep = std::min(nbytes, storage.nbytes());
    if (keep) {
      call("copy_device_to_device", reinterpret_cast<uintptr_t>(fresh.get()),
           reinterpret_cast<uintptr_t>(storage.data()), keep, storage.device().index());
    }
    storage.unsafeGetStorageImpl()->set_data_ptr_noswap(std::move(fresh));
    storage.unsafeGetStorageImpl()->set_nbytes(nbytes);
  }
};
// LITERALINCLUDE END: HOOKS

} // namespace

// LITERALINCLUDE START: REGISTER HOOKS
void register_hooks() {
  static bool done = false;
  if (!done) {
    at::RegisterPrivateUse1HooksInterface(new Hooks());
    done = true;
  }
}
// LITERALINCLUDE END: REGISTER HOOKS

} // namespace openreg
