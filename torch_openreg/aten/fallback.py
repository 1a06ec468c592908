"""The global fallback: an ATen operator without an openreg kernel runs its CPU kernel on device memory.

A call goes through three steps, top to bottom in this module:

1. **decide** (:func:`decide`): the operator's traits (read once from its schema: ``traits.py``), the
   call's one device and its call shape (``arguments.py``), the outputs' metadata (the operator run on
   ``meta`` tensors), and its route: queued on the current stream, or run now because the CPU kernel
   decides its outputs (data-dependent shapes, non-tensor results, no meta kernel);
2. **launch** (:func:`launch_copy`): outputs allocated on the device, and a kernel launched on the
   current stream that runs the CPU kernel over host views of the device buffers and copies its
   results into the outputs. The first call of each call shape runs at the call, on this thread
   (``Stream.run_here``): a check in the CPU kernel's host code raises there, and its warnings reach
   the caller;
3. **hand back** the outputs: fresh tensors, views sharing their base's storage, and the in-place and
   ``out=`` arguments themselves.

That is the whole mechanism. Accelerations (``torch_openreg/aten/fast/``, on unless
``OPENREG_FALLBACK_FAST=0``) replace the methods of :class:`Choices`, the four places where they take
over; they never change what a call computes.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

import openreg
from openreg import bounded
from torch_openreg import _C, sync_debug
from torch_openreg.timing import costs as timing_costs

from . import cpu_rules
from .arguments import call_key, device_of, map_tensors, tensors_of, wrap_numbers
from .call import Call, Route
from .launch import detach_frames, host_view, launch, run_sync
from .outputs import CpuDisagrees, as_return, copy_into, device_view, fit_to, output_pairs
from .sparse import members
from .traits import CPU_SCALARS, Kind, OpTraits, traits_of


# LITERALINCLUDE START: FALLBACK
def fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """Run ``op`` for openreg tensors: decide, launch, hand back."""
    if openreg.timing.pricing:  # the timing model prices the launch this call makes (torch_openreg/timing)
        timing_costs.price_op(op, args, kwargs)
    result = _choices.run_known(op, args, kwargs)  # an acceleration's shortcut for a call shape it knows
    if result is not UNKNOWN:
        return result
    traits = traits_of(op)
    if traits.blocked:
        raise NotImplementedError(f"{traits.name} is not supported on the openreg device: {traits.blocked}")
    try:
        call = decide(op, traits, args, kwargs)
        if call.route is not Route.NOW:
            # A graph capture records the first call like any launch: nothing runs on the host during a
            # capture (openreg.graph).
            check = call.route is Route.CHECK and not openreg.is_capturing(openreg.current_stream(call.device.index))
            try:
                with _Warnings(check) as warned:
                    result = _choices.launch(call, check)
            except CpuDisagrees:
                _remember(call, Route.NOW)  # the CPU kernel decides this call shape's outputs from now on
            else:
                if check and not warned:  # a call shape that warned stays checked: each call warns, as on the CPU
                    _remember(call, Route.QUEUE)
                    _choices.clean(call)
                elif call.route is Route.QUEUE:  # checked before, its plan since dropped (a bounded table emptied)
                    _choices.clean(call)
                return result
        return run_now(call)
    except BaseException as exc:
        # The frames below this one hold the call's outputs (device memory a caller that keeps the
        # exception would keep) and host views (which fault a debugger formatting them): dropped, kept as text.
        detach_frames(exc, "fallback")
        raise
# LITERALINCLUDE END: FALLBACK


# LITERALINCLUDE START: DECIDE
def decide(op: torch._ops.OpOverload, traits: OpTraits, args: tuple, kwargs: dict) -> Call:
    given = args, kwargs
    args, kwargs = wrap_numbers(traits, args, kwargs)
    tensors = tensors_of(args, kwargs)
    device = device_of(traits, tensors, kwargs)
    if traits.name in CPU_SCALARS:  # as CUDA's foreach kernels: their packed scalars on the CPU only
        scalars = traits.value(args, kwargs, traits.positions["scalars"])
        if isinstance(scalars, torch.Tensor) and not scalars.is_cpu:
            raise RuntimeError(f"Expected scalars to be on CPU, got {scalars.device} instead.")
    key = call_key(*given, traits.numbers, traits.placed)
    call = Call(op, traits, args, kwargs, given, tensors, device, key, Route.CHECK)
    if not traits.returns_tensors or traits.cpu_decides or (traits.host_checks and traits.host_checks(call)):
        call.route = Route.NOW
    elif key is not None:
        call.route = _routes.get((op, key), Route.CHECK)
    if call.route is not Route.NOW:
        call.meta = _choices.meta_outputs(call)
        # No meta kernel, data-dependent output shapes, a check that needs the data; or an out= argument the call
        # resizes, whose strides the CPU's TensorIterator takes from the inputs where the meta kernels (torch._refs)
        # make it contiguous: the CPU kernel decides.
        if call.meta is NO_META or (traits.out_args and _resizes_out(call)):
            call.route = Route.NOW
            _remember(call, Route.NOW)  # per call shape: x[mask] runs now, x[i] stays queued
    return call


def _resizes_out(call: Call) -> bool:
    metas = [call.meta] if len(call.traits.returns) == 1 else list(call.meta or ())
    return any(isinstance(m, torch.Tensor) and real.size() != m.size() and m.numel() > 1
               for ret, meta in zip(call.traits.returns, metas) if ret.kind is Kind.INPLACE
               for real, m in output_pairs(call.value(ret.arg), meta))


_routes: dict[tuple, Route] = {}  # (op, call shape) -> its route, once decided
_ROUTES_SIZE = 8192


def _remember(call: Call, route: Route) -> None:
    if call.key is not None:
        bounded.put(_routes, (call.op, call.key), route, _ROUTES_SIZE)


def meta_run(call: Call) -> Any:
    """The outputs' metadata: the operator run on ``meta`` tensors, corrected where the CPU kernel shapes
    its outputs by another rule. NO_META when the meta run fails (no meta kernel, a data-dependent shape,
    mismatched shapes): the call then runs now, and the CPU kernel raises its own error at the call.
    Profilers do not see it: it is the fallback's inference, not an operator the program called."""
    with _C._Unrecorded():
        meta_args, meta_kwargs = call.meta_args()
        try:
            # dropped: the CPU kernel gives the caller the operator's warnings (C++ ones from the meta kernels, and
            # Python ones from torch._refs: its out= resize warning)
            with _C._WarningRecorder(), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                meta = call.op(*meta_args, **meta_kwargs)
        except Exception:
            return NO_META
        if any(isinstance(t, torch.Tensor) and t.layout != torch.strided
               for m in (meta if isinstance(meta, tuple) else (meta,)) for t in tensors_of((m,), {})):
            return NO_META  # a sparse output (_embedding_bag_backward's sparse gradient): the CPU kernel makes it
        return cpu_rules.correct(call, meta)


