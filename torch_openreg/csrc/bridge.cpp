#include "bridge.h"

#include <Python.h>

namespace openreg {

py::object& runtime() {
  // Leaked on purpose: it must outlive every tensor freed at interpreter exit.
  static py::object* module = new py::object(py::module_::import("torch_openreg._runtime"));
  return *module;
}

bool python_alive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

// LITERALINCLUDE START: BRIDGE ERRORS
// A runtime error keeps its Python type (an OpenRegError, which for a failed kernel is also the
// kernel's own exception type: see openreg.errors.launch_failure), except OUT_OF_MEMORY, which
// becomes c10::OutOfMemoryError (torch.OutOfMemoryError), as PyTorch's allocators report it.
void rethrow(py::error_already_set& error) {
  if (error.matches(py::module_::import("openreg").attr("OpenRegError")) &&
      error.value().attr("code").attr("name").cast<std::string>() == "OUT_OF_MEMORY") {
    std::string message = py::str(error.value()).cast<std::string>();
    TORCH_CHECK_WITH(OutOfMemoryError, false, message);
  }
  throw; // any other Python exception keeps its type
}
// LITERALINCLUDE END: BRIDGE ERRORS

} // namespace openreg
