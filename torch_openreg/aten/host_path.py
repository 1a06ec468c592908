"""The host path of the sparse and nested layouts: a CPU layout kernel run over host views, synchronously.

The CPU's kernels for sparse and nested tensors read their parts (indices, values, buffers) through
data pointers. For openreg tensors they run inside one launch (``run_sync``), over CPU tensors of the
same layout that the layout module builds on host views of the parts (``on_host``): metadata only,
nothing is copied. Results are made host-owned inside the launch wherever they still point into
device memory (which the host may read only there); then new results are copied to the device, and
an in-place result is either the argument itself (written through the views) or, when the operator
replaced its parts (a sparse ``add_`` that adds entries), copied back into it with ``copy_``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torch_openreg import sync_debug

from .launch import detach_frames, host_view, run_sync
from .traits import Kind, OpTraits


def device_tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Every tensor among the arguments (alone or in lists)."""
    found = []
    for value in (*args, *kwargs.values()):
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, torch.Tensor):
                found.append(v)
    return found


def device_of(name: str, tensors: list[torch.Tensor]) -> torch.device:
    """The call's one openreg device; CPU tensors only as 0-dim dense scalars, as for the fallback."""
    devices = {t.device for t in tensors if t.device.type != "cpu"}
    strays = [t for t in tensors if t.device.type == "cpu" and (t.layout != torch.strided or t.is_nested
                                                               or t.dim() > 0)]
    if len(devices) != 1 or strays:
        found = sorted({str(t.device) for t in tensors})
        raise RuntimeError(f"Expected all tensors to be on the same device, but found {found} (in {name}; only "
                           "0-dim CPU tensors mix with openreg)")
    return devices.pop()


# LITERALINCLUDE START: HOST PATH
def run(op: torch._ops.OpOverload, traits: OpTraits, args: tuple, kwargs: dict, *, on_host: Callable[[Any], Any],
        parts: Callable[[torch.Tensor], list[torch.Tensor]],
        validate: Callable[[torch.Tensor], None] | None = None,
        rebuild: Callable[[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]], torch.Tensor] | None = None) -> Any:
    """Run ``op``'s CPU kernel over host-side copies of the arguments' metadata (``on_host``), in a launch.

    ``parts(t)`` lists the dense tensors a tensor's data lives in (the storages the launch opens);
    ``validate(t)``, if given, checks each host-side argument before the kernel trusts it;
    ``rebuild(r, on_device)``, if given, makes an openreg tensor of a host result that is a view of an input
    (``_sparse_broadcast_to``), each of its parts mapped by ``on_device``: a view of the device memory it
    aliases, or a copy of what the kernel allocated.
    """
    try:
        # the host waits for what the simulator needs; reported where CUDA would wait too
        return sync_debug.run_reported(op.name() if traits.host_waits else None,
                                       _run, op, traits, args, kwargs, on_host, parts, validate, rebuild)
    except BaseException as exc:
        detach_frames(exc, "host path")  # the frames below hold the host forms: a runner formatting them faults
        raise


