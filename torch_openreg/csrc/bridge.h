// The one way the C++ bridge talks to the openreg runtime: call a function of
// torch_openreg._runtime (Python) with the GIL held, translating runtime errors
// into PyTorch's C++ errors. No policy lives on this side.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>

#include <utility>

namespace openreg {

namespace py = pybind11;

// torch_openreg._runtime, imported on first use and kept for the process.
py::object& runtime();

// True while the interpreter can run Python (false during shutdown).
bool python_alive();

// Re-raise a Python exception from the runtime as a c10 error
// (OUT_OF_MEMORY becomes c10::OutOfMemoryError, i.e. torch.OutOfMemoryError).
[[noreturn]] void rethrow(py::error_already_set& error);

// LITERALINCLUDE START: BRIDGE CALL
// A Python error may already be pending on this thread: a device guard restores the device while an
// exception unwinds out of PyTorch's Python bindings (``x[0.0:2.0]`` raises TypeError in the middle of
// indexing). It is set aside for the call and restored after, or the call would clear it and Python
// would report "SystemError: error return without exception set" instead.
template <typename R = void, typename... Args>
R call(const char* name, Args&&... args) {
  py::gil_scoped_acquire gil;
  py::error_scope pending;
  try {
    py::object result = runtime().attr(name)(std::forward<Args>(args)...);
    if constexpr (!std::is_void_v<R>) {
      return result.template cast<R>();
    }
  } catch (py::error_already_set& error) {
    rethrow(error);
  }
}
// LITERALINCLUDE END: BRIDGE CALL

// LITERALINCLUDE START: BRIDGE CALL QUIETLY
// For destructors and deleters: call without throwing and without disturbing a
// Python error that may be pending on this thread (a deleter often runs while
// an exception unwinds through Python).
template <typename... Args>
void call_quietly(const char* name, Args&&... args) noexcept {
  if (!python_alive()) return; // interpreter shutdown: the process is releasing everything anyway
  py::gil_scoped_acquire gil;
  py::error_scope pending;
  try {
    runtime().attr(name)(std::forward<Args>(args)...);
  } catch (py::error_already_set& error) {
    error.discard_as_unraisable(name);
  } catch (...) {
  }
}
// LITERALINCLUDE END: BRIDGE CALL QUIETLY

inline c10::Device device(c10::DeviceIndex index) {
  return c10::Device(c10::DeviceType::PrivateUse1, index);
}

} // namespace openreg
