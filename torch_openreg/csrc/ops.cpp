// The minimal operator set every backend provides in C++: tensor factories and
// the metadata operators (views, resize_, set_). None of them touches data.
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/Context.h>
#include <ATen/native/Resize.h>
#include <ATen/native/ResizeCommon.h>
#include <ATen/native/TensorFactories.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include "allocator.h"

namespace openreg {
namespace {

constexpr c10::DispatchKeySet kKeys(c10::DispatchKey::PrivateUse1);

c10::Device checked(std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  auto d = c10::device_or_default(device);
  TORCH_CHECK(d.is_privateuseone(), "openreg factory called for device ", d);
  TORCH_CHECK(!pin_memory.value_or(false), "only CPU tensors can be pinned; openreg memory is device memory");
  return d;
}

// LITERALINCLUDE START: FACTORY KERNELS
// torch.use_deterministic_algorithms(True) with torch.utils.deterministic.fill_uninitialized_memory:
// PyTorch's flag, which its CPU and CUDA factories and resize_ honour by filling new memory with NaN
// (or the largest integer); every backend's factories must do it themselves.
bool fill_uninitialized() {
  auto& context = at::globalContext();
  return C10_UNLIKELY(context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory());
}

at::Tensor empty_memory_format(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory, std::optional<c10::MemoryFormat> memory_format) {
  auto* allocator = device_allocator(checked(device, pin_memory).index()); // validates the index
  at::Tensor t = at::detail::empty_generic(size, allocator, kKeys, c10::dtype_or_default(dtype), memory_format);
  return fill_uninitialized() ? at::native::fill_empty_deterministic_(t) : t;
}

at::Tensor empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                         std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                         std::optional<bool> pin_memory) {
  auto* allocator = device_allocator(checked(device, pin_memory).index());
  at::Tensor t = at::detail::empty_strided_generic(size, stride, allocator, kKeys, c10::dtype_or_default(dtype));
  return fill_uninitialized() ? at::native::fill_empty_deterministic_(t) : t;
}
// LITERALINCLUDE END: FACTORY KERNELS

// LITERALINCLUDE START: RESIZE
// Make `self` have `size`/`stride` (contiguous when no stride), growing its
// storage through the hooks when it is too small: the resize_ policy every
// backend shares, with the byte copy left to the device.
void restride(const at::Tensor& self, c10::IntArrayRef size, std::optional<c10::IntArrayRef> stride) {
  auto* impl = self.unsafeGetTensorImpl();
  size_t itemsize = self.dtype().itemsize();
  size_t offset = impl->storage_offset();
  size_t needed;
  if (stride) {
    impl->set_sizes_and_strides(size, *stride);
    needed = at::detail::computeStorageNbytes(size, *stride, itemsize, offset);
  } else {
    impl->set_sizes_contiguous(size);
    needed = at::detail::computeStorageNbytesContiguous(size, itemsize, offset);
  }
  if (needed > self.storage().nbytes() && self.numel() > 0) {
    at::native::resize_bytes_nocuda(self.storage(), needed);
  }
}

const at::Tensor& resize_(const at::Tensor& self, c10::IntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  auto old_nbytes = static_cast<int64_t>(self.storage().nbytes());
  restride(self, size, std::nullopt);
  if (memory_format) {
    self.unsafeGetTensorImpl()->empty_tensor_restride(*memory_format);
  }
  if (fill_uninitialized()) {
    at::native::fill_resize_deterministic_(self, old_nbytes); // the bytes the resize added, as CUDA's resize_
  }
  return self;
}
// LITERALINCLUDE END: RESIZE

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                        c10::IntArrayRef stride) {
  TORCH_CHECK(source.device() == self.device() || !source.data(), "set_: expected a storage on ", self.device(),
              " but got one on ", source.device());
  TORCH_CHECK(offset >= 0, "set_: storage offset must be non-negative, got ", offset);
  self.unsafeGetTensorImpl()->set_storage_keep_dtype(std::move(source));
  self.unsafeGetTensorImpl()->set_storage_offset(offset);
  restride(self, size, stride.data() ? std::optional<c10::IntArrayRef>(stride) : std::nullopt);
  return self;
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {numel}, {});
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (!self.is_same(source)) {
    set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
  }
  return self;
}

at::Tensor& set_empty(at::Tensor& self) {
  c10::Storage empty(c10::Storage::use_byte_size_t(), 0, device_allocator(), /*resizable=*/true);
  return set_storage(self, std::move(empty), 0, {0}, {});
}

} // namespace

// LITERALINCLUDE START: REGISTER MINIMAL OPS
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", at::native::as_strided_tensorimpl);
  m.impl("view", at::native::view);
  m.impl("_reshape_alias", at::native::_reshape_alias);
  m.impl("resize_", resize_);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_storage);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_", set_empty);
}
// LITERALINCLUDE END: REGISTER MINIMAL OPS

} // namespace openreg
