"""Nested tensors with the strided layout on openreg (dispatch key ``NestedTensorPrivateUse1``).

A strided nested tensor (``torch.nested.nested_tensor(..., layout=torch.strided)``) is a
``NestedTensorImpl``: one buffer (here, openreg device memory) plus CPU metadata (each component's
sizes, strides and offset into the buffer). ATen's nested kernels are registered per device key
(``NestedTensorCPU``, ``NestedTensorCUDA``, ...), and there is none for ``NestedTensorPrivateUse1``,
so openreg registers one boxed fallback for that key, which sends each operator one of two ways:

* **device-generic kernels, redispatched.** Most of ATen's nested kernels compute through ordinary
  operators on the buffer or on views of it (``NestedTensor_add_Tensor`` adds two buffers,
  ``bmm_nested`` runs ``mm`` per component, ``unbind`` makes views): run for an openreg nested
  tensor, those operators dispatch to openreg, so they run asynchronously on the device. PyTorch marks
  that kind of kernel by registering it for ``NestedTensorHPU`` too (an out-of-tree device); the
  fallback redispatches those, plus three CPU-only ones that are generic as well, to the
  ``NestedTensorCPU`` kernel.
* **everything else, on the host path** (``host_path.py``). The CPU-specific nested kernels read the
  buffer directly (``sum``, the attention helpers ``_transform_bias_rescale_qkv``,
  ``_native_multi_head_attention``, ...). They run synchronously over host views: each openreg nested
  argument becomes a CPU nested tensor over the host view of its buffer (``_nested_view_from_buffer``),
  the CPU kernel runs inside a launch, and new results are copied to the device.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import host_path
from .launch import host_view
from .traits import OpTraits, traits_of

_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
_NESTED_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.NestedTensorCPU)
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

# LITERALINCLUDE START: NESTED ROUTES
# CPU-only nested kernels that are device-generic all the same (composed of operators on the buffer).
GENERIC_CPU_ONLY = {"aten::to_padded_tensor", "aten::bmm", "aten::_nested_tensor_storage_offsets"}
# Generic kernels the host path runs all the same: the layer norms call a DispatchStub themselves (a CPU
# kernel looked up by device type), and the transformer encoder layer is one operator whose CPU kernel's
# result the host path gives bit for bit (redispatched, it differs from the CPU's in the last bit).
HOST_PATH = {"aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::_transformer_encoder_layer_fwd"}
NEVER = {"aten::_pin_memory": "pinning applies to CPU tensors; openreg memory is device memory"}
_infos: dict[torch._ops.OpOverload, tuple[str, OpTraits | None]] = {}


def _route(op: torch._ops.OpOverload) -> tuple[str, OpTraits | None]:
    route = _infos.get(op)
    if route is None:
        name = op.name()
        if name in NEVER:
            route = ("never", None)
        elif (_has_kernel(name, "NestedTensorHPU") or name in GENERIC_CPU_ONLY) and name not in HOST_PATH:
            route = ("generic", None)
        elif _has_kernel(name, "NestedTensorCPU"):
            route = ("host", traits_of(op))
        else:
            route = ("none", None)
        _infos[op] = route
    return route


def nested_fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """The ``NestedTensorPrivateUse1`` fallback: a generic kernel redispatched, else the host path."""
    kind, info = _route(op)
    if kind == "generic":
        return op.redispatch(_NESTED_CPU, *_wrap_numbers(op, args), **kwargs)
    if kind == "host":
        return _host_path(op, info, args, kwargs)
    if kind == "never":
        raise NotImplementedError(f"{op.name()} is not supported for openreg nested tensors: {NEVER[op.name()]}")
    raise NotImplementedError(
        f"{op.name()} is not implemented for nested tensors with the strided layout (PyTorch has no nested "
        "kernel for it, on the CPU either); nested tensors with layout=torch.jagged support more operators"
    )


def register(lib: torch.library.Library) -> int:
    """The fallback as the ``NestedTensorPrivateUse1`` kernel of every operator with a ``NestedTensorCPU`` one.

    A backend fallback comes after an operator's composite kernels: ``linear``, ``matmul``, ``chunk``
    and ``narrow`` have a CompositeImplicitAutograd kernel, which would decompose them into operators
    that nested tensors do not have, where the CPU runs its nested kernel. Returns the count."""
    count = 0
    for name in torch._C._dispatch_get_all_op_names():
        if _has_kernel(name, "NestedTensorCPU") and not _has_kernel(name, "NestedTensorPrivateUse1"):
            packet, _, overload = name.partition("::")[2].partition(".")
            op = getattr(getattr(torch.ops.aten, packet), overload or "default")
            lib.impl(name.partition("::")[2], functools.partial(nested_fallback, op), "NestedTensorPrivateUse1")
            count += 1
    return count


def nested_from_padded(padded: torch.Tensor, cpu_nested_shape_example: torch.Tensor,
                       fuse_transform_0213: bool = False) -> torch.Tensor:
    """``aten::_nested_from_padded`` (PrivateUse1; the backward of ``to_padded_tensor``): the CPU's kernel,
    which is generic (it narrows the padded tensor and concatenates), redispatched; the sizes are CPU
    metadata, as for every nested tensor."""
    return torch.ops.aten._nested_from_padded.default.redispatch(
        _CPU, padded, cpu_nested_shape_example, fuse_transform_0213)


def nested_view_from_buffer(buffer: torch.Tensor, nested_size: torch.Tensor, nested_strides: torch.Tensor,
                            offsets: torch.Tensor) -> torch.Tensor:
    """``aten::_nested_view_from_buffer`` (PrivateUse1; ``torch.load`` of a nested tensor rebuilds it so): the
    CPU's kernel, which only makes a ``NestedTensorImpl`` over the buffer with the CPU metadata."""
    return torch.ops.aten._nested_view_from_buffer.default.redispatch(_CPU, buffer, nested_size, nested_strides,
                                                                      offsets)


