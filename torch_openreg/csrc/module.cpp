// torch_openreg._C: loading it registers the guard, the device and pinned-host allocators, the
// minimal operators, serialization's backend metadata, the graph implementation and the Kineto
// profiler (static initializers in their files), and the hooks (below). The functions it binds are the
// Python side's ways into C++: host views of device memory and their kin (this file), the fallback's
// accelerations (call_args.cpp, cpu_outputs.cpp), the kernel scope and warning recorder
// (kernel_scope.cpp), the profiler's correlation ids and registration check (profiler.cpp) and the c10d
// backend (distributed/). Loading it changes nothing else in the process: the CPU allocator of
// cpu_outputs.cpp is installed by a call (_install_cpu_output_allocator), made by the accelerations when
// the first kernel that needs it is built (never with OPENREG_FALLBACK_FAST=0).
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/from_blob.h>
#include <torch/csrc/utils/pybind.h>

#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "allocator.h"
#include "bridge.h"

namespace openreg {

void register_hooks();
void register_serialization();
void copy_backend_meta(const at::Tensor& src, const at::Tensor& dst);
py::object describe_call(const py::tuple& args, const py::dict& kwargs, int numbers, int placed);
py::tuple empty_like_meta(const at::Tensor& meta, c10::DeviceIndex index);
std::vector<std::vector<uintptr_t>> set_cpu_output_targets(const std::vector<at::Tensor>& tensors,
                                                           const std::vector<int64_t>& skips);
bool install_cpu_output_allocator();
bool cpu_output_allocator_installed();
size_t cpu_outputs_held();
void bind_kernel_scope(py::module& m);
void bind_distributed(py::module& m);
void bind_profiler(py::module& m);
void bind_planned_launch(py::module& m);
void bind_copies(py::module& m);
void bind_block_cache(py::module& m);
void bind_current_streams(py::module& m);

// LITERALINCLUDE START: VIEW ADDRESS
// The runtime's translation from a device pointer to the device's own view of that memory
// (openreg.memory.view_address), copied here so that building a host view calls no Python: the
// runtime hands every change of its ranges to set_views (one range per device, one per IPC import).
namespace {
struct ViewRange {
  uintptr_t lo, hi, delta; // device addresses [lo, hi) are seen at address + delta (modulo 2^64)
};
std::mutex g_views_lock;
std::vector<ViewRange> g_views;
} // namespace

void set_views(const std::vector<std::tuple<uintptr_t, uintptr_t, int64_t>>& views) {
  std::vector<ViewRange> ranges;
  for (const auto& [lo, hi, delta] : views) ranges.push_back({lo, hi, static_cast<uintptr_t>(delta)});
  std::lock_guard<std::mutex> guard(g_views_lock);
  g_views = std::move(ranges);
}

void* view_address(const void* ptr) {
  auto p = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard<std::mutex> guard(g_views_lock);
  for (const auto& r : g_views) {
    if (p >= r.lo && p < r.hi) return reinterpret_cast<void*>(p + r.delta);
  }
  TORCH_CHECK(false, "openreg: a device pointer outside every device's memory has no view");
}
// LITERALINCLUDE END: VIEW ADDRESS

// LITERALINCLUDE START: HOST VIEW
// The CPU storage over a device storage's bytes. Host views of one device storage share it while any of
// them lives, so that the CPU kernels' overlap checks (at::assert_no_partial_overlap and the like, which
// compare storages) see two views of the same device memory as aliases, as CUDA's checks do: without
// it, `x[1:].copy_(x[:-1])` or `torch.add(a, 1, out=b)` with overlapping a and b computed garbage.
// The CPU storage's bytes are the device storage's view (view_address): kernels compute through it.
c10::Storage host_storage(const c10::Storage& device, const void* data) {
  struct Entry {
    void* base;
    size_t nbytes;
    c10::weak_intrusive_ptr<c10::StorageImpl> host;
  };
  static std::mutex lock;
  static std::unordered_map<const c10::StorageImpl*, Entry> shared;
  static size_t sweep_at = 1024; // the map's size that makes the next insertion sweep it
  void* base = view_address(const_cast<void*>(data));
  size_t nbytes = device.nbytes();
  std::lock_guard<std::mutex> guard(lock);
  auto found = shared.find(device.unsafeGetStorageImpl());
  if (found != shared.end() && found->second.base == base && found->second.nbytes == nbytes) {
    if (auto alive = found->second.host.lock()) {
      return c10::Storage(std::move(alive));
    }
  }
  if (shared.size() >= sweep_at) { // forget the storages no view holds any more
    for (auto it = shared.begin(); it != shared.end();) {
      it = it->second.host.expired() ? shared.erase(it) : std::next(it);
    }
    // Amortized: a long queue keeps thousands of views alive, and a sweep per insertion made each launch
    // cost the queue's length (a gradgradcheck of nn.GRU ran 50x the CPU's time).
    sweep_at = std::max<size_t>(1024, 2 * shared.size());
  }
  c10::Storage host(c10::Storage::use_byte_size_t(), nbytes, c10::DataPtr(base, c10::Device(c10::kCPU)),
                    /*allocator=*/nullptr, /*resizable=*/false);
  shared.insert_or_assign(device.unsafeGetStorageImpl(), Entry{base, nbytes, host.getWeakStorageImpl()});
  return host;
}

// A CPU tensor over the same bytes as an openreg tensor (same sizes, strides,
// offset and dtype): what a kernel computes on while the runtime grants access.
// A kernel that only reads the tensor takes it without ``writable``: a copy-on-write storage
// (``Tensor._lazy_clone``) then stays shared, as the CPU's kernels leave it (they take
// const_data_ptr); a written one is materialized first, so the write never reaches its clones.
at::Tensor host_view(const at::Tensor& t, bool writable) {
  TORCH_CHECK(t.device().is_privateuseone(), "host_view expects an openreg tensor, got one on ", t.device());
  const auto& storage = t.storage();
  void* base = writable ? storage.mutable_data() : const_cast<void*>(storage.data());
  if (base == nullptr) {
    return at::empty_strided(t.sizes(), t.strides(), t.options().device(c10::kCPU));
  }
  auto view = at::detail::make_tensor<c10::TensorImpl>(host_storage(storage, base),
                                                       c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  // The lazy conjugate/negative bits travel with the view: operators that resolve them
  // themselves (copies, dot, mm, ...) receive the tensor unresolved.
  view._set_conj(t.is_conj());
  view._set_neg(t.is_neg());
  return view;
}
// LITERALINCLUDE END: HOST VIEW

// LITERALINCLUDE START: CPU ALIAS
// A CPU tensor sharing a CPU tensor's storage (which it keeps alive), with its own version counter
// and no autograd history: what a queued copy writes or reads instead of the caller's tensor, so the
// kernel neither records autograd history on it nor sees it resized or re-pointed after the call.
at::Tensor cpu_alias(const at::Tensor& t) {
  TORCH_CHECK(t.device().is_cpu(), "cpu_alias expects a CPU tensor, got one on ", t.device());
  auto alias = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()),
                                                        c10::DispatchKeySet(c10::DispatchKey::CPU), t.dtype());
  alias.unsafeGetTensorImpl()->set_sizes_and_strides(t.sizes(), t.strides(), t.storage_offset());
  alias._set_conj(t.is_conj());
  alias._set_neg(t.is_neg());
  return alias;
}
// LITERALINCLUDE END: CPU ALIAS

