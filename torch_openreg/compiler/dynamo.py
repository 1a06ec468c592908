"""What Dynamo needs to know about openreg: its device interface, the trace rules of ``torch.openreg``, a backend.

* The :class:`OpenRegInterface` (``torch._dynamo.device_interface.DeviceInterface``) answers Dynamo's and
  Inductor's device questions (devices, streams, events, properties, memory) for ``"openreg"``.
* ``torch.openreg`` is traced exactly as ``torch.cuda`` is: each of its functions takes the trace rule,
  the constant folding and the special handling of the ``torch.cuda`` function of the same name, so
  ``with torch.openreg.stream(s):``, events and device queries inside a compiled function put stream
  operations in the graph instead of breaking it.
* The backend's own code (``torch_openreg``, the runtime ``openreg``) is never traced: it is what runs
  the graph, like PyTorch's C++ kernels. Without this, Dynamo would try to compile the fallback's Python
  kernels each time the eager part of a compiled function runs an operator.
* ``torch.compile(backend="openreg")`` names Inductor with openreg's defaults.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch._dynamo import device_interface, trace_rules
from torch._dynamo.backends import registry
from torch._dynamo.variables import ctx_manager
from torch._dynamo.variables import torch as torch_variables
from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

import openreg

from . import workarounds

_registered = False
_DEVICE_QUERIES = (torch.openreg.device_count, torch.openreg.is_available, torch.openreg.get_device_name,
                   torch.openreg.get_device_capability, torch.openreg.is_bf16_supported,
                   torch.openreg.get_amp_supported_dtype)


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
    _trace_torch_openreg_like_torch_cuda()
    workarounds.install_dynamo()
    ctx_manager.register_device_context_manager(torch.openreg.device, OpenRegDeviceVariable)
    # the backend's code runs graphs; it is never user code to trace (see the module docstring)
    trace_rules.add("torch_openreg")
    trace_rules.add("openreg")
    if "openreg" not in registry._COMPILER_FNS:  # (list_backends would import every backend module)
        registry.register_backend(openreg_backend, name="openreg")


def _twins() -> list[tuple[Any, Any, str]]:
    """``(torch.openreg.f, torch.cuda.f, "torch.openreg.f")`` for the functions the two modules share."""
    twins = []
    for name in torch.openreg.__all__:
        ours, cuda = getattr(torch.openreg, name), getattr(torch.cuda, name, None)
        if ours is torch.openreg.get_device_properties:  # a handler of its own (see _handle_device_properties)
            continue
        if callable(cuda) and callable(ours) and not isinstance(ours, type):
            twins.append((ours, cuda, f"torch.openreg.{name}"))
    return twins


def _trace_torch_openreg_like_torch_cuda() -> None:
    """Give each ``torch.openreg`` function the trace rule, folding and handler of its ``torch.cuda`` twin."""
    twins = _twins()
    for ours, cuda, name in twins:
        for table in trace_rules.torch_name_rule_map:  # rules by name: the object map is built later
            rule = table.get(f"{cuda.__module__}.{cuda.__qualname__}") or table.get(name.replace("openreg", "cuda"))
            if rule is not None:
                trace_rules.manual_torch_name_rule_map[name] = rule
        for folded in (torch_variables.constant_fold_functions, torch_variables.constant_fold_functions_need_guards):
            if cuda in folded:
                folded[ours] = None
    # device queries are constants for a process; torch.cuda's name, capability and bf16 support are not
    # folded (they break the graph), openreg's are
    for query in _DEVICE_QUERIES:
        trace_rules.manual_torch_name_rule_map[f"torch.openreg.{query.__name__}"] = TorchInGraphFunctionVariable
        torch_variables.constant_fold_functions[query] = None
    trace_rules.manual_torch_name_rule_map["torch.openreg.get_device_properties"] = TorchInGraphFunctionVariable
    trace_rules.get_torch_obj_rule_map.cache_clear()  # in case Dynamo traced before openreg loaded
    # calling these classes is handled: stream -> a stream context, Stream/Event -> objects in the graph
    for cls in (torch.openreg.stream, torch.openreg.Stream, torch.openreg.Event):
        trace_rules._allowed_callable_ids.add(id(cls))
    # special handling (current_stream, synchronize) is keyed by function: add ours when the table is built
    build_handlers = torch_variables.TorchInGraphFunctionVariable._get_handlers

    @functools.cache
    def handlers_with_openreg() -> dict:
        handlers = build_handlers()
        for ours, cuda, _ in twins:
            if cuda in handlers:
                handlers[ours] = handlers[cuda]
        handlers[torch.openreg.get_device_properties] = _handle_device_properties
        handlers[torch.openreg.Stream] = _handle_stream_class
        handlers[torch.openreg.Event] = _handle_event_class
        return handlers

    torch_variables.TorchInGraphFunctionVariable._get_handlers = staticmethod(handlers_with_openreg)


def _handle_device_properties(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.openreg.get_device_properties(i)``: a constant (the runtime's frozen dataclass), read at trace time."""
    from torch._dynamo.variables import FrozenDataClassVariable

    device = (args[0].as_python_constant() if args else None) if "device" not in kwargs else \
        kwargs["device"].as_python_constant()
    return FrozenDataClassVariable(torch.openreg.get_device_properties(device))


def _handle_stream_class(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.openreg.Stream(device, priority)`` traced as ``torch.Stream(device=openreg:i, priority=...)``."""
    values = dict(zip(("device", "priority"), (a.as_python_constant() for a in args)))
    values.update({k: v.as_python_constant() for k, v in kwargs.items()})
    values["device"] = torch.device("openreg", torch.openreg._index(values.get("device")))
    return _construct(tx, torch.Stream, values)


def _handle_event_class(self: Any, tx: Any, *args: Any, **kwargs: Any) -> Any:
    """``torch.openreg.Event(enable_timing, ...)`` traced as ``torch.Event(device="openreg", ...)``."""
    values = dict(zip(("enable_timing", "blocking", "interprocess"), (a.as_python_constant() for a in args)))
    values.update({k: v.as_python_constant() for k, v in kwargs.items()})
    return _construct(tx, torch.Event, {"device": torch.device("openreg"), **values})


def _construct(tx: Any, cls: type, kwargs: dict[str, Any]) -> Any:
    """What Dynamo does for ``cls(**kwargs)``: ``torch.Stream``/``torch.Event`` are objects made for the graph."""
    from torch._dynamo.variables import UserDefinedClassVariable, VariableTracker

    built = {k: VariableTracker.build(tx, v) for k, v in kwargs.items()}
    return UserDefinedClassVariable(cls).call_function(tx, [], built)
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
