"""PyTorch 2.13's rough edges for an out-of-tree device in Inductor, worked around in one place.

Inductor decides some things by device *type* where it means "the C++ backend" or "a device with
streams": ``"cpu"`` stands for C++ code generation, the GPU types for devices with device guards and
streams. Each override below changes the answer for ``"openreg"`` only, names the PyTorch code it
covers, and can be dropped once PyTorch asks the backend instead of the device type. (The other edges
are handled by ordinary subclassing: see ``wrapper.py``, and the docs' list of workarounds.)
"""

from __future__ import annotations

import functools
from typing import Any

import torch

_installed: set[str] = set()
ORIGINALS: dict[str, Any] = {}  # PyTorch's functions as they were: the tests check the edges are still there


# LITERALINCLUDE START: WORKAROUNDS
def install_dynamo() -> None:
    """The overrides for Dynamo (once; ``torch._dynamo`` is imported): ``torch.openreg`` traced like ``torch.cuda``
    (below). Fake tensors keep openreg's backend metadata through ``torch_openreg.compat``, which applies to
    eager fake-tensor users too."""
    if "dynamo" in _installed:
        return
    _installed.add("dynamo")
    _trace_torch_openreg_like_torch_cuda()


def install_inductor() -> None:
    """The overrides for Inductor (once; ``torch._inductor.compile_fx`` is imported)."""
    if "inductor" in _installed:
        return
    _installed.add("inductor")
    _cpp_backend_for_openreg()
    _loop_passes_as_on_cpu()
    _device_guards_as_on_gpus()
    _device_graphs_for_openreg()


def _cpp_backend_for_openreg() -> None:
    """``get_current_backend`` (torch/_inductor/utils.py) -> ``"cpp"`` for openreg.

    It names the code generator of a device type: ``config.cpu_backend`` for the CPU, and for every
    device type it does not know, ``config.cuda_backend`` (``"triton"``). Kernel code generation asks it
    (``CSEProxy`` in codegen/common.py, ``upcast_compute_type``), so C++ kernels for openreg were
    generated with Triton's assumptions: a masked load (``torch.cat`` done pointwise, as in GPT-2's key
    and value cache) failed with "'str' object has no attribute 'dtype'". The function is imported by
    name into several modules; each binding is replaced.
    """
    from torch._inductor import scheduler, utils
    from torch._inductor.codegen import common
    from torch._inductor.kernel import mm_common

    current_backend = ORIGINALS["get_current_backend"] = utils.get_current_backend

    def current_backend_with_openreg(device_type: str | None = None) -> str:
        if device_type is None:
            from torch._inductor.virtualized import V

            device_type = V.graph.get_current_device_or_throw().type
        return "cpp" if device_type == "openreg" else current_backend(device_type)

    for module in (utils, common, scheduler, mm_common):
        module.get_current_backend = current_backend_with_openreg


def _loop_passes_as_on_cpu() -> None:
    """``BaseSchedulerNode.is_cpu`` (torch/_inductor/scheduler.py) -> also true for openreg nodes.

    The scheduler uses it only to keep its SIMD loop passes away from the C++ code generation:
    ``shared_data_after_reordering_loop`` (loop reordering), ``_try_loop_index_inversion`` and
    ``_try_reindex_pointwise_for_reduction``. openreg uses that C++ code generation; without this,
    fusing a reduction with a pointwise node fails inside ``_try_reindex_pointwise_for_reduction``.
    """
    from torch._inductor import scheduler

    is_cpu = ORIGINALS["is_cpu"] = scheduler.BaseSchedulerNode.is_cpu

    def is_cpu_or_openreg(self: scheduler.BaseSchedulerNode) -> bool:
        device = self.get_device()
        return is_cpu(self) or (device is not None and device.type == "openreg")

    scheduler.BaseSchedulerNode.is_cpu = is_cpu_or_openreg


def _device_guards_as_on_gpus() -> None:
    """``device_need_guard`` as bound in torch/_inductor/scheduler.py -> also true for openreg.

    It is ``is_gpu(device)`` (``GPU_TYPES``: cuda, xpu, mtia): only those get a device guard around
    their kernels, and Inductor declares the streams of ``with torch.openreg.stream(s):`` regions
    inside that guard (``EnterDeviceContextManagerWithStreamInfoLine``). Without it, a graph with a
    stream region refers to streams it never declared. Adding openreg to ``GPU_TYPES`` instead would
    send it down GPU (Triton) paths everywhere else.
    """
    from torch._inductor import scheduler

    need_guard = ORIGINALS["device_need_guard"] = scheduler.device_need_guard
    scheduler.device_need_guard = lambda device: device == "openreg" or need_guard(device)


def _device_graphs_for_openreg() -> None:
    """``check_multiple_devices_or_any_cpu_nodes`` (torch/_inductor/cudagraph_utils.py) -> no objection to a graph
    on one openreg device; ``config.cudagraph_policy`` -> openreg's policy (unless one is set already).

    ``mode="reduce-overhead"`` asks for device graphs, and Inductor gives them only to graphs on one device of type
    ``"cuda"``: for any other it records "multiple devices" as the reason to skip them. Once allowed, a graph goes
    to Inductor's CUDA graph trees, which call ``torch.cuda`` directly, unless a ``CUDAGraphPolicy`` is set:
    openreg's wraps openreg graphs in openreg device graphs (``graphs.py``) and leaves CUDA graphs to the trees.
    """
    from torch._inductor import config, cudagraph_utils

    from .graphs import OpenRegGraphPolicy

    check = cudagraph_utils.check_multiple_devices_or_any_cpu_nodes
    ORIGINALS["check_multiple_devices_or_any_cpu_nodes"] = check

    def check_with_openreg(device_node_mapping: dict) -> str | None:
        devices = [d for d in device_node_mapping if d.type != "meta"]
        if len(devices) == 1 and devices[0].type == "openreg":
            return None
        return check(device_node_mapping)

    cudagraph_utils.check_multiple_devices_or_any_cpu_nodes = check_with_openreg
    if config.cudagraph_policy is None:
        config.cudagraph_policy = OpenRegGraphPolicy()
# LITERALINCLUDE END: WORKAROUNDS


# LITERALINCLUDE START: DYNAMO TRACE RULES
# trace_rules.py and variables/torch.py name torch.cuda's (and torch.xpu's) functions one by one, and key their
# special handling by those function objects: an out-of-tree device module gets neither. Each torch.openreg
# function takes its torch.cuda twin's rule, folding and handler; Stream/Event are traced as torch.Stream/Event.
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
    from torch._dynamo import trace_rules
    from torch._dynamo.variables import torch as torch_variables
    from torch._dynamo.variables.torch import TorchInGraphFunctionVariable

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
    for query in (torch.openreg.device_count, torch.openreg.is_available, torch.openreg.get_device_name,
                  torch.openreg.get_device_capability, torch.openreg.is_bf16_supported,
                  torch.openreg.get_amp_supported_dtype):
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
# LITERALINCLUDE END: DYNAMO TRACE RULES
