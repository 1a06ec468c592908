// torch.accelerator.Graph for openreg: PyTorch 2.13 reaches a device's graph implementation only through
// C++ (at::GraphImplInterface, registered per device type with REGISTER_GRAPH_IMPL in
// ATen/core/GraphImplInterface.h). Every method forwards to the Python object torch_openreg._runtime
// makes for the graph (torch_openreg.device.graphs._GraphImpl); capture and replay live in the runtime.
#include <ATen/core/GraphImplInterface.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <utility>

#include "bridge.h"

namespace openreg {
namespace {

// LITERALINCLUDE START: GRAPH IMPL
struct GraphImpl final : public at::GraphImplInterface {
  explicit GraphImpl(const at::GraphImplArgs& args) {
    py::gil_scoped_acquire gil;
    impl_ = call<py::object>("graph_new", args.keep_graph);
  }
  ~GraphImpl() override {
    if (!python_alive()) { // interpreter shutdown: the process lets go of everything anyway
      impl_.release();
      return;
    }
    call_quietly("graph_call", "destroy", impl_);
    py::gil_scoped_acquire gil;
    impl_ = py::object();
  }

  void capture_begin(c10::MempoolId_t pool, at::GraphCaptureMode mode) override {
    call("graph_call", "capture_begin", impl_, pool.first, pool.second, static_cast<int>(mode));
  }
  void capture_end() override { call("graph_call", "capture_end", impl_); }
  void instantiate() override { call("graph_call", "instantiate", impl_); }
  void replay() override { call("graph_call", "replay", impl_); }
  void reset() override { call("graph_call", "reset", impl_); }
  c10::MempoolId_t pool() const override {
    return call<std::pair<c10::CaptureId_t, c10::CaptureId_t>>("graph_call", "pool", impl_);
  }
  void enable_debug_mode() override { call("graph_call", "enable_debug_mode", impl_); }
  void debug_dump(const std::string& path) override { call("graph_call", "debug_dump", impl_, path); }

 private:
  py::object impl_;
};

} // namespace
} // namespace openreg

namespace at {
// The registry's key is the device type's upper-case name (c10::DeviceTypeName(type, false)): PrivateUse1
// renamed to openreg is OPENREG.
REGISTER_GRAPH_IMPL(OPENREG, openreg::GraphImpl);
} // namespace at
// LITERALINCLUDE END: GRAPH IMPL