def nested_view_from_buffer_copy(buffer, nested_size, nested_strides, offsets) -> torch.Tensor:
    """``aten::_nested_view_from_buffer_copy`` (PrivateUse1): the same over a copy of the buffer."""
    return nested_view_from_buffer(buffer.clone(), nested_size, nested_strides, offsets)


def _wrap_numbers(op: torch._ops.OpOverload, args: tuple) -> tuple:
    """Python numbers passed for ``Tensor`` arguments (a boxed kernel receives ``nt * 2``'s 2 unwrapped)
    as 0-dim CPU tensors again, in the dtype the number takes in the operation."""
    arguments = op._schema.arguments
    if not any(isinstance(a, (bool, int, float)) and i < len(arguments) and str(arguments[i].type) == "Tensor"
               for i, a in enumerate(args)):
        return args
    ref = next((a for a in args if isinstance(a, torch.Tensor)), None)
    wrapped = list(args)
    for i, a in enumerate(args):
        if isinstance(a, (bool, int, float)) and i < len(arguments) and str(arguments[i].type) == "Tensor":
            dtype = torch.result_type(ref, a) if ref is not None else None
            wrapped[i] = torch.tensor(a, dtype=dtype)
    return tuple(wrapped)
# LITERALINCLUDE END: NESTED ROUTES


# LITERALINCLUDE START: NESTED HOST PATH
def _buffer(t: torch.Tensor) -> torch.Tensor:
    """A 1-D openreg tensor over a nested tensor's whole storage: the nested metadata's offsets count from it."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage())


def _on_host(value: Any) -> Any:
    """An argument for the CPU kernel: openreg tensors as host views, nested ones rebuilt over them."""
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(v) for v in value)
    if not isinstance(value, torch.Tensor) or value.device.type == "cpu":
        return value
    if value.is_nested:
        return torch._nested_view_from_buffer(host_view(_buffer(value)), value._nested_tensor_size(),
                                              value._nested_tensor_strides(), value._nested_tensor_storage_offsets())
    return host_view(value)


def _parts(t: torch.Tensor) -> list[torch.Tensor]:
    return [_buffer(t)] if t.is_nested else [t]


def _host_path(op, traits: OpTraits, args: tuple, kwargs: dict) -> Any:
    return host_path.run(op, traits, args, kwargs, on_host=_on_host, parts=_parts)
# LITERALINCLUDE END: NESTED HOST PATH
