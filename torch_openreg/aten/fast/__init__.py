"""The global fallback's accelerations: each saves part of a call's cost; none changes what it computes.

========================  ====================================================================
module                    what it saves
========================  ====================================================================
``call_plans``            the general path for a call shape seen before: one bridge call
                          (``csrc/call_args.cpp``) describes the call, and its plan runs
``planned_launch``        a clean plan's kernel Python: its calls launch in one bridge call
                          (``csrc/planned_launch.cpp``; ``OPENREG_CPP_LAUNCH=0`` turns it off)
``meta_cache``            the meta run (20-200 us) for a call shape seen before
``out_overloads``         the copy of each output: a CPU ``out=`` kernel writes into device memory
``served_outputs``        the copy of each output of a functional CPU kernel: its allocations are
                          served from the outputs' device memory (``csrc/cpu_outputs.cpp``)
========================  ====================================================================

They take over the mechanism's choices (``fallback.Choices``) once :func:`install` runs, which
``torch_openreg.aten`` does unless ``OPENREG_FALLBACK_FAST=0``. The one process-wide change they
need, a CPU allocator in front of PyTorch's, is made by ``served_outputs.install_allocator`` when
the first kernel that needs it is built.
"""

from __future__ import annotations

from .. import fallback
from . import call_plans, meta_cache


# LITERALINCLUDE START: ACCELERATED
class Accelerated(fallback.Choices):
    """The mechanism's choices, made faster."""

    run_known = staticmethod(call_plans.run_known)
    meta_outputs = staticmethod(meta_cache.meta_outputs)
    launch = staticmethod(call_plans.launch)
    clean = staticmethod(call_plans.clean)


def install() -> None:
    """Turn the accelerations on: they make the fallback's choices from now on."""
    fallback.set_choices(Accelerated())
# LITERALINCLUDE END: ACCELERATED
