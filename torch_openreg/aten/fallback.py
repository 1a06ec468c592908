"""The global fallback: an ATen operator without an openreg kernel runs its CPU kernel on device memory.

A call goes through three steps, top to bottom in this module:

1. **decide** (:func:`decide`): the operator's traits (read once from its schema), the call's one
   device, its call shape (:func:`call_key`), the outputs' metadata (the operator run on ``meta``
   tensors), and its route: queued on the current stream, or run now because the CPU kernel decides
   its outputs (data-dependent shapes, non-tensor results, no meta kernel);
2. **launch** (:func:`launch_copy`): outputs allocated on the device, and a kernel launched on the
   current stream that runs the CPU kernel over host views of the device buffers and copies its
   results into the outputs. The first call of each call shape runs at the call, on this thread
   (``Stream.run_here``): a check in the CPU kernel's host code raises there, and its warnings reach
   the caller;
3. **hand back** the outputs: fresh tensors, views sharing their base's storage, and the in-place and
   ``out=`` arguments themselves.

That is the whole mechanism. Accelerations (``torch_openreg/aten/fast/``, on unless
``OPENREG_FALLBACK_FAST=0``) replace the methods of :class:`Plain`, the four places where they take
over; they never change what a call computes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

import openreg
from torch_openreg import _C

from . import cpu_rules
from .launch import detach_frames, host_view, launch, run_sync
from .traits import CPU_INDICES_OK, Kind, OpTraits, traits_of


# LITERALINCLUDE START: FALLBACK
def fallback(op: torch._ops.OpOverload, *args: Any, **kwargs: Any) -> Any:
    """Run ``op`` for openreg tensors: decide, launch, hand back."""
    result = _path.run_known(op, args, kwargs)  # an acceleration's shortcut for a call shape it knows
    if result is not UNKNOWN:
        return result
    traits = traits_of(op)
    if traits.blocked:
        raise NotImplementedError(f"{traits.name} is not supported on the openreg device: {traits.blocked}")
    try:
        call = decide(op, traits, args, kwargs)
        if call.route is not Route.NOW:
            check = call.route is Route.CHECK
            try:
                with _Warnings(check) as warned:
                    result = _path.launch(call, check)
            except CpuDisagrees:
                _remember(call, Route.NOW)  # the CPU kernel decides this call shape's outputs from now on
            else:
                if check and not warned:  # a call shape that warned stays checked: each call warns, as on the CPU
                    _remember(call, Route.QUEUE)
                    _path.clean(call)
                return result
        return run_now(call)
    except BaseException as exc:
        # The frames below this one hold the call's outputs (device memory a caller that keeps the
        # exception would keep) and host views (which fault a debugger formatting them): dropped, kept as text.
        detach_frames(exc, "fallback")
        raise
# LITERALINCLUDE END: FALLBACK


# LITERALINCLUDE START: DECIDE
class Route(enum.Enum):
    """How calls of one call shape run."""

    CHECK = "check"  # not seen yet: queued, but run at the call (Stream.run_here), its warnings counted
    QUEUE = "queue"  # its first call was clean: queued on the stream
    NOW = "now"  # the CPU kernel decides its outputs: wait for the stream, run it, copy new outputs over


@dataclass(slots=True)
class Call:
    """One operator call, as decided. It never holds host views: it may be in an error's traceback."""

    op: torch._ops.OpOverload
    traits: OpTraits
    args: tuple  # as the CPU kernel takes them (Python numbers in ``Tensor`` positions wrapped)
    kwargs: dict
    given: tuple  # (args, kwargs) as called
    tensors: list[torch.Tensor]
    device: torch.device
    key: tuple | None  # the call shape (None: not hashable, every call is checked)
    route: Route
    meta: Any = None  # the outputs' metadata (meta tensors), for a queued route
    plan: Any = None  # what an acceleration learned from this call (see fast/)