def _run(op, traits: OpTraits, args: tuple, kwargs: dict, on_host, parts, validate, rebuild) -> Any:
    tensors = device_tensors(args, kwargs)
    device = device_of(op.name(), tensors)
    extents = [p for t in tensors if t.device.type != "cpu" for p in parts(t)]
    kinds = [ret.kind for ret in traits.returns]
    written = [p for ret in traits.returns if ret.kind is Kind.INPLACE
               for p in parts(traits.value(args, kwargs, ret.arg))]
    host_args, host_kwargs = list(on_host(args)), {k: on_host(v) for k, v in kwargs.items()}
    for ret in traits.returns:  # a compressed in-place/out= argument: the kernel writes a host-owned copy
        if ret.kind is Kind.INPLACE and traits.value(args, kwargs, ret.arg).layout in _COMPRESSED:
            if ret.arg < len(host_args):
                host_args[ret.arg] = _Owned(host_args[ret.arg])
            else:
                name = next(n for n, i in traits.positions.items() if i == ret.arg)
                host_kwargs[name] = _Owned(host_kwargs[name])
    results = run_sync(device.index, _kernel, op, tuple(host_args), host_kwargs,
                       kinds, parts, validate, tensors=extents, writes=written, name=op.name(),
                       host_sync=traits.host_waits)
    if results is None:
        return None
    final = []
    for ret, r in zip(traits.returns, results):
        if ret.kind is Kind.INPLACE:
            target = traits.value(args, kwargs, ret.arg)
            if r is not None:  # its parts were replaced: the new ones are host memory, copied in
                if target.layout in _COMPRESSED:  # copy_ of a compressed layout needs the same nnz
                    target.resize_as_sparse_(r)
                target.copy_(r)
            final.append(target)
        elif ret.kind is Kind.FRESH or not isinstance(r, torch.Tensor):
            final.append(r.to(device) if isinstance(r, torch.Tensor) else r)
        elif rebuild is None:
            raise NotImplementedError(f"{op.name()} returns a view of its input, which the host path cannot map "
                                      "back to device memory")
        else:
            final.append(rebuild(r, lambda part: _on_device(part, extents, device)))
    return final[0] if len(final) == 1 else tuple(final)


def _on_device(part: torch.Tensor, device_parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """A dense part of a host result on the device: a view of the device memory it aliases (its metadata is all
    that is read), or a copy of memory the kernel allocated."""
    storage = part.untyped_storage().data_ptr()
    for base in device_parts:
        if host_view(base).untyped_storage().data_ptr() == storage:  # host views of a storage share one
            return torch.empty(0, dtype=part.dtype, device=device).set_(
                base.untyped_storage(), part.storage_offset(), part.size(), part.stride())
    return part.to(device)


_COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)


class _Owned:
    """A compressed sparse in-place or ``out=`` argument's host form, which the kernel gets as a host-owned copy:
    a CPU kernel that changes the number of specified elements (``add_``, ``add(out=)``) resizes its parts,
    which host views of device memory cannot be; the result is copied back after (``resize_as_sparse_`` and
    ``copy_``)."""

    __slots__ = ("host",)

    def __init__(self, host: torch.Tensor) -> None:
        self.host = host


def _kernel(op, args, kwargs, kinds: list[Kind], parts, validate) -> list | None:
    """The launched kernel: the CPU operator; then its fresh results made host-owned wherever they still point
    into device memory (views of an input stay views, mapped back to device memory after); ``None`` for an
    in-place result written through the host views alone."""
    # the host forms over device memory (an _Owned one's too), then the call's arguments: its copies in their place
    given = device_tensors(tuple(a.host if type(a) is _Owned else a for a in args),
                           {k: v.host if type(v) is _Owned else v for k, v in kwargs.items()})
    if validate is not None:
        for t in given:
            validate(t)
    device_memory = {p.untyped_storage().data_ptr() for t in given for p in parts(t)}
    args = tuple(a.host.clone() if type(a) is _Owned else a for a in args)
    kwargs = {k: v.host.clone() if type(v) is _Owned else v for k, v in kwargs.items()}
    # Grad mode as the CPU kernel would see it below autograd (the kernel scope excludes the autograd keys, so
    # nothing records history): some layout kernels keep what their backward needs only when it is on and an
    # input requires grad (``_sparse_mm_reduce_impl``'s argmax indices), and the host forms mirror requires_grad.
    with torch.enable_grad():
        result = op(*args, **kwargs)
    if not kinds:
        return None
    owned = []
    for r, kind in zip([result] if len(kinds) == 1 else list(result), kinds):
        if not isinstance(r, torch.Tensor) or kind is Kind.VIEW:
            owned.append(r)
            continue
        aliased = [p.untyped_storage().data_ptr() in device_memory for p in parts(r)]
        if kind is Kind.INPLACE and all(aliased):
            owned.append(None)
        else:
            owned.append(r.clone() if any(aliased) else r)
    return owned
# LITERALINCLUDE END: HOST PATH