// LITERALINCLUDE START: WRAPPED NUMBER
// PyTorch's own mark on the 0-dim tensor a Python number becomes (at::native::wrapped_scalar_tensor): type
// promotion treats it as a number, whatever its dtype (a float16 tensor divided by 1e5 stays float16 and the
// kernel reads 1e5 at full width). Python has no setter; the fallback wraps numbers it hands a CPU kernel.
at::Tensor mark_wrapped_number(const at::Tensor& t, bool wrapped) {
  TORCH_CHECK(t.dim() == 0, "a wrapped number is a 0-dim tensor, got ", t.dim(), " dimensions");
  t.unsafeGetTensorImpl()->set_wrapped_number(wrapped);
  return t;
}
// LITERALINCLUDE END: WRAPPED NUMBER

// LITERALINCLUDE START: EXTENTS
// (storage base, storage bytes) of each openreg tensor: what a launch names, so that the runtime opens
// exactly those pages while the kernel runs. CPU scalars and indices are host memory: skipped.
py::list extents(const std::vector<at::Tensor>& tensors) {
  py::list out;
  for (const auto& t : tensors) {
    if (!t.defined() || !t.device().is_privateuseone()) continue;
    const auto& storage = t.storage();
    out.append(py::make_tuple(reinterpret_cast<uintptr_t>(storage.data()), storage.nbytes()));
  }
  return out;
}
// LITERALINCLUDE END: EXTENTS

namespace {
void close_ipc(void* base) { call_quietly("ipc_close", reinterpret_cast<uintptr_t>(base)); }
} // namespace

