// The thread-local state kernels run in: whichever thread runs a queued kernel (a stream's
// worker, or a host thread that synchronizes and runs the queue itself), the kernel must see
// PyTorch as a fresh thread would, not as the host code around the synchronize left it:
// autograd off (a kernel writing a tensor that requires grad must not record history),
// autocast off, no Python dispatch or torch function modes, no functorch layers.
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>

namespace openreg {
namespace py = pybind11;

// LITERALINCLUDE START: KERNEL SCOPE
class KernelScope {
 public:
  void enter() {
    TORCH_CHECK(!keys_, "openreg kernel scope entered twice");
    keys_ = std::make_unique<c10::impl::ForceDispatchKeyGuard>(
        c10::default_included_set,
        c10::default_excluded_set | c10::autograd_dispatch_keyset_with_ADInplaceOrView);
    grad_ = std::make_unique<c10::AutoGradMode>(false);
    torch_function_ = at::impl::PythonTorchFunctionTLS::get_disabled_state();
    at::impl::PythonTorchFunctionTLS::set_disabled_state(at::impl::TorchFunctionDisabledState::ALL_DISABLED);
  }
  void exit() {
    at::impl::PythonTorchFunctionTLS::set_disabled_state(torch_function_);
    grad_.reset();
    keys_.reset();
  }

 private:
  std::unique_ptr<c10::impl::ForceDispatchKeyGuard> keys_;
  std::unique_ptr<c10::AutoGradMode> grad_;
  at::impl::TorchFunctionDisabledState torch_function_ = at::impl::TorchFunctionDisabledState::ENABLED;
};
// LITERALINCLUDE END: KERNEL SCOPE

void bind_kernel_scope(py::module& m) {
  py::class_<KernelScope>(m, "_KernelScope", "the thread-local state queued kernels run in (a context manager)")
      .def(py::init<>())
      .def("__enter__", [](KernelScope& self) { self.enter(); })
      .def("__exit__", [](KernelScope& self, const py::args&) { self.exit(); });
}

} // namespace openreg
