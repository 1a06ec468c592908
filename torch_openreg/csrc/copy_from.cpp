// aten::_copy_from's front door for openreg (torch_openreg/aten/copy.py decides when it is installed): a copy
// between two views of the same elements returns at once, as at::native::copy_ returns for them on the CPU
// and CUDA before any kernel; every other copy goes to copy.copy_from, the Python kernel, which is the
// reference and applies the same rule itself (``_same_data``). PrivateUse1's copies reach _copy_from before
// copy_'s own check, and ``x[i] += 1`` writes its result back onto itself: this saves that write-back the
// crossing into Python.
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <optional>

#include "bridge.h"

namespace openreg {
namespace {

// copy.copy_from, set once by _register_copy_from and kept for the process (never destroyed: a py::object
// released after the interpreter has finalized would crash the exit).
py::object* g_python_copy = nullptr;

// LITERALINCLUDE START: COPY FROM FRONT
// copy.py's _same_data, in C++: two strided openreg tensors on one device with the same first element, dtype,
// sizes, strides and lazy conjugate/negative bits.
bool same_data(const at::Tensor& src, const at::Tensor& dst) {
  return src.layout() == at::kStrided && dst.layout() == at::kStrided && !src.is_nested() &&
         src.device() == dst.device() && src.data_ptr() == dst.data_ptr() && src.dtype() == dst.dtype() &&
         src.sizes().equals(dst.sizes()) && src.strides().equals(dst.strides()) && src.is_conj() == dst.is_conj() &&
         src.is_neg() == dst.is_neg();
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (self.device().type() == c10::DeviceType::PrivateUse1 && same_data(self, dst)) return dst;
  py::gil_scoped_acquire gil;
  py::object result = (*g_python_copy)(py::reinterpret_steal<py::object>(THPVariable_Wrap(self)),
                                    py::reinterpret_steal<py::object>(THPVariable_Wrap(dst)), non_blocking);
  return THPVariable_Unpack(result.ptr());
}
// LITERALINCLUDE END: COPY FROM FRONT

} // namespace

void bind_copy_from(py::module& m) {
  m.def(
      "_register_copy_from",
      [](py::object python_copy) {
        TORCH_CHECK(g_python_copy == nullptr, "openreg: _copy_from is registered already");
        g_python_copy = new py::object(std::move(python_copy));
        // kept for the process, as a TORCH_LIBRARY_IMPL block's registration is
        auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                           std::make_optional(c10::DispatchKey::PrivateUse1), __FILE__, __LINE__);
        library->impl("_copy_from", TORCH_FN(copy_from));
      },
      "register aten::_copy_from for PrivateUse1: same-data copies return here, the others call python_copy",
      py::arg("python_copy"));
}

} // namespace openreg