// LITERALINCLUDE START: IPC STORAGE
// A 1-D uint8 tensor over memory mapped from another process: its storage
// owns the mapping (the context is the mapping's base) and unmaps it when freed.
at::Tensor ipc_tensor(uintptr_t data, int64_t nbytes, c10::DeviceIndex index, uintptr_t base) {
  c10::DataPtr ptr(reinterpret_cast<void*>(data), reinterpret_cast<void*>(base), &close_ipc, device(index));
  auto storage = c10::make_intrusive<c10::StorageImpl>(c10::StorageImpl::use_byte_size_t(), nbytes, std::move(ptr),
                                                       /*allocator=*/nullptr, /*resizable=*/false);
  auto tensor = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(std::move(storage)),
                                                         c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
                                                         caffe2::TypeMeta::Make<uint8_t>());
  tensor.unsafeGetTensorImpl()->set_sizes_contiguous({nbytes});
  return tensor;
}
// LITERALINCLUDE END: IPC STORAGE

} // namespace openreg

// LITERALINCLUDE START: PYBIND MODULE
PYBIND11_MODULE(_C, m) {
  openreg::register_hooks();
  openreg::register_serialization();
  m.def("_host_view", &openreg::host_view, "CPU tensor aliasing an openreg tensor's device memory", py::arg("t"),
        py::arg("writable") = true);
  m.def("_mark_wrapped_number", &openreg::mark_wrapped_number,
        "set (or clear) PyTorch's wrapped-number mark of a 0-dim tensor; returns it", py::arg("t"),
        py::arg("wrapped") = true);
  m.def("_is_wrapped_number", [](const at::Tensor& t) { return t.unsafeGetTensorImpl()->is_wrapped_number(); },
        "whether a tensor is a Python number's wrapped tensor");
  m.def("_cpu_alias", &openreg::cpu_alias, "CPU tensor sharing a CPU tensor's storage, without its autograd state");
  m.def("_cpu_generator", &openreg::cpu_generator, "the CPU generator an openreg generator forwards to");
  m.def("_default_generator", [](c10::DeviceIndex index) { return openreg::default_generator(index); },
        "the default generator of an openreg device");
  m.def("_ipc_tensor", &openreg::ipc_tensor, "uint8 openreg tensor over memory mapped from another process");
  m.def("_storage_base",
        [](const at::Tensor& t) { return reinterpret_cast<uintptr_t>(openreg::view_address(t.storage().data())); },
        "view address of an openreg tensor's storage (to locate a host view's offset in it)");
  m.def("_set_views", &openreg::set_views,
        "the runtime's device-pointer-to-view ranges, (first device address, end, delta) each");
  m.def("_extents", &openreg::extents, "(storage base, storage bytes) of each openreg tensor: what a launch names");
  m.def("_describe_call", &openreg::describe_call,
        "[call shape, host args, host kwargs, extents] of an operator call, or None (the call plans); "
        "placed: the call shape has each tensor's storage offset and size",
        py::arg("args"), py::arg("kwargs"), py::arg("numbers"), py::arg("placed") = true);
  m.def("_empty_like_meta", &openreg::empty_like_meta, "(openreg tensor shaped like a meta tensor, host view, extent)");
  m.def("_set_cpu_output_targets", &openreg::set_cpu_output_targets,
        "serve this thread's next CPU allocations of these tensors' sizes from their memory, after letting "
        "skips[i] through ([] stops it); returns the previous targets' allocations of their sizes");
  m.def("_cpu_outputs_held", &openreg::cpu_outputs_held, "buffers served to this thread's CPU kernels still held");
  m.def("_install_cpu_output_allocator", &openreg::install_cpu_output_allocator,
        "put the CPU allocator that serves functional kernels' outputs in front of PyTorch's, process-wide "
        "(idempotent; True the first time)");
  m.def("_cpu_output_allocator_installed", &openreg::cpu_output_allocator_installed,
        "whether the CPU allocator of _install_cpu_output_allocator is PyTorch's CPU allocator");
  openreg::bind_kernel_scope(m);
  openreg::bind_distributed(m);
  openreg::bind_profiler(m);
  openreg::bind_planned_launch(m);
  openreg::bind_copies(m);
  openreg::bind_block_cache(m);
  openreg::bind_current_streams(m);
  m.def("_copy_backend_meta", &openreg::copy_backend_meta,
        "clone an openreg tensor's backend metadata onto dst (torch._C._copy_backend_meta of newer PyTorch)");
}
// LITERALINCLUDE END: PYBIND MODULE
