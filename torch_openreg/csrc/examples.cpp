// Operator registration examples in C++: a built-in operator with its own
// kernel (TORCH_LIBRARY_IMPL), a DispatchStub kernel (abs_stub), and the
// factory quantized tensors need. Kernels that compute do not touch device
// memory at the call: they hand the runtime a closure over host views, queued on
// the current stream like every Python kernel (torch_openreg/aten/launch.py).
#include <ATen/TensorIterator.h>
#include <ATen/SDPBackend.h>
#include <ATen/native/UnaryOps.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_fused_sdp_choice.h>
#include <ATen/ops/_empty_affine_quantized_native.h>
#include <ATen/ops/_empty_per_channel_affine_quantized_native.h>
#include <ATen/ops/empty_like_native.h>
#include <ATen/ops/q_per_channel_axis_native.h>
#include <ATen/ops/q_per_channel_scales_native.h>
#include <ATen/ops/q_per_channel_zero_points_native.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/abs_native.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/fill.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/q_scale_native.h>
#include <ATen/ops/q_zero_point_native.h>
#include <ATen/ops/qscheme_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "bridge.h"

namespace openreg {

at::Tensor host_view(const at::Tensor& t, bool writable = true); // module.cpp

// LITERALINCLUDE START: CPP LAUNCH
// Queue a C++ closure on the current stream of `device`, naming the storages it
// may touch (the first `written` of them it writes, for the stream sanitizer):
// the runtime opens them only while the closure runs. The runtime's `launch`
// (Python) decides everything else; an exception thrown by the closure is
// reported like any kernel error, at the next synchronizing call.
void launch(c10::DeviceIndex device, std::function<void()> kernel, const std::vector<at::Tensor>& tensors,
            size_t written, const char* name) {
  py::gil_scoped_acquire gil;
  py::list buffers, writes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& storage = tensors[i].storage();
    auto extent = py::make_tuple(reinterpret_cast<uintptr_t>(storage.data()), storage.nbytes());
    buffers.append(extent);
    if (i < written) writes.append(extent);
  }
  py::cpp_function fn([kernel = std::move(kernel)]() {
    py::gil_scoped_release nogil; // the kernel is pure C++: let other streams' Python kernels run
    kernel();
  });
  call("launch", device, fn, buffers, name, writes);
}
// LITERALINCLUDE END: CPP LAUNCH

namespace {

// LITERALINCLUDE START: CPP KERNEL
// aten::fill_.Scalar with its own C++ kernel: validate at the call (as a
// device kernel's host side does), then queue the CPU fill over the host view.
// The closure holds host views (raw pointers), not the tensors, as a CUDA kernel
// holds pointers: a tensor freed before the kernel runs returns its block to the
// caching allocator on this stream, and later work on the stream is ordered after.
at::Tensor& fill_scalar(at::Tensor& self, const at::Scalar& value) {
  // The checks the CPU kernel would make (a value that overflows the dtype), at the call:
  // a fill of one host element, so that the kernel itself cannot fail later.
  at::Tensor probe = at::empty({}, self.options().device(c10::kCPU));
  at::fill_(probe, value);
  if (self.numel() == 0) return self;
  launch(self.device().index(), [view = host_view(self), value]() mutable { at::fill_(view, value); }, {self}, 1,
         "fill_ (C++ kernel)");
  return self;
}
// LITERALINCLUDE END: CPP KERNEL

// LITERALINCLUDE START: ABS STUB
// The DispatchStub form: ATen's own abs_out builds the TensorIterator (shape,
// dtype, out= resizing, strided outputs) and calls abs_stub for the iterator's
// device type; this is the PrivateUse1 entry of the stub. The iterator's
// operands are openreg tensors (an out= slice stays a strided view of its base).
// The CPU kernel's dtype check (abs of bool is "not implemented"), at the call: a one-element CPU abs of the
// iterator's common dtype, once per dtype, raises what the queued kernel would raise later.
void check_dtype_at_call(at::ScalarType dtype) {
  static std::array<std::atomic<bool>, static_cast<size_t>(at::ScalarType::NumOptions)> checked{};
  auto& known = checked[static_cast<size_t>(dtype)];
  if (known.load(std::memory_order_relaxed)) return;
  at::abs(at::zeros({1}, at::TensorOptions().dtype(dtype)));
  known.store(true, std::memory_order_relaxed);
}

void abs_kernel(at::TensorIteratorBase& iter) {
  const at::Tensor& out = iter.output(0);
  const at::Tensor& in = iter.input(0);
  check_dtype_at_call(iter.common_dtype());
  if (out.numel() == 0) return;
  launch(out.device().index(), [out_view = host_view(out), in_view = host_view(in)]() mutable {
    at::abs_out(out_view, in_view);
  }, {out, in}, 1, "abs (abs_stub)");
}
// LITERALINCLUDE END: ABS STUB

// LITERALINCLUDE START: SDP CHOICE
// scaled_dot_product_attention asks this stub (not the _fused_sdp_choice
// operator) which backend to use for a PrivateUse1 query. The stub only
// forwards to the operator, whose openreg kernel is Python
// (torch_openreg/aten/sdpa.py): the choice, and what sdpa_kernel() allows,
// is decided there.
int64_t fused_sdp_choice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                         const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                         std::optional<double> scale, bool enable_gqa) {
  return at::_fused_sdp_choice(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

// Whether CPU eager would run an attention with its flash kernel, whatever
// sdpa_kernel() enables: the checks of PyTorch 2.13's use_flash_attention_cpp
// (sdp_utils_cpp.cpp, whose list is not exported), from the header that holds
// them, without its runtime flag. Called with host views (CPU tensors): the
// stride rule for the mask is the CPU's.
bool cpu_flash_applies(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                       const std::optional<at::Tensor>& attn_mask, double dropout_p, bool enable_gqa) {
  const sdp::sdp_params p{query, key, value, attn_mask, dropout_p, false, enable_gqa};
  constexpr std::array<at::ScalarType, 4> dtypes{at::kFloat, at::kDouble, at::kBFloat16, at::kHalf};
  return sdp::check_nested_tensor(p, false) && sdp::check_for_dropout(p, false) && sdp::check_tensor_shapes(p, false) &&
         sdp::check_batch_size_and_num_heads_dense<true /*supports_gqa*/>(p, false) &&
         sdp::check_attn_mask_shape(p, false) && query.size(-1) == key.size(-1) && query.size(-1) == value.size(-1) &&
         sdp::check_nonzero_sequence_lengths_dense(p, false) &&
         sdp::check_last_dim_stride_equals_1_dense<false /*ignore_singleton_dim*/>(p, false) &&
         sdp::check_tensor_dtype(p, dtypes, false);
}
// LITERALINCLUDE END: SDP CHOICE

} // namespace

// LITERALINCLUDE START: QUANTIZED FACTORY
// ATen's factory for quantized tensors allocates with the PrivateUse1 allocator,
// which allocates on the *current* device: select the requested one first.
at::Tensor empty_affine_quantized(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype,
                                  std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                  std::optional<bool> pin_memory, double scale, int64_t zero_point,
                                  std::optional<c10::MemoryFormat> memory_format) {
  c10::OptionalDeviceGuard guard(device);
  return at::native::empty_affine_quantized(size, dtype, layout, device, pin_memory, scale, zero_point,
                                            memory_format);
}

// Per-channel: the quantizer holds the scales and zero points as tensors; they go to the tensor's
// device (as they are on CUDA), so q_per_channel_scales() answers with an openreg tensor.
at::Tensor empty_per_channel_affine_quantized(c10::IntArrayRef size, const at::Tensor& scales,
                                              const at::Tensor& zero_points, int64_t axis,
                                              std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                                              std::optional<c10::Device> device, std::optional<bool> pin_memory,
                                              std::optional<c10::MemoryFormat> memory_format) {
  c10::OptionalDeviceGuard guard(device);
  const c10::Device target = device.value_or(scales.device());
  return at::native::empty_per_channel_affine_quantized(size, scales.to(target), zero_points.to(target), axis, dtype,
                                                        layout, device, pin_memory, memory_format);
}
// LITERALINCLUDE END: QUANTIZED FACTORY

} // namespace openreg

