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
void rethrow(py::error_already_set& error) {
  std::string message = error.what();
  bool oom = false;
  if (error.matches(py::module_::import("openreg").attr("OpenRegError"))) {
    py::object code = error.value().attr("code");
    oom = code.attr("name").cast<std::string>() == "OUT_OF_MEMORY";
    message = py::str(error.value()).cast<std::string>();
  } else {
    throw; // any other Python exception keeps its type
  }
  if (oom) {
    TORCH_CHECK_WITH(OutOfMemoryError, false, message);
  }
  TORCH_CHECK(false, message);
}
// LITERALINCLUDE END: BRIDGE ERRORS

} // namespace openreg
