"""Planned calls launched in one bridge call (``csrc/planned_launch.cpp``). Saves the plan's Python per call.

A call plan whose ``out=`` kernel has run clean (``call_plans.Plan.clean``: the CPU kernel kept the outputs
as given) launches the same kernel on every call of its call shape. :meth:`call_plans.Plan.run` is the
reference: it allocates the outputs, builds an ``OutKernel`` and launches it through
``launch.launch_extents``; the CPU kernel then parses its arguments when it runs. Here one bridge call does
it all from what ``_C._describe_call`` returned: the outputs with their host views, the arguments converted
once into the dispatcher's form (``torch::jit::argumentToIValue`` per argument, as ``createStackForSchema``
converts an ``OpOverload`` call from Python), and a kernel that runs them through the dispatcher queued with
``Stream.launch`` (so the launch hooks see it like any other). ``OPENREG_CPP_LAUNCH=0`` turns it off (the
reference path runs every call).

Not here: a call shape's first calls (the reference path checks them), functional kernels whose outputs are
served (``served_outputs``), and launches while the stream sanitizer needs each launch's write set.
"""

from __future__ import annotations

from typing import Any

import torch

import openreg
from openreg import settings
from torch_openreg import _C

ENABLED = settings.CPP_LAUNCH


# LITERALINCLUDE START: PLANNED LAUNCH
def recipe(plan: Any, op: torch._ops.OpOverload, fresh: list) -> Any:
    """How ``plan``'s calls launch here: its kernel calls ``op`` with the host arguments, the ``fresh`` outputs
    (``(out= argument name, meta tensor)`` pairs) allocated per call; without fresh outputs the call returns
    the arguments the operator returns. False while ``OPENREG_CPP_LAUNCH=0``."""
    if not ENABLED:
        return False
    traits = plan.traits
    given = [(r.arg, traits.arguments[r.arg].name) for r in traits.returns] if not fresh else []
    return _C._Recipe(op._schema.name, op._schema.overload_name, fresh, given, plan.index, traits.name)


def launch(plan: Any, recipe: Any, described: list, args: tuple, kwargs: dict) -> Any:
    """Launch a planned call (``described``: ``_C._describe_call``'s) on the current stream; the plan's own
    path while the stream sanitizer is on (it needs each launch's write set)."""
    if openreg.sanitizer.enabled:
        return plan.run(described[1], described[2], described[3], args, kwargs, False)
    host_args = plan.with_numbers(described[1]) if plan.wrapped else described[1]
    return _C._launch_recipe(recipe, host_args, described[2], described[3], args, kwargs,
                             openreg.current_stream(plan.index).launch)
# LITERALINCLUDE END: PLANNED LAUNCH