// LITERALINCLUDE START: REGISTER STUB
namespace at::native { // the stub registration macro expects ATen's namespace
REGISTER_PRIVATEUSE1_DISPATCH(abs_stub, &openreg::abs_kernel)
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &openreg::fused_sdp_choice)
}

namespace openreg {

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("fill_.Scalar", fill_scalar);
  // abs and abs_ are composites over abs.out; without this registration abs.out
  // reaches the global fallback and the stub is never called.
  m.impl("abs.out", at::native::abs_out);
  // Quantized tensors: the factory builds a QTensorImpl over device memory with
  // the QuantizedPrivateUse1 key (ATen picks the PrivateUse1 allocator).
  m.impl("_empty_affine_quantized", empty_affine_quantized);
  m.impl("_empty_per_channel_affine_quantized", empty_per_channel_affine_quantized);
}
// LITERALINCLUDE END: REGISTER STUB

// LITERALINCLUDE START: REGISTER CPU FLASH CHECK
TORCH_LIBRARY_FRAGMENT(openreg, m) {
  m.def("_cpu_flash_applies(Tensor query, Tensor key, Tensor value, Tensor? attn_mask, float dropout_p, "
        "bool enable_gqa) -> bool",
        &cpu_flash_applies);
}
// LITERALINCLUDE END: REGISTER CPU FLASH CHECK

// LITERALINCLUDE START: REGISTER QUANTIZED
TORCH_LIBRARY_IMPL(aten, QuantizedPrivateUse1, m) {
  m.impl("_empty_affine_quantized", empty_affine_quantized);
  m.impl("_empty_per_channel_affine_quantized", empty_per_channel_affine_quantized);
  m.impl("empty_like", at::native::empty_like_quantized);
  m.impl("q_scale", at::native::q_scale_quant);
  m.impl("q_zero_point", at::native::q_zero_point_quant);
  m.impl("qscheme", at::native::qscheme_quant);
  m.impl("q_per_channel_scales", at::native::q_per_channel_scales);
  m.impl("q_per_channel_zero_points", at::native::q_per_channel_zero_points);
  m.impl("q_per_channel_axis", at::native::q_per_channel_axis);
  m.impl("as_strided", at::native::as_strided_qtensorimpl);
  m.impl("set_.source_Storage_storage_offset", at::native::set_storage_quantized_); // torch.load, deepcopy
  m.impl("view", at::native::view);
}
// LITERALINCLUDE END: REGISTER QUANTIZED

} // namespace openreg