def decide(op: torch._ops.OpOverload, traits: OpTraits, args: tuple, kwargs: dict) -> Call:
    given = args, kwargs
    args, kwargs = wrap_numbers(traits, args, kwargs)
    tensors = tensors_of(args, kwargs)
    device = device_of(traits, tensors, kwargs)
    key = call_key(*given, traits.numbers_by_type)
    if not traits.returns_tensors or traits.cpu_decides:
        route = Route.NOW
    else:
        route = _routes.get((op, key), Route.CHECK) if key is not None else Route.CHECK
    call = Call(op, traits, args, kwargs, given, tensors, device, key, route)
    if route is not Route.NOW:
        call.meta = _path.meta_outputs(call)
        if call.meta is NO_META:  # no meta kernel, data-dependent output shapes, a check that needs the data
            call.route = Route.NOW
            _remember(call, Route.NOW)  # per call shape: x[mask] runs now, x[i] stays queued
    return call


def call_key(args: tuple, kwargs: dict, numbers_by_type: bool = False) -> tuple | None:
    """The call shape: everything output metadata and the CPU kernel's checks depend on, one flat tuple.

    An openreg tensor is ``(device index, dtype, conj | neg << 1, storage offset, storage bytes,
    *sizes, *strides)``; a CPU tensor ``(-1, dtype, *sizes, *strides)``; a number ``(type, value)``
    (2, 2.0 and True are equal but promote differently; by type alone for ``numbers_by_type``); a list
    the tuple of its items' keys; a keyword argument ``(name, key)``; anything else itself. None when
    the call cannot be keyed: an argument cannot be hashed, or a CPU boolean mask (the meta run reads
    it: its count of True values is the output's length). ``csrc/call_args.cpp`` computes the same key.
    """
    try:
        key = (*(_key(a, numbers_by_type) for a in args), *((k, _key(v, numbers_by_type)) for k, v in kwargs.items()))
        hash(key)
    except TypeError:
        return None
    return key


def _key(value: Any, by_type: bool) -> Any:
    if isinstance(value, torch.Tensor):
        index = value.get_device()
        if index >= 0:
            return (index, value.dtype, value.is_conj() | value.is_neg() << 1, value.storage_offset(),
                    value.untyped_storage().nbytes(), *value.shape, *value.stride())
        if value.dim() and value.dtype in (torch.bool, torch.uint8):
            raise TypeError("a CPU mask: its values shape the outputs")
        return (-1, value.dtype, *value.shape, *value.stride())
    if isinstance(value, (list, tuple)):
        return tuple(_key(v, by_type) for v in value)
    if isinstance(value, _NUMBERS):
        return type(value) if by_type else (type(value), value)
    return None if isinstance(value, torch.Generator) else value


_NUMBERS = (bool, int, float, complex)
_routes: dict[tuple, Route] = {}  # (op, call shape) -> its route, once decided
_ROUTES_SIZE = 8192


def _remember(call: Call, route: Route) -> None:
    if call.key is not None:
        if len(_routes) >= _ROUTES_SIZE:
            _routes.clear()
        _routes[(call.op, call.key)] = route


def meta_run(call: Call) -> Any:
    """The outputs' metadata: the operator run on ``meta`` tensors (this also raises shape and dtype
    errors at the call), corrected where the CPU kernel shapes its outputs by another rule; NO_META
    when the meta run fails."""
    meta_args, meta_kwargs = _swap(call, _to_meta, "meta")
    try:
        with _C._WarningRecorder():  # dropped: the CPU kernel gives the caller the operator's warnings
            meta = call.op(*meta_args, **meta_kwargs)
    except Exception:
        return NO_META
    return cpu_rules.correct(call.traits, call.args, call.kwargs, meta)


NO_META = object()
UNKNOWN = object()  # what Plain.run_known gives for a call it has no shortcut for
# LITERALINCLUDE END: DECIDE


# LITERALINCLUDE START: DEVICE CHECK
def device_of(traits: OpTraits, tensors: list[torch.Tensor], kwargs: dict) -> torch.device:
    """The one openreg device of the call; mixed devices are the user's error, reported like CUDA's.

    ``get_device()`` is the cheap test (openreg is this process's only accelerator): it is -1 for
    CPU and meta tensors and the index for openreg ones.
    """
    index = -1
    for t in tensors:
        i = t.get_device()
        if i >= 0:
            if index < 0:
                index = i
            elif i != index:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"openreg:{index} and openreg:{i}! (in {traits.name})"
                )
        elif not (t.is_cpu and (t.dim() == 0 or traits.name in CPU_INDICES_OK)):
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{'openreg' if index < 0 else f'openreg:{index}'} and {t.device}! "
                f"(in {traits.name}; only 0-dim CPU tensors mix with openreg)"
            )
    if index >= 0:
        return _DEVICES[index]
    requested = kwargs.get("device")
    if requested is None:
        raise RuntimeError(f"{traits.name}: no openreg tensor or device in the call")
    device = torch.device(requested)
    return torch.device("openreg", torch.openreg.current_device()) if device.index is None else device


