"""``OPENREG_LAUNCH_BLOCKING=1``: every launch waits for its work (``CUDA_LAUNCH_BLOCKING``), so a kernel's
error surfaces at the call that launched it. A debugging setting: its launch hook is registered only then."""

from __future__ import annotations

from typing import Any

from . import hooks, settings

LAUNCH_BLOCKING = settings.LAUNCH_BLOCKING  # (openreg.LAUNCH_BLOCKING)


# LITERALINCLUDE START: LAUNCH BLOCKING
class _Hook(hooks.LaunchHook):
    order = 40  # the last to see a queued launch: the timing model has priced it

    def queued(self, stream: Any, item: Any, buffers: Any, cost: Any) -> None:
        if item.owner:
            return  # run_here waits for it anyway
        q = stream._q  # the debugging setting's wait, not the program's: neither simulated time nor the
        q.wait_for(q.launched, simulated=False)  # stream sanitizer counts it
        stream.check_error()


if LAUNCH_BLOCKING:
    hooks.add(_Hook())
# LITERALINCLUDE END: LAUNCH BLOCKING
