"""openreg in PyTorch's profilers: device activity for ``torch.profiler`` and the legacy profiler.

The runtime already times every launch (``openreg.add_launch_observer``). This package turns those
records into what PyTorch's profilers read:

* :mod:`.kineto`: the activities of the Kineto profiler that the bridge registers with
  ``REGISTER_PRIVATEUSE1_PROFILER`` (``torch.profiler.profile(activities=[..., ProfilerActivity.PrivateUse1])``):
  a kernel or copy per launch on its stream's row, linked to the operator that launched it.
* :mod:`.legacy`: the ``PrivateUse1`` profiler stubs behind
  ``torch.autograd.profiler.profile(use_device="openreg")``: timed device events around every operator.
* :mod:`.memory`: ``profile_memory=True`` events of the caching allocator.
* :mod:`.launches`: the launch hook both use, and the launch sites of kernel errors
  (``OPENREG_LAUNCH_SITES=1``).
* :mod:`.memcheck`: the block and allocating stack a host access to device memory hit, added to the
  runtime's fault report.

Nothing here runs until a profiler starts (the bridge calls into these modules) or a fault happens.
"""

import openreg

from . import memcheck
from .launches import launch_sites

openreg.fault.add_annotator(memcheck.describe)

__all__ = ["launch_sites"]
