"""Sparse tensors on openreg: COO (``SparsePrivateUse1``) and compressed layouts (``SparseCsrPrivateUse1``).

A sparse openreg tensor is PyTorch's own ``SparseTensorImpl`` (COO: ``indices``, ``values``) or
``SparseCsrTensorImpl`` (CSR/CSC/BSR/BSC: compressed indices, plain indices, ``values``) whose
component tensors are ordinary dense openreg tensors. ATen creates the impl for whatever backend key
the options name, through ``_sparse_coo_tensor_with_dims_and_tensors`` /
``_sparse_compressed_tensor_unsafe``; what it lacks for ``SparsePrivateUse1`` and
``SparseCsrPrivateUse1`` is kernels. One fallback per key, also registered as the kernel of every
operator that has a ``SparseCPU``/``SparseCsrCPU`` one (their composite kernels would otherwise win),
sends each operator one of two ways:

* **structure and metadata, redispatched.** The factories, the accessors (``_indices``, ``values``,
  ``crow_indices``, ``_nnz``, ...), ``clone``, ``copy_``, ``zero_``, ``empty`` and the resizes are
  written once for every device: they only build impls and call operators on the components, which
  dispatch to openreg. They are redispatched to the ``SparseCPU``/``SparseCsrCPU`` kernel.
* **arithmetic, on the host path** (``host_path.py``). The CPU's sparse kernels read indices and
  values directly (``coalesce``, ``add``, ``mm``, ``sparse_mask``, ``_to_dense``, ...). They run
  synchronously, inside a launch, over CPU sparse tensors built on host views of the components (no
  copy), after PyTorch's invariant checks; results are the CPU's, bit for bit.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from . import host_path, sparse_solve
from .launch import host_view
from .traits import OpTraits, traits_of

_has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
_KEYS = {  # openreg key -> (CPU key whose kernels are borrowed, as a keyset)
    "SparsePrivateUse1": ("SparseCPU", torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCPU)),
    "SparseCsrPrivateUse1": ("SparseCsrCPU", torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCsrCPU)),
}
_COMPRESSED = {  # layout -> (compressed indices, plain indices) accessors
    torch.sparse_csr: ("crow_indices", "col_indices"), torch.sparse_bsr: ("crow_indices", "col_indices"),
    torch.sparse_csc: ("ccol_indices", "row_indices"), torch.sparse_bsc: ("ccol_indices", "row_indices"),
}

# LITERALINCLUDE START: SPARSE ROUTES
# Kernels written once for every device (they build impls and call operators on the components).
STRUCTURAL = {
    "SparsePrivateUse1": {
        "aten::_sparse_coo_tensor_with_dims_and_tensors", "aten::_sparse_coo_tensor_with_dims", "aten::_indices",
        "aten::_values", "aten::indices", "aten::values", "aten::sparse_dim", "aten::dense_dim", "aten::_dimI",
        "aten::_dimV", "aten::_nnz", "aten::is_coalesced", "aten::_coalesced_", "aten::sparse_resize_",
        "aten::sparse_resize_and_clear_", "aten::empty.memory_format", "aten::zero_", "aten::copy_sparse_to_sparse_",
        "aten::copy_", "aten::clone",
    },
    "SparseCsrPrivateUse1": {
        "aten::crow_indices", "aten::col_indices", "aten::ccol_indices", "aten::row_indices", "aten::values",
        "aten::_nnz", "aten::sparse_dim", "aten::dense_dim", "aten::clone", "aten::copy_", "aten::empty.memory_format",
        "aten::empty_like", "aten::resize_", "aten::resize_as_sparse_", "aten::zero_",
    },
}


NEVER = {"aten::_pin_memory": "only dense CPU tensors can be pinned; openreg memory is device memory"}


def sparse_fallback(key: str, op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """The fallback of ``key`` (``SparsePrivateUse1`` or ``SparseCsrPrivateUse1``)."""
    cpu_key, keyset = _KEYS[key]
    name = op.name()
    if name in NEVER:
        raise NotImplementedError(f"{name} is not supported for openreg sparse tensors: {NEVER[name]}")
    if name in STRUCTURAL[key]:
        return _redispatch(op, keyset, args, kwargs)
    if sparse_solve.applies(op, args, kwargs):  # a case CUDA's kernel computes and the CPU's cannot
        return sparse_solve.solve(op, args, kwargs)
    if not _has_kernel(name, cpu_key):
        raise NotImplementedError(
            f"{name} is not implemented for openreg sparse tensors ({key}): PyTorch has no {cpu_key} kernel "
            "for it either; convert with .to_dense() (or another sparse layout) first"
        )
    return _host_path(op, traits_of(op), args, kwargs)


def _redispatch(op, keyset, args: tuple, kwargs: dict) -> Any:
    """The CPU key's kernel, with the operator's openreg device current: a sparse impl takes its device from
    the current one when it is made, before its components are set (a CUDA kernel's wrapper guards the same)."""
    device = kwargs.get("device")
    if device is None or torch.device(device).type == "cpu":
        device = next((t.device for t in host_path.device_tensors(args, kwargs) if t.device.type != "cpu"), None)
    index = torch.device(device).index if device is not None else None
    if index is None:
        return op.redispatch(keyset, *args, **kwargs)
    previous = torch._C._accelerator_exchangeDevice(index)
    try:
        return op.redispatch(keyset, *args, **kwargs)
    finally:
        torch._C._accelerator_maybeExchangeDevice(previous)


def register(fallbacks: torch.library.Library, aten: torch.library.Library) -> int:
    """The fallbacks, and each as the kernel of every operator with a ``SparseCPU``/``SparseCsrCPU`` kernel
    (a backend fallback comes after an operator's composite kernels). Returns the count of operators."""
    count = 0
    for key, (cpu_key, _) in _KEYS.items():
        fallbacks.fallback(functools.partial(sparse_fallback, key), key)
        for name in torch._C._dispatch_get_all_op_names():
            if name.startswith("aten::") and _has_kernel(name, cpu_key) and not _has_kernel(name, key):
                packet, _, overload = name[len("aten::"):].partition(".")
                op = getattr(getattr(torch.ops.aten, packet), overload or "default")
                aten.impl(name[len("aten::"):], functools.partial(sparse_fallback, key, op), key)
                count += 1
    return count
# LITERALINCLUDE END: SPARSE ROUTES


# LITERALINCLUDE START: SPARSE HOST PATH
def members(t: torch.Tensor) -> list[torch.Tensor]:
    """The dense tensors a tensor's data lives in."""
    if t.layout == torch.sparse_coo:
        return [t._indices(), t._values()]
    if t.layout in _COMPRESSED:
        compressed, plain = _COMPRESSED[t.layout]
        return [getattr(t, compressed)(), getattr(t, plain)(), t.values()]
    return [t]


def _on_host(value: Any) -> Any:
    """An argument for the CPU kernel: openreg tensors as host views; sparse ones rebuilt over the
    host views of their components (metadata only: nothing is read or copied)."""
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(v) for v in value)
    if not isinstance(value, torch.Tensor) or value.device.type == "cpu":
        return value
    if value.layout == torch.sparse_coo or value.layout in _COMPRESSED:
        # Built outside the launch, where the components' memory is the device's: with
        # torch.sparse.check_sparse_tensor_invariants on, the constructors would read the indices here (a host
        # access to device memory). The kernel validates them inside the launch instead (_validate).
        checking = torch._C._check_sparse_tensor_invariants()
        torch._C._set_check_sparse_tensor_invariants(False)
        try:
            parts = [host_view(m) for m in members(value)]
            if value.layout == torch.sparse_coo:
                host = torch.ops.aten._sparse_coo_tensor_unsafe(*parts, value.shape, dtype=value.dtype,
                                                                 is_coalesced=value.is_coalesced())
            else:
                host = torch.ops.aten._sparse_compressed_tensor_unsafe(*parts, value.shape, dtype=value.dtype,
                                                                       layout=value.layout)
        finally:
            torch._C._set_check_sparse_tensor_invariants(checking)
    else:
        host = host_view(value)
    # Some CPU kernels decide what to compute from requires_grad (``_sparse_mm_reduce_impl`` keeps the argmax
    # indices its backward reads only for inputs that require grad): the host form says what the tensor does.
    return host.requires_grad_() if value.requires_grad and host.is_leaf else host