_DEVICES = [torch.device("openreg", i) for i in range(openreg.device_count())]
# LITERALINCLUDE END: DEVICE CHECK


def tensors_of(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Every tensor among the arguments, alone or in lists."""
    found = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def _map(value: Any, fn) -> Any:
    """Apply ``fn`` to every tensor in an argument (tensors and lists of tensors)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(fn(v) if isinstance(v, torch.Tensor) else v for v in value)
    return value


# LITERALINCLUDE START: WRAP NUMBERS
_WIDE = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


def wrap_numbers(traits: OpTraits, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Turn Python numbers passed for ``Tensor`` arguments back into 0-dim CPU tensors.

    ``t % 2`` reaches the fallback as ``remainder.Tensor_out(t, 2)``: PyTorch hands a boxed kernel
    a wrapped-number tensor as a plain number, and most operators refuse a number when called
    again. The tensor gets the dtype the number takes in the operation, so promotion is unchanged.
    """
    numbers = [i for i in traits.tensor_args if isinstance(traits.value(args, kwargs, i), _NUMBERS)]
    if not numbers:
        return args, kwargs
    ref = next(iter(tensors_of(args, kwargs)), None)
    args, kwargs = list(args), dict(kwargs)
    for i in numbers:
        value = traits.value(args, kwargs, i)
        # Kept at full width, as a wrapped number is: kernels read a CPU scalar operand in their
        # computation type (float for bfloat16), so rounding it to the tensor's dtype first would
        # change results (bfloat16 x * 0.7071). Cast only where a full-width 0-dim tensor would
        # promote differently from a number (an integer tensor times 2.5 is float32, not float64).
        wrapped = torch.tensor(value, dtype=_WIDE[type(value)])
        if ref is not None:
            want = torch.result_type(ref, value)
            if torch.result_type(ref, wrapped) != want:
                wrapped = wrapped.to(want)
        if i < len(args):
            args[i] = wrapped
        else:
            kwargs[traits.arguments[i].name] = wrapped
    return tuple(args), kwargs
# LITERALINCLUDE END: WRAP NUMBERS


# LITERALINCLUDE START: HOST ARGUMENTS
def host_args(call: Call) -> tuple[tuple, dict]:
    """The CPU kernel's arguments for a queued kernel: host views of the openreg tensors, CPU scalars and
    indices read now (as CUDA copies them at the call), the device generator's CPU state for generators."""
    return _swap(call, _host_view_or_snapshot, "cpu")


def _swap(call: Call, tensor_fn, target: str) -> tuple[tuple, dict]:
    """Arguments for a run on ``target`` ('meta' or 'cpu'): tensors mapped, device and generators replaced."""
    args = [_map(a, tensor_fn) for a in call.args]
    kwargs = {k: _map(v, tensor_fn) for k, v in call.kwargs.items()}
    if kwargs.get("device") is not None:
        kwargs["device"] = torch.device(target)
    for name in call.traits.generators:  # random ops draw from the device's generator, never the CPU's default one
        index = call.traits.positions[name]
        gen = None
        if target == "cpu":
            given = call.traits.value(args, kwargs, index)
            gen = _C._cpu_generator(given if given is not None else _C._default_generator(call.device.index))
        if index < len(args):
            args[index] = gen
        else:
            kwargs[name] = gen
    return tuple(args), kwargs


def _host_view_or_self(t: torch.Tensor) -> torch.Tensor:
    return host_view(t) if t.get_device() >= 0 else t


def _host_view_or_snapshot(t: torch.Tensor) -> torch.Tensor:
    return host_view(t) if t.get_device() >= 0 else t.clone()


def _to_meta(t: torch.Tensor) -> torch.Tensor:
    if t.get_device() < 0:
        # A 0-dim CPU tensor is a scalar operand: on meta it promotes the same way, and meta kernels
        # refuse to mix it with meta outputs (mul.out(cpu_scalar, x, out=y) would fail and run now).
        return torch.empty((), dtype=t.dtype, device="meta") if t.dim() == 0 else t
    numel = t.untyped_storage().nbytes() // t.element_size()
    return torch.empty(numel, dtype=t.dtype, device="meta").as_strided(t.size(), t.stride(), t.storage_offset())
# LITERALINCLUDE END: HOST ARGUMENTS


# LITERALINCLUDE START: OUTPUTS
def outputs(call: Call) -> list:
    """Allocate fresh outputs, build views, and resize in-place and out= arguments to what the meta run says."""
    metas = [call.meta] if len(call.traits.returns) == 1 else list(call.meta or ())
    outs = []
    for ret, m in zip(call.traits.returns, metas):
        if ret.kind is Kind.FRESH:
            outs.append(_map(m, lambda t: torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=call.device)))
        elif ret.kind is Kind.VIEW:
            base = call.traits.value(call.args, call.kwargs, ret.arg)
            outs.append(_map(m, lambda t, base=base: _view_of(base, t, call.device)))
        else:
            real = call.traits.value(call.args, call.kwargs, ret.arg)
            for r, mm in ((real, m),) if isinstance(real, torch.Tensor) else zip(real, m):
                match(r, mm)
            outs.append(real)
    return outs


def _view_of(base: torch.Tensor, m: torch.Tensor, device: torch.device) -> torch.Tensor:
    view = torch.empty(0, dtype=m.dtype, device=device).set_(base.untyped_storage(), m.storage_offset(), m.size(),
                                                            m.stride())
    if base.is_conj() and view.is_complex():  # a view of a lazily conjugated/negated tensor is one too
        view = view.conj()
    return torch._neg_view(view) if base.is_neg() else view


def match(real: torch.Tensor, m: torch.Tensor) -> bool:
    """Give an ``out=``/in-place argument the shape and strides the operator gives it (resizing storage);
    returns whether it already had them."""
    if real.size() != m.size() or (real.numel() > 1 and real.stride() != m.stride()):
        real.set_(real.untyped_storage(), real.storage_offset(), m.size(), m.stride())
        return False
    return True


def pack(results: list) -> Any:
    return None if not results else results[0] if len(results) == 1 else tuple(results)
# LITERALINCLUDE END: OUTPUTS


# LITERALINCLUDE START: LAUNCH COPY
class CopyKernel:
    """The queued kernel: the CPU operator over host views, its results copied into the outputs' host views.

    ``targets`` pairs each fresh output's host view with its return's index. An ``out=`` argument's
    host view becomes a target too, and the CPU kernel gets a host tensor in its place, which it
    sizes as it likes (some use ``out`` as scratch space and resize it: a host view cannot grow);
    unless it shares memory with an input (``x.mul_(2)`` arrives as ``mul.out(x, 2, out=x)``): then
    the kernel writes it in place, as the CPU's does, overlaps and all.
    A class, not a closure: a closure is a function and one cell per captured name, all of which the
    cyclic garbage collector walks while the launch is queued (with a thousand launches queued,
    collections doubled the cost of a launch).
    """

    __slots__ = ("op", "args", "kwargs", "targets", "nreturns")

    def __init__(self, call: Call, args: tuple, kwargs: dict, targets: list) -> None:
        outs = [name for name in call.traits.out_args if call.kwargs.get(name) is not None]
        read = {t.untyped_storage().data_ptr()
                for t in tensors_of(call.args, {k: v for k, v in call.kwargs.items() if k not in outs})}
        for name in outs:
            if not any(t.untyped_storage().data_ptr() in read for t in tensors_of((call.kwargs[name],), {})):
                targets.append((name, kwargs[name]))
                kwargs[name] = _map(kwargs[name], lambda t: torch.empty(0, dtype=t.dtype))
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
    outs = outputs(call)
    if not call.traits.mutates and all(r.kind is Kind.VIEW for r in call.traits.returns):
        return pack(outs)  # a pure view: metadata only, nothing to compute
    cpu_args, cpu_kwargs = host_args(call)
    fresh = [(i, o) for i, (r, o) in enumerate(zip(call.traits.returns, outs)) if r.kind is Kind.FRESH]
    written = [t for _, o in fresh for t in (o if isinstance(o, (list, tuple)) else [o]) if t is not None]
    kernel = kernel_type(call, cpu_args, cpu_kwargs, [(i, _map(o, host_view)) for i, o in fresh])
    cpu_args = cpu_kwargs = None  # this frame may be in a traceback: the kernel holds the host views
    launch(call.device.index, kernel, tensors=[*call.tensors, *written], name=call.traits.name, sync=check)
    return pack(outs)


def pairs(view: Any, result: Any) -> list[tuple[torch.Tensor, Any]]:
    """``(output, result)`` pairs of one return or argument (a tensor or a list of tensors); None skipped."""
    if isinstance(view, torch.Tensor):
        return [(view, result)]
    return [(v, r) for v, r in zip(view or (), result or ()) if v is not None]


def copy_into(name: str, targets: list) -> None:
    """Copy CPU results into outputs' host views, all checked first: nothing is written when one disagrees."""
    both = [p for view, result in targets for p in pairs(view, result)]
    for view, result in both:
        check_output(name, view, result)
    for view, result in both:
        view.copy_(result)


class CpuDisagrees(RuntimeError):
    """A CPU kernel's output differs in shape or dtype from what the meta kernel said (``nansum(x, dim=[])``
    reduces everything on the CPU, nothing on meta): raised before any output is written."""


def check_output(name: str, view: torch.Tensor, result: torch.Tensor) -> None:
    """Raise :class:`CpuDisagrees` unless ``result`` (the CPU's) fits ``view`` (the meta kernel's output)."""
    if result.shape != view.shape or result.dtype != view.dtype:
        raise CpuDisagrees(
            f"{name}: the CPU kernel gave an output of shape {tuple(result.shape)} and dtype {result.dtype} where "
            f"the meta kernel said {tuple(view.shape)} and {view.dtype}"
        )
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
    cpu_args, cpu_kwargs = _swap(call, _host_view_or_self, "cpu")
    outs = {}  # out=: the CPU kernel sizes a host tensor, copied into the argument after
    for name in call.traits.out_args:
        if cpu_kwargs.get(name) is not None:
            outs[name] = cpu_kwargs[name] = _map(call.kwargs[name], lambda t: torch.empty(0, dtype=t.dtype))
    try:
        result = run_sync(call.device.index, lambda: call.op(*cpu_args, **cpu_kwargs), tensors=call.tensors,
                          name=call.traits.name)
    except BaseException:
        cpu_args = cpu_kwargs = None  # this frame stays in the traceback: it must not show the host views
        raise
    for name, host in outs.items():
        for real, r in pairs(call.kwargs[name], host):
            if real.size() != r.size():  # as resize_output: an out= of the right shape keeps its strides
                match(real, r)
            real.copy_(r)
    results = [] if not call.traits.returns else [result] if len(call.traits.returns) == 1 else list(result)
    final = []
    for ret, r in zip(call.traits.returns, results):
        if ret.kind is Kind.FRESH:
            final.append(_map(r, lambda t: t.to(call.device)))
        elif ret.kind is Kind.VIEW:
            base = call.traits.value(call.args, call.kwargs, ret.arg)
            final.append(_map(r, lambda t, base=base: _host_alias_to_device(t, base, call.device)))
        else:
            final.append(call.traits.value(call.args, call.kwargs, ret.arg))
    return pack(final)


def _host_alias_to_device(t: torch.Tensor, base: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CPU view the kernel returned, re-expressed as a view of the openreg ``base``."""
    offset = (t.data_ptr() - _C._storage_base(base)) // t.element_size()
    return torch.empty(0, dtype=t.dtype, device=device).set_(base.untyped_storage(), offset, t.size(), t.stride())
# LITERALINCLUDE END: RUN NOW


# LITERALINCLUDE START: PLAIN
class Plain:
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


_path: Plain = Plain()


def accelerate(path: Plain) -> None:
    """Make ``path`` take the mechanism's choices (``torch_openreg.aten.fast.install``)."""
    global _path
    _path = path
# LITERALINCLUDE END: PLAIN
