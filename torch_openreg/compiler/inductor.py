"""The Inductor backend for openreg: scheduling (kernel code), wrapper code, device-op overrides.

openreg computes with the host's CPU cores, so its kernels are Inductor's C++/OpenMP kernels
(``CppScheduling``), unchanged. What a vendor with its own compiler would replace is the scheduling
(its kernel code generation, e.g. a Triton backend); the wrapper (``wrapper.py``: allocation and
launch) and the device-op overrides below have the same shape for any device.

:func:`register` runs right after ``torch._inductor.compile_fx`` is imported (see ``__init__.py``), so
the backend is in place before Inductor first looks one up; it imports nothing ``compile_fx`` has not
loaded already (the import that brought ``compile_fx`` in may still be running). PyTorch's own look-up for PrivateUse1
(``torch.openreg.Scheduling`` and friends, read by ``init_backend_registration``) is not used: it
registers no custom pass, and the pass below is what keys Inductor's FX graph cache to this code.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch._inductor.codegen.common import (
    DeviceOpOverrides,
    register_backend_for_device,
    register_device_op_overrides,
)
from torch._inductor.codegen.cpp import CppScheduling
from torch._inductor.codegen.wrapper import PythonWrapperCodegen
from torch._inductor.custom_graph_pass import CustomGraphModulePass, get_hash_for_files

from . import workarounds
from .wrapper import OpenRegPythonWrapperCodegen

_registered = False


# LITERALINCLUDE START: SCHEDULING
class OpenRegScheduling(CppScheduling):
    """Kernel code generation for openreg: Inductor's C++/OpenMP kernels, which take raw pointers.

    The kernels are the CPU's; that they run on openreg is the wrapper's doing (each call is a launch).
    """
# LITERALINCLUDE END: SCHEDULING


# LITERALINCLUDE START: DEVICE OP OVERRIDES
class OpenRegDeviceOpOverrides(DeviceOpOverrides):
    """The device calls Inductor writes into wrapper code (``torch.cuda.*`` for CUDA)."""

    def import_get_raw_stream_as(self, name: str) -> str:
        return f"from torch_openreg.compiler.runtime import get_raw_stream as {name}"

    def set_device(self, device_idx: int) -> str:
        return "pass  # the device guard above made the device current"

    def synchronize(self) -> str:
        return "torch.openreg.synchronize()"

    def device_guard(self, device_idx: int) -> str:
        return f"torch.openreg.device({device_idx})"

    def current_stream(self) -> str:
        return "torch.openreg.current_stream()"

    def cpp_kernel_type(self) -> str:
        return "void*"
# LITERALINCLUDE END: DEVICE OP OVERRIDES


class NoCppWrapper(PythonWrapperCodegen):
    """The C++ and FX wrappers on openreg (``cpp_wrapper=True``, AOTInductor, ``fx_wrapper=True``): refused.

    Both would call the kernels directly, outside any launch: openreg kernels must run as launches on
    the runtime's streams, and the openreg runtime has a Python API only, which C++ code cannot call.
    """

    @staticmethod
    def create(*args: object, **kwargs: object) -> PythonWrapperCodegen:
        raise RuntimeError(
            "openreg has no C++ or FX wrapper (cpp_wrapper=True, AOTInductor, fx_wrapper=True): openreg kernels run "
            "as launches on the runtime's streams, whose API is Python only. Compile with the Python wrapper (the "
            "default) instead."
        )


class OpenRegGraphPass(CustomGraphModulePass):
    """The post-grad pass Inductor runs on openreg graphs: nothing to rewrite today.

    Its ``uuid`` enters Inductor's FX graph cache key. The cache stores the generated wrapper code,
    which this package writes: the key must change when this package does, or a cached graph written by
    an older openreg would be loaded. A vendor's graph rewrites would go in ``__call__``.
    """

    def __call__(self, gm: torch.fx.GraphModule) -> None:
        pass

    def uuid(self) -> bytes:
        return get_hash_for_files(tuple(str(p) for p in sorted(Path(__file__).parent.glob("*.py"))))


# LITERALINCLUDE START: INDUCTOR REGISTER
def register() -> None:
    """Register openreg's Inductor backend and device-op overrides, and apply the workarounds (once)."""
    global _registered
    if _registered:
        return
    _registered = True
    workarounds.install_inductor()
    register_device_op_overrides("openreg", OpenRegDeviceOpOverrides())
    register_backend_for_device("openreg", OpenRegScheduling, OpenRegPythonWrapperCodegen, NoCppWrapper,
                                NoCppWrapper, device_custom_pass=OpenRegGraphPass())
# LITERALINCLUDE END: INDUCTOR REGISTER