def _validate(t: torch.Tensor) -> None:
    """PyTorch's invariant checks of a sparse argument (indices within the size, ...), always: the CPU's
    kernels trust the indices, and one out of bounds would read or write past a host view into other
    device memory, which faults (on the CPU it is undefined behaviour; on CUDA a device-side assert)."""
    if t.layout == torch.sparse_coo:
        torch._validate_sparse_coo_tensor_args(t._indices(), t._values(), t.shape)
    elif t.layout in _COMPRESSED:
        torch._validate_sparse_compressed_tensor_args(*members(t), t.shape, t.layout)


def _rebuild(host: torch.Tensor, on_device) -> torch.Tensor:
    """An openreg sparse tensor of a host result's layout, over its components mapped by ``on_device`` (a view
    of an input keeps sharing the input's device memory)."""
    parts = [on_device(m) for m in members(host)]
    if host.layout == torch.sparse_coo:
        return torch.ops.aten._sparse_coo_tensor_unsafe(*parts, host.shape, dtype=host.dtype,
                                                         is_coalesced=host.is_coalesced())
    # the device named: without it the factory makes a CPU tensor around openreg components (and refuses them)
    return torch.ops.aten._sparse_compressed_tensor_unsafe(*parts, host.shape, dtype=host.dtype, layout=host.layout,
                                                           device=parts[-1].device)


def _host_path(op, traits: OpTraits, args: tuple, kwargs: dict) -> Any:
    return host_path.run(op, traits, args, kwargs, on_host=_on_host, parts=members, validate=_validate,
                         rebuild=_rebuild)
# LITERALINCLUDE END: SPARSE HOST PATH