NO_META = object()
UNKNOWN = object()  # what Choices.run_known gives for a call it has no shortcut for
# LITERALINCLUDE END: DECIDE


# LITERALINCLUDE START: LAUNCH COPY
def _unshared_outs(call: Call) -> list[str]:
    """The call's ``out=`` arguments that share no storage with an input (those that do are written in place).
    A storage of no bytes shares nothing: an empty ``out=`` beside an empty input (both at address 0) is resized."""
    outs = [name for name in call.traits.out_args if call.kwargs.get(name) is not None]
    if not outs:
        return outs
    read = {t.untyped_storage().data_ptr()
            for t in tensors_of(call.args, {k: v for k, v in call.kwargs.items() if k not in outs})}
    read.discard(0)
    return [name for name in outs
            if not any(t.untyped_storage().data_ptr() in read for t in tensors_of((call.kwargs[name],), {}))]


class CopyKernel:
    """The queued kernel: the CPU operator over host views, its results copied into the outputs' host views.

    ``targets`` pairs each fresh output's host view with its return's index. An ``out=`` argument's
    host view becomes a target too, and the CPU kernel gets a host tensor in its place, which it
    sizes as it likes (some use ``out`` as scratch space and resize it: a host view cannot grow);
    unless it shares memory with an input (``x.mul_(2)`` arrives as ``mul.out(x, 2, out=x)``): then
    the kernel writes it in place, as the CPU's does, overlaps and all.
    A class, not a closure: a closure is a function and one cell per captured name, all of which the
    cyclic garbage collector walks while the launch is queued (docs/performance.md, "Few objects per
    queued launch").
    """

    __slots__ = ("op", "args", "kwargs", "targets", "nreturns")

    def __init__(self, call: Call, args: tuple, kwargs: dict, targets: list) -> None:
        for name in _unshared_outs(call):
            targets.append((name, kwargs[name]))
            kwargs[name] = map_tensors(kwargs[name], lambda t: torch.empty(0, dtype=t.dtype))
        self.op, self.args, self.kwargs, self.targets = call.op, args, kwargs, targets
        self.nreturns = len(call.traits.returns)

    def __call__(self) -> None:
        result = self.op(*self.args, **self.kwargs)
        results = [] if not self.nreturns else [result] if self.nreturns == 1 else list(result)
        copy_into(str(self.op), [(view, results[at] if type(at) is int else self.kwargs[at])
                                 for at, view in self.targets])


