// The call plans' launch in one crossing (torch_openreg/aten/fast/planned_launch.py decides when): a planned
// call whose out= kernel has run clean is launched here, given what _describe_call returned: its fresh
// outputs allocated with their host views, the operator's arguments converted once into a stack (by
// PyTorch's own conversion, torch::jit::argumentToIValue per argument, which createStackForSchema applies
// to an OpOverload call from Python), and a kernel that runs that stack through the dispatcher queued with
// Stream.launch. What the plan is, whether it may be launched here and what is returned are decided in
// Python; the kernel is the same CPU kernel the Python plan's OutKernel calls (call_plans.py), with the same
// arguments.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty_strided.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/jit/python/pybind_utils.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bridge.h"

namespace openreg {

at::Tensor host_view(const at::Tensor& t, bool writable = true); // module.cpp

namespace {

// LITERALINCLUDE START: PLANNED KERNEL
// A queued kernel: one operator and its arguments, already in the dispatcher's form. Each run takes a copy
// of the stack (reference counts only), so a graph replay can run it again; the CPU kernel runs without
// the GIL, as an OpOverload call from Python does.
class PlannedKernel {
 public:
  PlannedKernel(c10::OperatorHandle op, torch::jit::Stack stack) : op_(std::move(op)), stack_(std::move(stack)) {}
  void operator()() const {
    torch::jit::Stack stack = stack_;
    py::gil_scoped_release no_gil;
    op_.callBoxed(stack);
  }

 private:
  c10::OperatorHandle op_;
  torch::jit::Stack stack_;
};
// LITERALINCLUDE END: PLANNED KERNEL

// How a plan's calls launch: the operator its kernel calls (the out= overload of a functional operator, or
// the operator itself when it writes given outputs or in place), its arguments' names, the fresh outputs
// (the out= argument's position and the meta tensor it is shaped like) and, when it returns arguments,
// where they are.
struct Recipe {
  c10::OperatorHandle op;
  std::vector<py::str> names; // of the operator's arguments, as keyword arguments are looked up
  std::vector<std::pair<size_t, at::Tensor>> fresh;
  std::vector<std::pair<size_t, py::str>> given; // (position, name) of each returned argument
  c10::DeviceIndex index;
  py::str name;
};

c10::OperatorHandle find_operator(const std::string& name, const std::string& overload) {
  auto found = c10::Dispatcher::singleton().findSchema({name, overload});
  TORCH_CHECK(found.has_value(), "openreg: no operator ", name, ".", overload);
  return *found;
}

py::object wrap(at::Tensor t) { return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(t))); }

// LITERALINCLUDE START: OWN HOST VIEWS
// The stack's own TensorImpls over the host views' storages. A tensor the stack shared with its Python
// wrapper would keep that wrapper alive while the launch is queued (PyTorch preserves a tensor's Python object
// while C++ still holds its TensorImpl): thousands of queued launches then hold thousands of Python tensors,
// which the cyclic garbage collector promotes and walks (a full collection of a test process takes 0.2 s).
// shallow_copy_and_detach is Tensor.detach's copy: same storage, sizes, strides and conjugate/negative bits;
// its metadata may change, as a host view's may.
at::Tensor owned(const at::Tensor& t) {
  if (!t.defined()) return t;
  return at::Tensor(t.unsafeGetTensorImpl()->shallow_copy_and_detach(c10::VariableVersion(0), true));
}

c10::IValue owned(c10::IValue value) {
  if (value.isTensor()) return owned(value.toTensor());
  if (value.isList()) {
    auto list = value.toList(); // argumentToIValue's new list: changed in place
    for (size_t i = 0; i < list.size(); ++i) {
      c10::IValue item = list.get(i);
      if (item.isTensor()) list.set(i, owned(item.toTensor()));
    }
  }
  return value;
}
// LITERALINCLUDE END: OWN HOST VIEWS

