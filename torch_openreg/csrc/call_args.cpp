// The call plans' argument walk (torch_openreg/aten/fast/call_plans.py), in one crossing each way:
// describe an operator call's arguments (its call shape, their host-side form, the device extents a
// launch names), and allocate an output with its host view. The call shape is the key
// torch_openreg/aten/arguments.py's call_key computes in Python, element for element; what is cached
// under it and how the call runs is decided in Python. This file only reads tensors and builds
// tuples, which costs ~1 us here and ~5 us per call in Python.
#include <ATen/ops/empty_strided.h>
#include <algorithm>
#include <cmath>
#include <iterator>
#include <vector>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "bridge.h"

namespace openreg {

at::Tensor host_view(const at::Tensor& t, bool writable = true); // module.cpp

namespace {

py::object wrap(at::Tensor t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t))); }

py::tuple extent(const at::Tensor& t) {
  const auto& storage = t.storage();
  return py::make_tuple(reinterpret_cast<uintptr_t>(storage.data()), storage.nbytes());
}

// LITERALINCLUDE START: DESCRIBE TENSOR
py::handle dtype(const at::Tensor& t) { return reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type())); }

// An openreg tensor's call shape (arguments.call_key): (device index, dtype, conj | neg << 1, place,
// storage bytes, *sizes, *strides), one flat tuple. ``placed`` (traits.py's UNPLACED / ABSOLUTE / RELATIVE)
// says how much of where the tensor sits in its storage counts: nothing (place and bytes 0: fresh outputs
// do not depend on it, so the slices of one tensor share one call shape), the storage offset, or the
// offset against the call's first tensor in the same storage, as (storage number, difference).
enum Placed : int { UNPLACED = 0, ABSOLUTE = 1, RELATIVE = 2 };

struct Storages { // RELATIVE: the call's storages in order of appearance, with their first offsets
  std::vector<std::pair<const void*, int64_t>> seen;
  py::tuple place(const at::Tensor& t) {
    const void* ptr = t.storage().data();
    for (size_t i = 0; i < seen.size(); ++i) {
      if (seen[i].first == ptr) return py::make_tuple(i, t.storage_offset() - seen[i].second);
    }
    seen.emplace_back(ptr, t.storage_offset());
    return py::make_tuple(seen.size() - 1, 0);
  }
};

py::tuple tensor_key(const at::Tensor& t, int placed, Storages& storages) {
  auto sizes = t.sizes();
  auto strides = t.strides();
  auto n = static_cast<size_t>(sizes.size());
  py::tuple key(5 + 2 * n);
  key[0] = py::int_(t.device().index());
  key[1] = dtype(t);
  key[2] = py::int_((t.is_conj() ? 1 : 0) | (t.is_neg() ? 2 : 0));
  key[3] = placed == RELATIVE ? py::object(storages.place(t)) : py::int_(placed ? t.storage_offset() : 0);
  key[4] = py::int_(placed ? t.storage().nbytes() : 0);
  for (size_t i = 0; i < n; ++i) {
    key[5 + i] = py::int_(sizes[i]);
    key[5 + n + i] = py::int_(strides[i]);
  }
  return key;
}
// LITERALINCLUDE END: DESCRIBE TENSOR

enum Numbers : int { NUMBER_VALUE = 0, NUMBER_TYPE = 1, NUMBER_CLASS = 2 }; // traits.py's NUMBER KEYS

struct Description {
  int numbers;
  int placed;
  py::list extents;
  Storages storages;
};

bool is_number(PyObject* obj) {
  return PyBool_Check(obj) || PyLong_Check(obj) || PyFloat_Check(obj) || PyComplex_Check(obj);
}

// arguments.NUMBER_LIMITS: every dtype's largest value as a double, in order.
constexpr double kNumberLimits[] = {0.0, 1.0, 127.0, 128.0, 255.0, 448.0, 32767.0, 32768.0, 57344.0, 65504.0,
                                    65535.0, 2147483647.0, 2147483648.0, 4294967295.0, 9223372036854775807.0,
                                    3.3895313892515355e38, 3.4028234663852886e38};