def launch_copy(call: Call, check: bool, kernel_type: type[CopyKernel] = CopyKernel) -> Any:
    """Allocate the outputs and launch a kernel (``kernel_type``) that runs
    the CPU kernel over host views and writes its results into them."""
    outs = call.outputs()
    if call.traits.pure_view:
        return as_return(outs)  # a pure view: metadata only, nothing to compute
    cpu_args, cpu_kwargs = call.host_args()
    fresh = [(i, o) for i, (r, o) in enumerate(zip(call.traits.returns, outs)) if r.kind is Kind.FRESH]
    call.fresh = written = [t for _, o in fresh for t in (o if isinstance(o, (list, tuple)) else [o]) if t is not None]
    kernel = kernel_type(call, cpu_args, cpu_kwargs, [(i, map_tensors(o, host_view)) for i, o in fresh])
    cpu_args = cpu_kwargs = None  # this frame may be in a traceback: the kernel holds the host views
    launch(call.device.index, kernel, tensors=[*call.tensors, *written], name=call.traits.name, sync=check,
           writes=call.writes)
    return as_return(outs)


# LITERALINCLUDE END: LAUNCH COPY


class _Warnings:
    """Around a checked call: counts the warnings its kernel raised on this thread, passing them on to the
    caller's handler (unless the call is to run again now, which warns for itself)."""

    def __init__(self, active: bool) -> None:
        self.recorder = _C._WarningRecorder() if active else None

    def __enter__(self) -> _Warnings:
        if self.recorder is not None:
            self.recorder.__enter__()
        return self

    def __exit__(self, kind, value, tb) -> None:
        if self.recorder is not None:
            self.recorder.__exit__(kind, value, tb)
            if kind is None or not issubclass(kind, CpuDisagrees):
                self.recorder.flush()

    def __bool__(self) -> bool:
        return self.recorder is not None and self.recorder.count > 0


# LITERALINCLUDE START: RUN NOW
def run_now(call: Call) -> Any:
    """Wait for the stream, run the CPU kernel now (in a launch: the pages are open), bring new outputs over."""
    # reported only where CUDA would wait too (not for what the simulator needs)
    return sync_debug.run_reported(call.traits.name if call.traits.host_waits else None, _run_now, call)