// LITERALINCLUDE START: LAUNCH RECIPE
// Launch a planned call from _describe_call's host args, host kwargs and extents (the extents gain the fresh
// outputs'); ``launch`` is the current stream's Stream.launch. The stack is built as createStackForSchema
// builds it for a call from Python (argumentToIValue per argument, defaults for the rest), with the fresh
// outputs' host views put in place directly. Returns what the operator returns: the fresh outputs, or the
// returned arguments.
py::object launch_recipe(const Recipe& r, const py::tuple& host_args, const py::dict& host_kwargs, py::list extents,
                         const py::tuple& args, const py::dict& kwargs, const py::handle& launch) {
  const auto& schema = r.op.schema();
  const auto& arguments = schema.arguments();
  torch::jit::Stack stack;
  stack.reserve(arguments.size());
  std::vector<py::object> outs;
  outs.reserve(r.fresh.size());
  auto fresh = r.fresh.begin();
  for (size_t i = 0; i < arguments.size(); ++i) {
    if (fresh != r.fresh.end() && fresh->first == i) { // a fresh output: allocated here, its host view passed
      const auto& meta = fresh->second;
      auto out = at::empty_strided(meta.sizes(), meta.strides(), meta.options().device(device(r.index)));
      const auto& storage = out.storage();
      extents.append(py::make_tuple(reinterpret_cast<uintptr_t>(storage.data()), storage.nbytes()));
      stack.emplace_back(host_view(out));
      outs.push_back(wrap(std::move(out)));
      ++fresh;
    } else if (i < host_args.size()) { // PyTorch's conversion of a Python argument (what a call from Python uses)
      stack.push_back(owned(torch::jit::argumentToIValue(schema, i, host_args[i])));
    } else if (PyObject* value = PyDict_GetItem(host_kwargs.ptr(), r.names[i].ptr())) {
      stack.push_back(owned(torch::jit::argumentToIValue(schema, i, value)));
    } else {
      TORCH_CHECK(arguments[i].default_value().has_value(), "openreg: ", schema.name(), " misses ",
                  arguments[i].name());
      stack.push_back(*arguments[i].default_value());
    }
  }
  launch(py::cast(PlannedKernel(r.op, std::move(stack))), py::arg("buffers") = extents, py::arg("name") = r.name);
  if (r.fresh.empty()) {
    for (const auto& [position, name] : r.given) {
      outs.push_back(position < args.size() ? py::object(args[position]) : py::object(kwargs[name]));
    }
  }
  if (outs.empty()) return py::none();
  if (outs.size() == 1) return std::move(outs[0]);
  py::tuple result(outs.size());
  for (size_t i = 0; i < outs.size(); ++i) result[i] = std::move(outs[i]);
  return result;
}
// LITERALINCLUDE END: LAUNCH RECIPE

} // namespace

void bind_planned_launch(py::module& m) {
  py::class_<PlannedKernel>(m, "_PlannedKernel", "a queued operator call in the dispatcher's form (a kernel)")
      .def("__call__", &PlannedKernel::operator());
  py::class_<Recipe>(m, "_Recipe", "how a call plan's calls launch in one bridge call (_launch_recipe)")
      .def(py::init([](const std::string& name, const std::string& overload,
                       const std::vector<std::pair<std::string, at::Tensor>>& fresh,
                       std::vector<std::pair<size_t, py::str>> given, c10::DeviceIndex index, py::str launch_name) {
             auto op = find_operator(name, overload);
             const auto& arguments = op.schema().arguments();
             std::vector<py::str> names;
             std::vector<std::pair<size_t, at::Tensor>> outputs;
             for (size_t i = 0; i < arguments.size(); ++i) {
               names.emplace_back(arguments[i].name());
               for (const auto& [out, meta] : fresh) {
                 if (out == arguments[i].name()) outputs.emplace_back(i, meta);
               }
             }
             TORCH_CHECK(outputs.size() == fresh.size(), "openreg: ", name, ".", overload, " lacks an output argument");
             return Recipe{op, std::move(names), std::move(outputs), std::move(given), index, std::move(launch_name)};
           }),
           py::arg("name"), py::arg("overload"), py::arg("fresh"), py::arg("given"), py::arg("index"),
           py::arg("launch_name"));
  m.def("_launch_recipe", &launch_recipe,
        "launch a planned call in one bridge call: fresh outputs, the kernel's arguments, Stream.launch",
        py::arg("recipe"), py::arg("host_args"), py::arg("host_kwargs"), py::arg("extents"), py::arg("args"),
        py::arg("kwargs"), py::arg("launch"));
}

} // namespace openreg
