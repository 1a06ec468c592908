"""A functional CPU kernel computing in device memory: saves the copy of its results into the outputs.

Many CPU operators have no real ``out=`` kernel (convolution, layer norm: PyTorch's generated ``out=``
overload runs the functional kernel and copies its result). The mechanism copies the functional
kernel's results into the outputs; this kernel instead has the outputs' own device buffers serve the
CPU kernel's allocations of their sizes (``csrc/cpu_outputs.cpp``), so a result lands where it
belongs and nothing is copied. Matching by size is a guess: every result is checked, and one that is
not exactly in place is copied as before.
"""

from __future__ import annotations

import torch

from openreg import bounded
from torch_openreg import _C

from ..call import Call
from ..outputs import check_output

_SKIPS_SIZE = 8192


# LITERALINCLUDE START: INSTALL ALLOCATOR
def install_allocator() -> None:
    """Put the bridge's CPU allocator in front of PyTorch's (``c10::SetCPUAllocator``), for the whole process.

    A CPU kernel allocates its outputs through PyTorch's CPU allocator, which has no per-thread or
    per-call form: serving them from device memory takes an allocator in front of it. It passes every
    allocation through to PyTorch's, except on a thread whose kernel named its outputs
    (:class:`ServedKernel`, for the duration of its call). Called where a served kernel is first
    built (the general path), so neither ``import torch`` nor ``OPENREG_FALLBACK_FAST=0`` installs it.
    """
    global _installed
    if not _installed:
        _C._install_cpu_output_allocator()
        _installed = True


_installed = False
# LITERALINCLUDE END: INSTALL ALLOCATOR


# LITERALINCLUDE START: SERVED KERNEL
class ServedKernel:
    """A queued functional kernel whose outputs' allocations are served from the outputs' device memory
    (a class, not a closure: see ``fallback.CopyKernel``)."""

    __slots__ = ("op", "cpu_args", "cpu_kwargs", "targets", "nreturns", "shape")

    def __init__(self, op, cpu_args, cpu_kwargs, targets: list, nreturns: int, shape: tuple) -> None:
        self.op, self.cpu_args, self.cpu_kwargs = op, cpu_args, cpu_kwargs
        self.targets, self.nreturns, self.shape = targets, nreturns, shape  # shape: the call's, for _SKIPS

    def __call__(self) -> None:
        # The CPU kernel's allocations of the outputs' sizes come from the outputs' device memory
        # (csrc/cpu_outputs.cpp): a result that lands there in the output's layout is computed in place.
        serve = self.op not in _KEEPS_BUFFERS
        outputs = [(i, view) for i, view in self.targets if isinstance(view, torch.Tensor)] if serve else []
        views = [view for _, view in outputs]
        _C._set_cpu_output_targets(views, [_SKIPS.get((self.shape, i), 0) for i, _ in outputs])
        try:
            result = self.op(*self.cpu_args, **self.cpu_kwargs)
        finally:
            seen = _C._set_cpu_output_targets([], [])
        if self.nreturns:  # some return nothing (e.g. _amp_foreach_non_finite_check_and_unscale_)
            results = [result] if self.nreturns == 1 else list(result)
            self._learn(outputs, results, seen)
            self._copy_results(results, {v.data_ptr() for v in views})
            del results
        del result
        if serve and _C._cpu_outputs_held():
            _KEEPS_BUFFERS.add(self.op)
            raise RuntimeError(
                f"the CPU kernel of {self.op} kept memory it allocated during its call; its outputs are no "
                "longer computed in device memory (report this: that memory belongs to openreg tensors)"
            )

    def _learn(self, outputs: list, results: list, seen: list) -> None:
        """Note which allocation of its size each result was: a temporary of the same size allocated
        first (a convolution copies an input of the output's size) takes the buffer, and next time that
        many allocations of the size are let through before one is served."""
        sizes = [view.numel() * view.element_size() for _, view in outputs]
        for ((i, _), allocations, size) in zip(outputs, seen, sizes):
            result = results[i]
            if isinstance(result, torch.Tensor) and allocations and sizes.count(size) == 1:
                ptr = _storage_ptr(result)
                if ptr in allocations:
                    bounded.put(_SKIPS, (self.shape, i), allocations.index(ptr), _SKIPS_SIZE)

    def _copy_results(self, results: list, served: set[int]) -> None:
        copies = []
        for i, view in self.targets:
            if view is None:
                continue
            pairs = [(view, results[i])] if isinstance(view, torch.Tensor) else zip(view, results[i])
            for v, r in pairs:
                check_output(str(self.op), v, r)
                if not in_place(r, v):
                    # Moved out of memory served for another output (or held in another layout) before any copy.
                    copies.append((v, r.clone() if _storage_ptr(r) in served else r))
        for v, r in copies:
            v.copy_(r)
# LITERALINCLUDE END: SERVED KERNEL


def served_kernel(call: Call, cpu_args: tuple, cpu_kwargs: dict, targets: list) -> ServedKernel:
    """The kernel ``fallback.launch_copy`` launches for a call when the accelerations are on."""
    install_allocator()
    return ServedKernel(call.op, cpu_args, cpu_kwargs, targets, len(call.traits.returns), call_shape(call.op,
                                                                                                  call.tensors))


def call_shape(op, tensors: list) -> tuple:
    """What a functional kernel's order of allocations may depend on (see ``ServedKernel._learn``)."""
    return (op, *((t.shape, t.dtype) for t in tensors))


def _storage_ptr(t: torch.Tensor) -> int | None:
    """Where a result's storage starts; None for a tensor without one (a ``ZeroTensor``)."""
    return None if t._is_zerotensor() else t.untyped_storage().data_ptr()


def in_place(result: torch.Tensor, view: torch.Tensor) -> bool:
    """Whether a CPU kernel's result already is the output (same memory, layout, type and lazy bits:
    ``dot`` of two conjugates returns the conjugate of what it computed)."""
    return (result.data_ptr() == view.data_ptr() and result.dtype == view.dtype and result.shape == view.shape
            and result.stride() == view.stride() and result.is_conj() == view.is_conj()
            and result.is_neg() == view.is_neg())


_KEEPS_BUFFERS: set = set()  # operators whose CPU kernel held on to memory served to it (see ServedKernel)
# (call shape, output) -> allocations of the output's size its CPU kernel makes before the output
_SKIPS: dict[tuple, int] = {}
