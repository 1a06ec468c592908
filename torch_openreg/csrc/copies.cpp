// The copies' and .item()'s kernels registered from the bridge (torch_openreg/aten/__init__.py decides when):
// aten::_copy_from and aten::_local_scalar_dense, each calling its Python kernel in torch_openreg/aten/copy.py,
// which stays the reference, with one conversion of its own (THPVariable_Wrap) instead of the boxed
// conversion a torch.library registration goes through. _copy_from also returns at once for a copy between
// two views of the same elements, as at::native::copy_ returns for them on the CPU and CUDA before any
// kernel: PrivateUse1's copies reach _copy_from before copy_'s own check, and ``x[i] += 1`` writes its result
// back onto itself. copy.py's kernel applies the same rule (``_same_data``).
#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/library.h>

#include <optional>

#include "bridge.h"

namespace openreg {
namespace {

// copy.copy_from and copy.local_scalar_dense, set once by _register_copies and kept for the process (never
// destroyed: a py::object released after the interpreter has finalized would crash the exit).
py::object* g_python_copy = nullptr;
py::object* g_python_item = nullptr;

py::object wrap(const at::Tensor& t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(t)); }

// LITERALINCLUDE START: COPY FROM FRONT
// copy.py's _same_data, in C++: two strided openreg tensors on one device with the same first element, dtype,
// sizes, strides and lazy conjugate/negative bits (const_data_ptr: asking never materializes a lazy clone).
bool same_data(const at::Tensor& src, const at::Tensor& dst) {
  return src.layout() == at::kStrided && dst.layout() == at::kStrided && !src.is_nested() &&
         src.device() == dst.device() && src.const_data_ptr() == dst.const_data_ptr() &&
         src.dtype() == dst.dtype() && src.sizes().equals(dst.sizes()) && src.strides().equals(dst.strides()) &&
         src.is_conj() == dst.is_conj() && src.is_neg() == dst.is_neg();
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  if (self.device().type() == c10::DeviceType::PrivateUse1 && same_data(self, dst)) return dst;
  py::gil_scoped_acquire gil;
  py::object result = (*g_python_copy)(wrap(self), wrap(dst), non_blocking);
  return THPVariable_Unpack(result.ptr());
}
// LITERALINCLUDE END: COPY FROM FRONT

// .item(): the Python kernel's number converted as a torch.library kernel's result is (toIValue to Scalar's type).
c10::Scalar local_scalar_dense(const at::Tensor& self) {
  py::gil_scoped_acquire gil;
  py::object result = (*g_python_item)(wrap(self));
  return torch::jit::toIValue(result, c10::NumberType::get()).toScalar();
}

} // namespace

void bind_copies(py::module& m) {
  m.def(
      "_register_copies",
      [](py::object python_copy, py::object python_item) {
        TORCH_CHECK(g_python_copy == nullptr, "openreg: the copies are registered already");
        g_python_copy = new py::object(std::move(python_copy));
        g_python_item = new py::object(std::move(python_item));
        // kept for the process, as a TORCH_LIBRARY_IMPL block's registration is
        auto* library = new torch::Library(torch::Library::IMPL, "aten",
                                           std::make_optional(c10::DispatchKey::PrivateUse1), __FILE__, __LINE__);
        library->impl("_copy_from", TORCH_FN(copy_from));
        library->impl("_local_scalar_dense", TORCH_FN(local_scalar_dense));
      },
      "register aten::_copy_from and aten::_local_scalar_dense for PrivateUse1 over their Python kernels "
      "(same-elements copies return here)",
      py::arg("python_copy"), py::arg("python_item"));
}

} // namespace openreg
