// The fallback's fast path, in one crossing each way: describe an operator call's
// arguments (a hashable key of their metadata, their host-side form, the device
// extents a launch names), and allocate an output with its host view. What is
// cached under the key and how the call runs is decided in Python
// (torch_openreg/aten/fallback.py); this file only reads tensors and builds
// tuples, which costs ~1 us here and ~5 us per call in Python.
#include <ATen/ops/empty_strided.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "bridge.h"

namespace openreg {

at::Tensor host_view(const at::Tensor& t);

namespace {

py::object wrap(at::Tensor t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t))); }

py::tuple extent(const at::Tensor& t) {
  const auto& storage = t.storage();
  return py::make_tuple(reinterpret_cast<uintptr_t>(storage.data()), storage.nbytes());
}

// LITERALINCLUDE START: DESCRIBE TENSOR
// An openreg tensor's key: everything its output metadata can depend on (device, dtype, the lazy
// conjugate/negative bits, storage offset and size, sizes and strides), as one flat tuple of ints.
// Without ``placed`` the storage offset and size are left out (as 0): fresh outputs do not depend
// on where an input sits in its storage, and the slices of one tensor then share one key.
py::tuple tensor_key(const at::Tensor& t, bool placed) {
  auto sizes = t.sizes();
  auto strides = t.strides();
  auto n = static_cast<size_t>(sizes.size());
  py::tuple key(5 + 2 * n);
  key[0] = py::int_(t.device().index());
  key[1] = py::int_(static_cast<int>(t.scalar_type()));
  key[2] = py::int_((t.is_conj() ? 1 : 0) | (t.is_neg() ? 2 : 0));
  key[3] = py::int_(placed ? t.storage_offset() : 0);
  key[4] = py::int_(placed ? t.storage().nbytes() : 0);
  for (size_t i = 0; i < n; ++i) {
    key[5 + i] = py::int_(sizes[i]);
    key[5 + n + i] = py::int_(strides[i]);
  }
  return key;
}
// LITERALINCLUDE END: DESCRIBE TENSOR

struct Description {
  bool numbers_by_type;
  bool placed;
  py::list extents;
};

// One argument: its key and its host-side form. False when only the general path can take it
// (a CPU tensor that is not a 0-dim scalar, a tensor of another device).
bool describe(const py::handle& value, Description& d, py::object& key, py::object& host) {
  PyObject* obj = value.ptr();
  if (THPVariable_Check(obj)) {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (t.device().is_privateuseone()) {
      key = tensor_key(t, d.placed);
      host = wrap(host_view(t));
      d.extents.append(extent(t));
      return true;
    }
    if (t.device().is_cpu() && t.dim() == 0) {
      key = py::make_tuple(-1, static_cast<int>(t.scalar_type()));
      host = wrap(t.clone()); // a CPU scalar is read at the call, as CUDA copies it
      return true;
    }
    return false;
  }
  if (PyBool_Check(obj) || PyLong_Check(obj) || PyFloat_Check(obj) || PyComplex_Check(obj)) {
    // 2, 2.0 and True are equal but promote differently: the type is part of the key
    py::handle type(reinterpret_cast<PyObject*>(Py_TYPE(obj)));
    key = d.numbers_by_type ? py::reinterpret_borrow<py::object>(type) : py::make_tuple(type, value);
    host = py::reinterpret_borrow<py::object>(value);
    return true;
  }
  if (PyList_Check(obj) || PyTuple_Check(obj)) {
    auto items = py::reinterpret_borrow<py::sequence>(value);
    auto n = static_cast<size_t>(items.size());
    py::tuple keys(n);
    py::list hosts(n);
    bool tensors = false;
    for (size_t i = 0; i < n; ++i) {
      py::handle item = items[i];
      py::object k, h;
      if (item.is_none()) {
        k = h = py::none();
      } else if (THPVariable_Check(item.ptr())) {
        if (!describe(item, d, k, h)) return false;
        tensors = true;
      } else if (PyLong_Check(item.ptr()) || PyFloat_Check(item.ptr()) || PyBool_Check(item.ptr())) {
        k = py::make_tuple(py::handle(reinterpret_cast<PyObject*>(Py_TYPE(item.ptr()))), item);
        h = py::reinterpret_borrow<py::object>(item);
      } else {
        return false; // nested lists and other kinds: the general path
      }
      keys[i] = k;
      hosts[i] = h;
    }
    key = keys;
    host = !tensors ? py::reinterpret_borrow<py::object>(value) : PyTuple_Check(obj) ? py::object(py::tuple(hosts))
                                                                                    : py::object(hosts);
    return true;
  }
  key = host = py::reinterpret_borrow<py::object>(value); // None, strings, dtypes, ...: hashable as they are
  return true;
}

} // namespace

// LITERALINCLUDE START: DESCRIBE CALL
// [key, host args, host kwargs, extents] of a call, or None when the general path must take it.
py::object describe_call(const py::tuple& args, const py::dict& kwargs, bool numbers_by_type, bool placed) {
  Description d{numbers_by_type, placed, py::list()};
  auto n = static_cast<size_t>(args.size());
  py::tuple key(n + kwargs.size());
  py::tuple host_args(n);
  for (size_t i = 0; i < n; ++i) {
    py::object k, h;
    if (!describe(args[i], d, k, h)) return py::none();
    key[i] = k;
    host_args[i] = h;
  }
  py::dict host_kwargs;
  size_t i = n;
  for (auto item : kwargs) {
    py::object k, h;
    if (!describe(item.second, d, k, h)) return py::none();
    key[i++] = py::make_tuple(item.first, k);
    host_kwargs[item.first] = h;
  }
  py::list described(4); // a list: the fallback empties it when the call fails (see fallback._run)
  described[0] = key;
  described[1] = host_args;
  described[2] = host_kwargs;
  described[3] = d.extents;
  return described;
}
// LITERALINCLUDE END: DESCRIBE CALL

// LITERALINCLUDE START: EMPTY LIKE META
// A fresh openreg tensor shaped like a meta tensor, its host view and its extent.
py::tuple empty_like_meta(const at::Tensor& meta, c10::DeviceIndex index) {
  auto out = at::empty_strided(meta.sizes(), meta.strides(), meta.options().device(device(index)));
  auto view = host_view(out);
  auto where = extent(out);
  return py::make_tuple(wrap(std::move(out)), wrap(std::move(view)), where);
}
// LITERALINCLUDE END: EMPTY LIKE META

} // namespace openreg
