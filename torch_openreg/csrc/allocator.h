#pragma once

#include <c10/core/Allocator.h>
#include <ATen/core/Generator.h>

namespace openreg {

// The device allocator registered for PrivateUse1 (allocates on the current device).
c10::Allocator* device_allocator();
// The allocator that allocates on device ``index`` (-1: the current device).
c10::Allocator* device_allocator(c10::DeviceIndex index);
// The pinned host allocator returned by the hooks' getPinnedMemoryAllocator.
c10::Allocator* host_allocator();
// The per-device default generators.
const at::Generator& default_generator(c10::DeviceIndex index);
at::Generator new_generator(c10::DeviceIndex index);
// The CPU generator whose state an openreg generator forwards to (kernels use it).
at::Generator cpu_generator(const at::Generator& gen);

} // namespace openreg