// arguments.number_class: (type, sign, class) of an exact int or float.
py::object number_class(const py::handle& value, const py::handle& type) {
  PyObject* obj = value.ptr();
  double x = PyFloat_CheckExact(obj) ? PyFloat_AS_DOUBLE(obj) : PyLong_AsDouble(obj);
  constexpr auto n = static_cast<long>(std::size(kNumberLimits));
  if (x == -1.0 && PyErr_Occurred()) { // an int beyond doubles
    PyErr_Clear();
    return py::make_tuple(type, py::reinterpret_borrow<py::int_>(value) > py::int_(0) ? 1 : -1, n);
  }
  if (std::isnan(x)) return py::make_tuple(type, 0, -1);
  int sign = (x > 0) - (x < 0);
  if (std::isinf(x)) return py::make_tuple(type, sign, -2);
  auto found = std::lower_bound(std::begin(kNumberLimits), std::end(kNumberLimits), std::fabs(x));
  return py::make_tuple(type, sign, static_cast<long>(found - std::begin(kNumberLimits)));
}

// A number's key: (type, value); its type alone for operators whose numbers never shape outputs; (type, sign,
// class) for pointwise operators' ints and floats (2, 2.0 and True are equal but promote differently: the type
// is part of the key).
py::object number_key(const py::handle& value, const Description& d) {
  py::handle type(reinterpret_cast<PyObject*>(Py_TYPE(value.ptr())));
  if (d.numbers == NUMBER_TYPE) return py::reinterpret_borrow<py::object>(type);
  if (d.numbers == NUMBER_CLASS && (PyLong_CheckExact(value.ptr()) || PyFloat_CheckExact(value.ptr()))) {
    return number_class(value, type);
  }
  return py::make_tuple(type, value);
}

// One argument: its key and its host-side form. False when only the general path can take it
// (a CPU tensor that is not a 0-dim scalar, a tensor of another device, a nested list).
bool describe(const py::handle& value, Description& d, py::object& key, py::object& host, bool in_list = false) {
  PyObject* obj = value.ptr();
  if (is_number(obj)) { // first: cheaper than THPVariable_Check, and most list items are numbers
    key = number_key(value, d);
    host = py::reinterpret_borrow<py::object>(value);
    return true;
  }
  if (THPVariable_Check(obj)) {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (t.device().is_privateuseone()) {
      key = tensor_key(t, d.placed, d.storages);
      host = wrap(host_view(t, /*writable=*/d.placed != UNPLACED)); // UNPLACED: the call writes no argument
      d.extents.append(extent(t));
      return true;
    }
    if (t.device().is_cpu() && t.dim() == 0) {
      key = py::make_tuple(-1, dtype(t));
      host = wrap(t.clone()); // a CPU scalar is read at the call, as CUDA copies it
      return true;
    }
    return false;
  }
  if (PyList_Check(obj) || PyTuple_Check(obj)) {
    if (in_list) return false; // a nested list: the general path
    bool is_list = PyList_Check(obj);
    auto n = static_cast<size_t>(is_list ? PyList_GET_SIZE(obj) : PyTuple_GET_SIZE(obj));
    py::tuple keys(n);
    py::list hosts(n);
    bool tensors = false;
    for (size_t i = 0; i < n; ++i) {
      auto index = static_cast<Py_ssize_t>(i);
      py::handle item(is_list ? PyList_GET_ITEM(obj, index) : PyTuple_GET_ITEM(obj, index)); // borrowed
      py::object k, h;
      if (!describe(item, d, k, h, /*in_list=*/true)) return false;
      tensors = tensors || !(item.is_none() || is_number(item.ptr())); // in a list, the rest are tensors
      keys[i] = k;
      hosts[i] = h;
    }
    key = keys;
    host = !tensors ? py::reinterpret_borrow<py::object>(value)
                    : PyTuple_Check(obj) ? py::object(py::tuple(hosts)) : py::object(hosts);
    return true;
  }
  if (in_list && obj != Py_None) return false; // in a list, only tensors, numbers and None: else the general path
  // None, strings, dtypes, ...: hashable as they are; a generator never shapes outputs: keyed None. (A C-level
  // type check: THPGenerator_Check is PyObject_IsInstance, which runs torch.Generator's Python __instancecheck__.)
  bool generator = PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(THPGeneratorClass));
  key = generator ? py::none() : py::reinterpret_borrow<py::object>(value);
  host = py::reinterpret_borrow<py::object>(value);
  return true;
}

} // namespace

// LITERALINCLUDE START: DESCRIBE CALL
// [call shape, host args, host kwargs, extents] of a call, or None when the general path must take it.
py::object describe_call(const py::tuple& args, const py::dict& kwargs, int numbers, int placed) {
  Description d{numbers, placed, py::list(), {}};
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
  py::list described(4); // a list: emptied when the call fails (see call_plans._run)
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
