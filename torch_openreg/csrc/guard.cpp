// DeviceGuardImplInterface for PrivateUse1: devices, streams and events as
// PyTorch's device-generic code (autograd engine, torch.Stream, torch.Event,
// torch.accelerator) sees them. Every method forwards to the runtime.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/utils/pybind.h>

#include <array>
#include <atomic>
#include <vector>

#include "bridge.h"

namespace openreg {
namespace {

constexpr auto kType = c10::DeviceType::PrivateUse1;

c10::Stream make_stream(c10::DeviceIndex index, int64_t id) {
  return c10::Stream(c10::Stream::UNSAFE, device(index), static_cast<c10::StreamId>(id));
}

// An event is a runtime Event object; the void* PyTorch holds is its PyObject*.
py::object borrow(void* event) {
  return event ? py::reinterpret_borrow<py::object>(static_cast<PyObject*>(event)) : py::none();
}

// LITERALINCLUDE START: CURRENT STREAMS
// Each thread's current stream per device, as the runtime last told it (openreg.stream.set_current_listener:
// every change of a thread's current stream is told on that thread). PyTorch asks for the current stream
// at every autograd node it creates and sets a stream guard around every node the engine runs (4-5 calls a
// backward operator): with this copy those calls reach Python only when the stream changes. -1: not known
// yet (the runtime is asked once). Off, every call asks the runtime (OPENREG_CPP_LAUNCH=0).
std::atomic<bool> g_streams_known{false};
thread_local std::array<int64_t, 128> t_current = [] {
  std::array<int64_t, 128> unknown;
  unknown.fill(-1);
  return unknown;
}();

void current_stream_changed(c10::DeviceIndex index, int64_t id) {
  if (index >= 0 && static_cast<size_t>(index) < t_current.size()) t_current[index] = id;
}

int64_t* known_stream(c10::DeviceIndex index) {
  if (!g_streams_known.load(std::memory_order_relaxed) || index < 0 ||
      static_cast<size_t>(index) >= t_current.size())
    return nullptr;
  return &t_current[index];
}
// LITERALINCLUDE END: CURRENT STREAMS

// LITERALINCLUDE START: GUARD IMPL
struct GuardImpl final : public c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override { return kType; }

  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "expected an openreg device, got ", d);
    return device(call<c10::DeviceIndex>("exchange_device", d.index()));
  }
  c10::Device getDevice() const override { return device(call<c10::DeviceIndex>("get_device")); }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == kType, "expected an openreg device, got ", d);
    call("set_device", d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    try {
      call("set_device", d.index());
    } catch (...) {
    }
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    try {
      return call<c10::DeviceIndex>("device_count");
    } catch (...) {
      return 0; // must not throw: a broken runtime reports no devices
    }
  }

  // torch.accelerator.get_device_capability: the dtypes openreg tensors hold and convert between
  // (the list is the Python side's, torch_openreg._runtime.supported_dtypes).
  c10::DeviceCapability getDeviceCapability(c10::Device d) const override {
    c10::DeviceCapability cap;
    cap.capability_data.capability_bits = 0;
    for (auto type : call<std::vector<c10::ScalarType>>("supported_dtypes", resolve(d))) {
#define OPENREG_SET_BIT(_, name) \
  if (type == c10::ScalarType::name) cap.capability_data.capability_bits |= 1ULL << c10::kIndex_##name;
      AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(OPENREG_SET_BIT)
#undef OPENREG_SET_BIT
    }
    return cap;
  }

  // Streams name a concrete device: -1 ("current") is resolved here.
  c10::DeviceIndex resolve(c10::Device d) const { return d.index() == -1 ? getDevice().index() : d.index(); }
  c10::Stream getStream(c10::Device d) const override {
    auto index = resolve(d);
    int64_t* known = known_stream(index);
    if (known && *known >= 0) return make_stream(index, *known);
    int64_t id = call<int64_t>("current_stream", index);
    if (known) *known = id;
    return make_stream(index, id);
  }
  c10::Stream getDefaultStream(c10::Device d) const override { return make_stream(resolve(d), 0); }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool high) const override {
    auto index = resolve(d);
    return make_stream(index, call<int64_t>("pool_stream", index, high));
  }
  c10::Stream getNewStream(c10::Device d, int priority) const override {
    auto index = resolve(d);
    return make_stream(index, call<int64_t>("priority_pool_stream", index, priority));
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    int64_t* known = known_stream(s.device_index());
    if (known && *known == s.id()) return s; // already current: nothing changes
    return make_stream(s.device_index(), call<int64_t>("set_stream", s.device_index(), s.id()));
  }
  bool queryStream(const c10::Stream& s) const override {
    return call<bool>("query_stream", s.device_index(), s.id());
  }
  void synchronizeStream(const c10::Stream& s) const override {
    call("synchronize_stream", s.device_index(), s.id());
  }
  void synchronizeDevice(c10::DeviceIndex index) const override { call("synchronize_device", index); }
  // torch.Stream.native_handle: the runtime's handle of the stream, its id (0 for the default stream,
  // as CUDA's legacy default stream is 0); openreg.get_stream(device, handle) finds it.
  void* getStreamNativeHandle(const c10::Stream s) const override {
    return reinterpret_cast<void*>(static_cast<intptr_t>(s.id()));
  }

  void record(void** event, const c10::Stream& s, c10::DeviceIndex index, c10::EventFlag flag) const override {
    TORCH_CHECK(index == -1 || index == s.device_index(), "event on openreg:", index,
                " cannot be recorded on a stream of openreg:", s.device_index());
    py::gil_scoped_acquire gil;
    py::object ev = call<py::object>("event_record", borrow(*event), s.device_index(), s.id(),
                                     flag == c10::EventFlag::BACKEND_DEFAULT);
    if (*event == nullptr) {
      *event = ev.release().ptr(); // owned by PyTorch until destroyEvent
    }
  }
  void block(void* event, const c10::Stream& s) const override {
    if (event) call("event_block", borrow(event), s.device_index(), s.id());
  }
  bool queryEvent(void* event) const override { return !event || call<bool>("event_query", borrow(event)); }
  void synchronizeEvent(void* event) const override {
    if (event) call("event_synchronize", borrow(event));
  }
  double elapsedTime(void* start, void* end, c10::DeviceIndex) const override {
    TORCH_CHECK(start && end, "elapsed_time: both events must be recorded first");
    return call<double>("event_elapsed", borrow(start), borrow(end));
  }
  void destroyEvent(void* event, c10::DeviceIndex) const noexcept override {
    if (event && python_alive()) {
      py::gil_scoped_acquire gil;
      py::error_scope pending;
      Py_DECREF(static_cast<PyObject*>(event));
    }
  }
};
// LITERALINCLUDE END: GUARD IMPL

// LITERALINCLUDE START: REGISTER GUARD
C10_REGISTER_GUARD_IMPL(PrivateUse1, GuardImpl);
// LITERALINCLUDE END: REGISTER GUARD

} // namespace

void bind_current_streams(py::module& m) {
  m.def("_current_stream_changed", &current_stream_changed,
        "the runtime tells the bridge this thread's new current stream on a device", py::arg("device"),
        py::arg("stream_id"));
  m.def(
      "_know_current_streams", [](bool on) { g_streams_known.store(on); },
      "whether the device guard answers from the streams the runtime told it (OPENREG_CPP_LAUNCH)", py::arg("on"));
}
} // namespace openreg
