// The thread-local state kernels run in, and the warnings they raise.
// KernelScope:  whichever thread runs a queued kernel (a stream's
// worker, or a host thread that synchronizes and runs the queue itself), the kernel must see
// PyTorch as a fresh thread would, not as the host code around the synchronize left it:
// autograd off (a kernel writing a tensor that requires grad must not record history),
// autocast off, no Python dispatch or torch function modes, no functorch layers, and no
// RecordFunction callbacks: the CPU operators a kernel runs are device work, not host operators a
// profiler should list (and a host that runs queued work would otherwise show them nested in its own).
#include <ATen/PythonTorchFunctionTLS.h>
#include <ATen/record_function.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <vector>

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
    record_ = std::make_unique<at::RecordFunctionGuard>(false);
    torch_function_ = at::impl::PythonTorchFunctionTLS::get_disabled_state();
    at::impl::PythonTorchFunctionTLS::set_disabled_state(at::impl::TorchFunctionDisabledState::ALL_DISABLED);
  }
  void exit() {
    at::impl::PythonTorchFunctionTLS::set_disabled_state(torch_function_);
    record_.reset();
    grad_.reset();
    keys_.reset();
  }

 private:
  std::unique_ptr<c10::impl::ForceDispatchKeyGuard> keys_;
  std::unique_ptr<c10::AutoGradMode> grad_;
  std::unique_ptr<at::RecordFunctionGuard> record_;
  at::impl::TorchFunctionDisabledState torch_function_ = at::impl::TorchFunctionDisabledState::ENABLED;
};
// LITERALINCLUDE END: KERNEL SCOPE

// LITERALINCLUDE START: UNRECORDED
// Operators run while it is entered are not observed by RecordFunction callbacks (the profiler's). The
// fallback's meta run is its own inference of output metadata, not an operator the program called: a
// profiler would list it, and the meta tensors it makes, nested in the operator that ran it.
class Unrecorded {
 public:
  void enter() { guard_ = std::make_unique<at::RecordFunctionGuard>(false); }
  void exit() { guard_.reset(); } // back to what it was

 private:
  std::unique_ptr<at::RecordFunctionGuard> guard_;
};
// LITERALINCLUDE END: UNRECORDED

// LITERALINCLUDE START: WARNING RECORDER
// Collects the TORCH_WARNs raised on this thread while it is entered. The fallback needs them: a kernel
// run at the call must warn the caller as the CPU operator would (flush hands them to the handler that
// was current: the one of the Python binding that called the operator turns them into Python warnings
// when that binding returns, too late for Python's warnings.catch_warnings to see them), and must know
// that it did; a first run that is redone another way, and the meta run, must not warn at all.
class WarningRecorder final : public c10::WarningHandler {
 public:
  void process(const c10::Warning& warning) override {
    warnings_.push_back(warning);
    ++count_;
  }
  void enter() {
    previous_ = c10::WarningUtils::get_warning_handler();
    c10::WarningUtils::set_warning_handler(this);
  }
  void exit() { c10::WarningUtils::set_warning_handler(previous_); }
  void flush() {
    for (const auto& warning : warnings_) previous_->process(warning);
    warnings_.clear();
  }
  size_t count() const { return count_; } // all collected, flushed or not

 private:
  std::vector<c10::Warning> warnings_;
  size_t count_ = 0;
  c10::WarningHandler* previous_ = nullptr;
};
// LITERALINCLUDE END: WARNING RECORDER

void bind_kernel_scope(py::module& m) {
  py::class_<WarningRecorder>(m, "_WarningRecorder", "collects this thread's TORCH_WARNs (a context manager)")
      .def(py::init<>())
      .def("__enter__", [](WarningRecorder& self) -> WarningRecorder& { self.enter(); return self; },
           py::return_value_policy::reference)
      .def("__exit__", [](WarningRecorder& self, const py::args&) { self.exit(); })
      .def("flush", &WarningRecorder::flush, "hand the warnings to the handler that was current (after exit)")
      .def_property_readonly("count", &WarningRecorder::count);
  py::class_<Unrecorded>(m, "_Unrecorded", "operators run inside are not listed by profilers (a context manager)")
      .def(py::init<>())
      .def("__enter__", [](Unrecorded& self) { self.enter(); })
      .def("__exit__", [](Unrecorded& self, const py::args&) { self.exit(); });
  py::class_<KernelScope>(m, "_KernelScope", "the thread-local state queued kernels run in (a context manager)")
      .def(py::init<>())
      .def("__enter__", [](KernelScope& self) { self.enter(); })
      .def("__exit__", [](KernelScope& self, const py::args&) { self.exit(); });
}

} // namespace openreg