def _run_now(call: Call) -> Any:
    cpu_args, cpu_kwargs = call.now_args()
    # out=: the CPU kernel writes a host tensor of the argument's size and strides (it keeps them, resizes it, or
    # warns, as it would the argument itself: arange keeps a 2x2 view of the right element count), copied over
    # after; unless it shares memory with an input (``x.mul_(2)`` arrives as ``mul.out(x, 2, out=x)``): then the
    # kernel writes its host view in place, as the CPU's does, overlaps and all (see CopyKernel).
    outs = {}
    for name in _unshared_outs(call):
        if cpu_kwargs.get(name) is not None:
            outs[name] = cpu_kwargs[name] = map_tensors(
                call.kwargs[name], lambda t: torch.empty_strided(t.size(), t.stride(), dtype=t.dtype))
    fresh = [ret.kind is Kind.FRESH for ret in call.traits.returns]
    call.fresh = ()  # its fresh outputs come from the CPU kernel: none allocated before (not a checked launch's)
    try:
        result = run_sync(call.device.index, _owned_results, call.op, cpu_args, cpu_kwargs, fresh,
                          tensors=call.tensors, name=call.traits.name,
                          writes=call.writes, host_sync=call.traits.host_waits)
    except BaseException:
        cpu_args = cpu_kwargs = None  # this frame stays in the traceback: it must not show the host views
        raise
    for name, host in outs.items():
        for real, r in output_pairs(call.kwargs[name], host):
            if real.size() != r.size():  # as resize_output: an out= of the right shape keeps its strides
                fit_to(real, r)
            real.copy_(r)
    results = [] if not call.traits.returns else [result] if len(call.traits.returns) == 1 else list(result)
    final = []
    for ret, r in zip(call.traits.returns, results):
        if ret.kind is Kind.FRESH:
            final.append(map_tensors(r, lambda t: t.to(call.device)))
        elif ret.kind is Kind.VIEW:
            base = call.value(ret.arg)
            final.append(map_tensors(r, lambda t, base=base: host_alias_to_device(t, base, call.device)))
        else:
            final.append(call.value(ret.arg))
    return as_return(final)


def _owned_results(op: torch._ops.OpOverload, args: tuple, kwargs: dict, fresh: list[bool]) -> Any:
    """The CPU kernel, run now; then each fresh result that still points into device memory copied out, here,
    inside the launch, where the host views may be read. A CPU kernel may return an input as it is, or build
    a result on it (``_embedding_bag_backward``'s sparse gradient keeps its indices): read after the launch,
    such a result would be a host access to device memory."""
    result = op(*args, **kwargs)
    if not any(fresh):
        return result
    inside = {t.untyped_storage().data_ptr() for t in tensors_of(args, kwargs) if t.layout == torch.strided}
    results = [result] if len(fresh) == 1 else list(result)
    owned = [map_tensors(r, lambda t: t.clone() if _aliases(t, inside) else t) if is_fresh else r
             for r, is_fresh in zip(results, fresh)]
    return owned[0] if len(fresh) == 1 else tuple(owned)


def _aliases(t: torch.Tensor, storages: set[int]) -> bool:
    """Whether ``t``'s data (a sparse tensor's components) lies in one of ``storages``."""
    if t.layout == torch.strided:
        return not t._is_zerotensor() and t.untyped_storage().data_ptr() in storages
    return any(_aliases(m, storages) for m in members(t))


def host_alias_to_device(t: torch.Tensor, base: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU view the kernel returned of a host view, re-expressed as a view of the openreg ``base`` (with the
    CPU view's own lazy conjugate/negative bits: the kernel may have returned ``x.conj()[1:]``)."""
    offset = (t.data_ptr() - _C._storage_base(base)) // t.element_size()
    return device_view(base, t, offset, device, t.is_conj(), t.is_neg())
# LITERALINCLUDE END: RUN NOW


# LITERALINCLUDE START: CHOICES
class Choices:
    """The mechanism's own choices at the four places where an acceleration may take over (fast/)."""

    def run_known(self, op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
        """A call of a shape seen before, done another way; UNKNOWN: the mechanism does it."""
        return UNKNOWN

    def meta_outputs(self, call: Call) -> Any:
        """The outputs' metadata, or NO_META."""
        return meta_run(call)

    def launch(self, call: Call, check: bool) -> Any:
        """Allocate the outputs and launch the kernel (at the call when ``check``); the outputs."""
        return launch_copy(call, check)

    def clean(self, call: Call) -> None:
        """The call shape's first, checked, run raised nothing and warned nothing."""


_choices: Choices = Choices()


def set_choices(choices: Choices) -> None:
    """Make ``choices`` take the mechanism's choices (``torch_openreg.aten.fast.install``)."""
    global _choices
    _choices = choices
# LITERALINCLUDE END: CHOICES
