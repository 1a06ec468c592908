"""Call plans: a call of a call shape that ran before runs what was worked out for it. Saves the general path.

Everything the fallback works out for a call (the outputs' metadata, the kernel, whether a loss needs
scratch space, the tensors Python numbers in ``Tensor`` positions become) depends only on its call
shape, and a training loop repeats the same calls every step. For an operator that writes through
an ``out=`` kernel, returns only fresh tensors, or writes in place, the first clean call of a shape leaves a plan
under its call shape. The next call with that shape is described in one call into the bridge
(``csrc/call_args.cpp``: the call shape, host views, CPU scalars read at the call, the extents a
launch names) and runs the plan: no meta run, no walk over the arguments in Python.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from openreg import bounded
from torch_openreg import _C

from ..arguments import global_state, tensors_of, wrapped_number
from ..call import Call, written_by
from ..fallback import UNKNOWN, launch_copy
from ..launch import detach_frames, launch_extents, written_extents
from ..outputs import as_return, fit_to, output_pairs
from ..traits import NUMBER_CLASS, NUMBER_TYPE, Kind, OpTraits, traits_of
from . import planned_launch
from .out_overloads import FunctionalOutKernel, OutKernel, copying_out_overload, out_overload, reduces
from .served_outputs import ServedKernel, call_shape, install_allocator, served_kernel

_NUMBERS = (bool, int, float, complex)
# Outputs of at most this many bytes in all: a functional operator whose CPU out= overload is the generated
# functional-then-copy one (dot, vdot, ...) runs it, into its outputs' host views, instead of having the
# functional kernel's allocations served from device memory (served_outputs: ~8 us more per launch).
SMALL_OUTPUTS = 4096


# LITERALINCLUDE START: PLANS
class Plan:
    """How calls of one call shape run; a kind of plan per way of writing the outputs (the subclasses)."""

    __slots__ = ("op", "traits", "index", "wrapped", "rewrap", "cacheable", "clean", "recipe")

    def __init__(self, call: Call, wrapped: tuple) -> None:
        self.op, self.traits, self.index = call.op, call.traits, call.device.index
        self.wrapped = wrapped  # (position, 0-dim tensor) of the numbers passed for Tensor arguments
        # The call shape has those numbers' classes, not their values: a call with another number wraps its own
        # (in the first call's dtype, which depends on the number's type alone); the first call's numbers, sign
        # of zero included (-0.0 == 0.0), keep their tensors: a loop's constant factor costs no wrap.
        self.rewrap = tuple(_exactly(call.given_value(i)) for i, _ in wrapped) \
            if call.traits.numbers == NUMBER_CLASS else None
        self.cacheable = True  # whether a later call with the same call shape may run this plan as it is
        self.clean = False  # its out= kernel has run and kept the outputs' shapes and strides (OutKernel)
        self.recipe = None  # once clean: how its calls launch in one bridge call (planned_launch.py), or False

    def run(self, host_args, host_kwargs: dict, extents: list, args: tuple, kwargs: dict, check: bool) -> Any:
        """Allocate the outputs, launch the kernel (at the call when ``check``), return the outputs."""
        if self.wrapped:
            host_args = self.with_numbers(host_args)
        outs, kernel = self.prepare(host_args, host_kwargs, extents, args, kwargs)
        launch_extents(self.index, kernel, extents=extents, name=self.traits.name, sync=check,
                       writes=written_extents(written_by, self.traits, args, kwargs, outs))
        return as_return(outs)

    def with_numbers(self, host_args: tuple) -> tuple:
        """The host arguments with the numbers passed for Tensor arguments wrapped (the plan's own tensors for
        the first call's numbers)."""
        host_args = list(host_args)
        for n, (i, number) in enumerate(self.wrapped):
            value = host_args[i]
            if self.rewrap is not None and not isinstance(value, torch.Tensor) and _exactly(value) != self.rewrap[n]:
                number = wrapped_number(value, number.dtype)
            host_args[i] = number
        return tuple(host_args)

    def recipe_of(self) -> Any:
        """How this plan's calls launch in one bridge call (``planned_launch.recipe``); False: not there."""
        return False


def _exactly(number: Any) -> tuple:
    """A number as a call wrapped it: its type, its value and its sign (``-0.0 == 0.0``); NaN never matches."""
    return (type(number), number, math.copysign(1.0, number.real) if isinstance(number, complex)
            else math.copysign(1.0, number))


class ThroughOutOverload(Plan):
    """A functional operator computed by its ``out=`` overload into fresh outputs."""

    __slots__ = ("metas", "out_op", "out_names", "scratch")

    def __init__(self, call: Call, wrapped: tuple, metas: list, out: tuple) -> None:
        super().__init__(call, wrapped)
        self.metas, (self.out_op, self.out_names) = metas, out
        self.scratch = reduces(call.traits, metas, call.tensors)

    def prepare(self, host_args, host_kwargs, extents, args, kwargs) -> tuple[list, FunctionalOutKernel]:
        outs = []
        for name, m in zip(self.out_names, self.metas):
            if isinstance(m, list):  # a list of outputs (a _foreach_ operator's)
                made = [_C._empty_like_meta(one, self.index) for one in m]
                outs.append([out for out, _, _ in made])
                host_kwargs[name] = [view for _, view, _ in made]
                extents.extend(where for _, _, where in made)
                continue
            out, host_kwargs[name], where = _C._empty_like_meta(m, self.index)
            outs.append(out)
            extents.append(where)
        return outs, FunctionalOutKernel(self.traits.name, self.op, self.out_op, host_args, host_kwargs,
                                         self.out_names, self.scratch, self)

    def recipe_of(self) -> Any:
        if any(isinstance(m, list) for m in self.metas):
            return False  # the bridge's launch allocates single outputs
        return planned_launch.recipe(self, self.out_op, list(zip(self.out_names, self.metas)))


class GivenOut(Plan):
    """An ``out=`` overload called directly (as structured in-place operators arrive): it returns its
    ``out=`` arguments."""

    __slots__ = ("scratch",)

    def __init__(self, call: Call, wrapped: tuple, metas: list, out: None) -> None:
        super().__init__(call, wrapped)
        traits = call.traits
        given = tensors_of(tuple(call.kwargs.get(n) for n in traits.out_args), {})
        self.scratch = reduces(traits, given, call.tensors)
        for ret, m in zip(traits.returns, metas):
            warn = any(traits.positions[n] == ret.arg for n in traits.out_args)
            for real, mm in output_pairs(call.value(ret.arg), m):
                # a resize depends on more than the call shape: not remembered
                self.cacheable &= fit_to(real, mm, warn)

    def prepare(self, host_args, host_kwargs, extents, args, kwargs) -> tuple[list, OutKernel]:
        outs = [self.traits.value(args, kwargs, ret.arg) for ret in self.traits.returns]
        return outs, OutKernel(self.traits.name, self.op, host_args, host_kwargs, self.traits.out_args, self.scratch,
                               self)

    def recipe_of(self) -> Any:
        return planned_launch.recipe(self, self.op, [])


class InPlace(Plan):
    """An operator that writes its arguments in place (``_foreach_add_``, ``_foreach_mul_``) and returns them or
    nothing: its CPU kernel, run on the host views, writes them."""

    __slots__ = ()

    def __init__(self, call: Call, wrapped: tuple, metas: list, out: None) -> None:
        super().__init__(call, wrapped)
        traits = call.traits
        for ret, m in zip(traits.returns, metas):
            for real, mm in output_pairs(call.value(ret.arg), m):
                self.cacheable &= fit_to(real, mm)  # a resize depends on more than the call shape: not remembered

    def prepare(self, host_args, host_kwargs, extents, args, kwargs) -> tuple[list, OutKernel]:
        outs = [self.traits.value(args, kwargs, ret.arg) for ret in self.traits.returns]
        return outs, OutKernel(self.traits.name, self.op, host_args, host_kwargs, (), False, self)

    def recipe_of(self) -> Any:
        return planned_launch.recipe(self, self.op, [])


class Served(Plan):
    """A functional operator's own kernel, its outputs' allocations served from device memory (an output
    the call leaves out, as ``convolution_backward``'s ``output_mask`` does, is None)."""

    __slots__ = ("metas", "shape")

    def __init__(self, call: Call, wrapped: tuple, metas: list, out: None) -> None:
        super().__init__(call, wrapped)
        self.metas, self.shape = metas, call_shape(call.op, call.tensors)
        install_allocator()

    def prepare(self, host_args, host_kwargs, extents, args, kwargs) -> tuple[list, ServedKernel]:
        outs, targets = [], []
        for i, m in enumerate(self.metas):
            if m is None:
                outs.append(None)
                continue
            out, view, where = _C._empty_like_meta(m, self.index)
            outs.append(out)
            targets.append((i, view))
            extents.append(where)
        return outs, ServedKernel(self.op, host_args, host_kwargs, targets, len(outs), self.shape)
# LITERALINCLUDE END: PLANS


class _OpPlans:
    """An operator's kind of plan and its plans by call shape."""

    __slots__ = ("traits", "numbers", "placed", "kind", "out", "plans", "copying_out")

    def __init__(self, traits: OpTraits, kind: type[Plan], out: tuple | None) -> None:
        self.traits, self.kind, self.out, self.plans = traits, kind, out, _bound.new()
        self.numbers, self.placed = traits.numbers, traits.placed
        self.copying_out = None  # a Served operator's functional-then-copy out= overload, for small outputs


def _plans_of(op: torch._ops.OpOverload) -> _OpPlans | None:
    """The operator's plans; None for an operator that never has any (it needs more than its arguments:
    a generator, a ``device``; or the CPU decides its outputs)."""
    entry = _ops.get(op, _MISSING)
    if entry is _MISSING:
        traits = traits_of(op)
        entry = None
        if not (traits.blocked or not traits.returns_tensors or traits.cpu_decides or traits.host_checks
                or traits.generators or "device" in traits.positions):
            out = out_overload(op, traits)
            if out is not None:
                entry = _OpPlans(traits, ThroughOutOverload, out)
            elif traits.out_args and all(r.kind is not Kind.FRESH for r in traits.returns):
                entry = _OpPlans(traits, GivenOut, None)
            elif traits.functional:
                entry = _OpPlans(traits, Served, None)
                entry.copying_out = copying_out_overload(op, traits)
            elif (copying := copying_out_overload(op, traits)) is not None:
                entry = _OpPlans(traits, ThroughOutOverload, copying)  # lists of fresh outputs (_foreach_sqrt)
            elif traits.mutates and not traits.out_args and all(r.kind is Kind.INPLACE for r in traits.returns):
                entry = _OpPlans(traits, InPlace, None)
        _ops[op] = entry
    return entry


_ops: dict[torch._ops.OpOverload, _OpPlans | None] = {}
_MISSING = object()
_bound = bounded.SharedBound(8192)  # every operator's plans together


# LITERALINCLUDE START: RUN KNOWN
def run_known(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Any:
    """A call whose call shape has a plan runs it; UNKNOWN otherwise. One bridge call describes the call."""
    entry = _ops.get(op, _MISSING)
    if entry is _MISSING:
        entry = _plans_of(op)
    if entry is None:
        return UNKNOWN
    described = _C._describe_call(args, kwargs, entry.numbers, entry.placed)
    if described is None:  # an argument only the general path takes (a CPU tensor that is not a 0-dim scalar)
        return UNKNOWN
    try:
        plan = entry.plans.get((global_state(), described[0]))  # arguments.call_key's form
    except TypeError:  # an unhashable argument
        return UNKNOWN
    if plan is None:
        return UNKNOWN
    return _run(plan, described, args, kwargs, False)


def _run(plan: Plan, described: list, args: tuple, kwargs: dict, check: bool) -> Any:
    """Run a plan over a call's ``[call shape, host args, host kwargs, extents]``.

    An error (out of memory, a forked child) leaves without the frames below this one, and with
    ``described`` emptied: the host views of device memory in them would fault a debugger or test
    runner that formats the frames' variables.
    """
    try:
        recipe = plan.recipe
        if recipe is None and plan.clean:  # its out= kernel has run clean: it may launch in one bridge call
            recipe = plan.recipe = plan.recipe_of()
        if recipe and not check:
            return planned_launch.launch(plan, recipe, described, args, kwargs)
        return plan.run(described[1], described[2], described[3], args, kwargs, check)
    except Exception as exc:  # noqa: BLE001 - re-raised below, without the frames that hold the views
        error = exc
    described.clear()
    detach_frames(error, "fallback")
    raise error
# LITERALINCLUDE END: RUN KNOWN


# LITERALINCLUDE START: PLAN A CALL
def launch(call: Call, check: bool) -> Any:
    """The general path's launch: through a new plan when the operator has plans, else the mechanism's
    with a kernel whose outputs' allocations are served from device memory."""
    entry = _plans_of(call.op)
    plan = _plan(entry, call) if entry is not None else None
    if plan is None:
        return launch_copy(call, check, served_kernel)
    described = [call.key, *call.host_args(), _C._extents(call.tensors)]
    result = _run(plan, described, call.args, call.kwargs, check)
    if plan.cacheable:
        call.plan = plan
    return result


def _plan(entry: _OpPlans, call: Call) -> Plan | None:
    """The plan of a call the mechanism has decided; None when an output is absent (the mechanism runs it)."""
    traits = call.traits
    metas = [call.meta] if len(traits.returns) == 1 else list(call.meta or ())
    kind, out = entry.kind, entry.out
    if kind is Served and entry.copying_out is not None and all(isinstance(m, torch.Tensor) for m in metas) and \
            sum(m.numel() * m.element_size() for m in metas) <= SMALL_OUTPUTS:
        kind, out = ThroughOutOverload, entry.copying_out  # copying a few bytes costs less than serving them
    if kind is Served and any(m is not None and not isinstance(m, torch.Tensor) for m in metas) or \
            kind is ThroughOutOverload and not all(_tensors(m) for m in metas):
        return None
    numbers = [i for i in traits.tensor_args if isinstance(call.given_value(i), _NUMBERS)]
    plan = kind(call, tuple((i, call.args[i]) for i in numbers if i < len(call.args)), metas, out)
    # Numbers passed for Tensor arguments: the call shape has their values (or classes: then each call wraps
    # its own), so their wrapped tensors are the plan's; not when it has their types only, or when they were
    # passed by keyword (not put back in place).
    if numbers and (traits.numbers == NUMBER_TYPE or numbers[-1] >= len(call.args)):
        plan.cacheable = False
    return plan


def _tensors(meta: Any) -> bool:
    """Whether an output's meta is a tensor or a non-empty list of tensors (what ThroughOutOverload allocates)."""
    return isinstance(meta, torch.Tensor) or (isinstance(meta, list) and bool(meta)
                                              and all(isinstance(m, torch.Tensor) for m in meta))


def clean(call: Call) -> None:
    """The call shape's first run was clean: keep its plan for the calls to come (the table is bounded)."""
    if call.plan is None or call.key is None:
        return
    _bound.put(_ops[call.op].plans, call.key, call.plan)
# LITERALINCLUDE END: PLAN A CALL
