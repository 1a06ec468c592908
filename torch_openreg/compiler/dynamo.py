"""What Dynamo needs to know about openreg: its device interface, the trace rules of ``torch.openreg``, a backend.

* The :class:`OpenRegInterface` (``torch._dynamo.device_interface.DeviceInterface``) answers Dynamo's and
  Inductor's device questions (devices, streams, events, properties, memory) for ``"openreg"``.
* ``torch.openreg`` is traced exactly as ``torch.cuda`` is: each of its functions takes the trace rule,
  the constant folding and the special handling of the ``torch.cuda`` function of the same name, so
  ``with torch.openreg.stream(s):``, events and device queries inside a compiled function put stream
  operations in the graph instead of breaking it. Dynamo names ``torch.cuda``'s functions one by one, so
  this is a PyTorch 2.13 workaround: ``workarounds.install_dynamo`` holds it.
* The backend's own code (``torch_openreg``, the runtime ``openreg``) is never traced: it is what runs
  the graph, like PyTorch's C++ kernels. Without this, Dynamo would try to compile the fallback's Python
  kernels each time the eager part of a compiled function runs an operator.
* ``torch.compile(backend="openreg")`` names Inductor with openreg's defaults.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._dynamo import device_interface, trace_rules
from torch._dynamo.backends import registry
from torch._dynamo.variables import ctx_manager

import openreg

from . import workarounds

_registered = False


# LITERALINCLUDE START: DEVICE INTERFACE
class OpenRegInterface(device_interface.DeviceInterface):
    """``torch._dynamo.device_interface.DeviceInterface`` for openreg, built from ``torch.openreg``."""

    device = torch.openreg.device
    Event = torch.openreg.Event  # builds a torch.Event: what Dynamo's EventVariable expects
    Stream = torch.openreg.Stream

    class Worker:
        """Answers for Inductor's compile workers, from properties read in the parent process."""

        @staticmethod
        def set_device(device: int) -> None:
            device_interface.caching_worker_current_devices["openreg"] = device

        @staticmethod
        def current_device() -> int:
            return device_interface.caching_worker_current_devices.get("openreg", torch.openreg.current_device())

        @staticmethod
        def get_device_properties(device: torch.types.Device = None) -> openreg.DeviceProperties:
            cache = device_interface.caching_worker_device_properties
            if "openreg" not in cache:
                cache["openreg"] = [torch.openreg.get_device_properties(i) for i in range(torch.openreg.device_count())]
            index = OpenRegInterface.Worker.current_device() if device is None else torch.openreg._index(device)
            return cache["openreg"][index]

    current_device = staticmethod(torch.openreg.current_device)
    set_device = staticmethod(torch.openreg.set_device)
    exchange_device = staticmethod(torch._C._accelerator_exchangeDevice)
    maybe_exchange_device = staticmethod(torch._C._accelerator_maybeExchangeDevice)
    device_count = staticmethod(torch.openreg.device_count)
    is_available = staticmethod(torch.openreg.is_available)
    stream = staticmethod(torch.openreg.stream)
    current_stream = staticmethod(torch.openreg.current_stream)
    set_stream = staticmethod(torch.openreg.set_stream)
    synchronize = staticmethod(torch.openreg.synchronize)
    get_device_properties = staticmethod(torch.openreg.get_device_properties)
    memory_allocated = staticmethod(torch.openreg.memory_allocated)
    is_bf16_supported = staticmethod(torch.openreg.is_bf16_supported)

    @staticmethod
    def _set_stream_by_id(stream_id: int, device_index: int, device_type: int) -> None:
        torch.openreg.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index, device_type=device_type))

    @staticmethod
    def get_raw_stream(device_idx: int) -> int:
        """The runtime's id of the current stream (what ``openreg.get_stream`` takes)."""
        return torch.openreg.current_stream(device_idx).stream_id

    @staticmethod
    def get_compute_capability(device: torch.types.Device = None) -> int:
        major, minor = torch.openreg.get_device_capability(device)
        return major * 10 + minor

    @staticmethod
    def is_triton_capable(device: torch.types.Device = None) -> bool:
        return False  # Inductor's C++ code generation computes on the host's cores
# LITERALINCLUDE END: DEVICE INTERFACE


class OpenRegDeviceVariable(ctx_manager.GenericDeviceVariable):
    """``with torch.openreg.device(i):`` in a compiled function, as Dynamo handles ``torch.cuda.device``."""

    _exchange_fn = staticmethod(torch._C._accelerator_exchangeDevice)
    _maybe_exchange_fn = staticmethod(torch._C._accelerator_maybeExchangeDevice)
    _get_device_index_fn = staticmethod(lambda device, optional=False: torch.openreg._index(device))

    def module_name(self) -> str:
        return "torch.openreg"

    def python_type(self) -> type:
        return torch.openreg.device


# LITERALINCLUDE START: DYNAMO REGISTER
def register() -> None:
    """Register openreg with Dynamo (once), right after ``torch._dynamo`` is imported.

    It runs in the middle of whatever import brought Dynamo in, so it imports nothing new and only
    fills Dynamo's tables: the modules it uses are loaded by ``torch._dynamo`` itself.
    """
    global _registered
    if _registered:
        return
    _registered = True
    device_interface.register_interface_for_device("openreg", OpenRegInterface)
    for index in range(torch.openreg.device_count()):
        device_interface.register_interface_for_device(f"openreg:{index}", OpenRegInterface)
    workarounds.install_dynamo()  # torch.openreg traced like torch.cuda
    ctx_manager.register_device_context_manager(torch.openreg.device, OpenRegDeviceVariable)
    # the backend's code runs graphs; it is never user code to trace (see the module docstring)
    trace_rules.add("torch_openreg")
    trace_rules.add("openreg")
    if "openreg" not in registry._COMPILER_FNS:  # (list_backends would import every backend module)
        registry.register_backend(openreg_backend, name="openreg")


# LITERALINCLUDE END: DYNAMO REGISTER


# LITERALINCLUDE START: NAMED BACKEND
def openreg_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Any:
    """``torch.compile(backend="openreg")``: Inductor, with openreg's kernels (``options=`` go to Inductor)."""
    from torch._inductor.compile_fx import compile_fx

    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    if devices - {"openreg", "cpu"}:
        raise RuntimeError(f"backend='openreg' compiles graphs of openreg tensors; this one has {sorted(devices)}")
    return compile_fx(gm, example_inputs, config_patches=kwargs.get("options"))
# LITERALINCLUDE END: NAMED BACKEND
