"""The ``PrivateUse1`` profiler stubs: ``torch.autograd.profiler.profile(use_device="openreg")``.

Without Kineto's device tracing (``use_kineto=False``, the default of the legacy API) PyTorch runs
the profiler in its ``KINETO_PRIVATEUSE1_FALLBACK`` state: it records a device event on the current
stream when each operator starts and another when it ends, and reports the time between them as
the operator's device time (``privateuse1_elapsed_us``). These are those events: timed runtime
events, as ``torch.cuda``'s fallback uses CUDA events.
"""

from __future__ import annotations

import openreg


# LITERALINCLUDE START: LEGACY RECORD
def record() -> tuple[int, openreg.Event]:
    """(device, event) of a timed event recorded now on the current device's current stream."""
    device = openreg.get_device()
    event = openreg.Event(enable_timing=True)
    event.record(openreg.current_stream(device))
    return device, event


def elapsed_us(start: openreg.Event, end: openreg.Event) -> float:
    """Microseconds between two recorded events, once the device has reached the second (PyTorch
    reads the stubs' ``elapsed`` as microseconds, as CUDA's stubs scale ``cudaEventElapsedTime``)."""
    if start.device != end.device:  # an operator that changed the current device: no device time for it
        return 0.0
    end.synchronize()
    start.synchronize()
    return start.elapsed_time(end) * 1000.0
# LITERALINCLUDE END: LEGACY RECORD


def synchronize() -> None:
    """Wait for every device (the stubs' ``synchronize``)."""
    for device in range(openreg.device_count()):
        openreg.synchronize(device)


# NVTX-style markers have no openreg counterpart: the runtime has no annotation API to forward them to.
def mark(name: str) -> None:
    """A point marker (``nvtxMark``): nothing to record it in."""


def range_push(name: str) -> None:
    """Open a marker range (``nvtxRangePush``): nothing to record it in."""


def range_pop() -> None:
    """Close a marker range (``nvtxRangePop``)."""
