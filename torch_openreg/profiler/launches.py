"""The runtime's launch hook, as the profiler and the kernel-error reports use it.

``openreg.set_launch_hook`` runs a function at every launch, on the launching thread; what it
returns travels with the launch (its *tag*). Two clients share the one hook:

* the Kineto profiler, while it traces: the tag carries the correlation id of the operator being
  run on this thread (the bridge keeps Kineto's correlation stack) and when the launch happened;
* launch sites (``OPENREG_LAUNCH_SITES=1`` or :func:`launch_sites`): the tag names the Python line
  outside PyTorch and openreg that caused the launch, and the runtime ends an asynchronous kernel
  error's message with it (CUDA's device-side assertions name the kernel; this names the line).

With neither on, no hook is installed and a launch pays nothing.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator

import openreg
from torch_openreg._C import _profiler_correlation as _correlation  # a bare name: the hook runs at every launch

_PACKAGES = tuple(
    os.path.dirname(os.path.abspath(m.__file__)) + os.sep
    for m in (openreg, sys.modules["torch"], sys.modules["torch_openreg"])
)
_SKIP = (*_PACKAGES, "<frozen ")


# LITERALINCLUDE START: LAUNCH TAG
class Launch:
    """What a launch carries: the operator that made it, where and when (a launch hook's tag)."""

    __slots__ = ("correlation", "user_correlation", "thread", "launched_ns", "launch_site", "simulated")

    def __init__(self) -> None:
        self.correlation = self.thread = self.launched_ns = 0
        self.user_correlation: tuple[int, ...] = ()  # the record_function ranges open, outermost first
        self.launch_site: str | None = None
        self.simulated: tuple[float, float] | None = None  # (start, end) seconds, when simulated time is on


def launch_site() -> str | None:
    """``file:line in function`` of the innermost frame outside torch, torch_openreg and openreg."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_SKIP):
            return f"{filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return None


def _hook(name: str, device: int, stream: int) -> Launch:
    tag = Launch()
    if _tracing:
        tag.correlation, tag.user_correlation = _correlation()
        tag.thread = threading.get_native_id()
        tag.launched_ns = time.perf_counter_ns()
    if _sites:
        tag.launch_site = launch_site()
    return tag
# LITERALINCLUDE END: LAUNCH TAG


_tracing = False
_sites = openreg.settings.LAUNCH_SITES
_lock = threading.Lock()


def _update() -> None:
    """Install the hook while a client needs it, remove it when none does."""
    openreg.set_launch_hook(_hook if (_tracing or _sites) else None)


def set_tracing(on: bool) -> None:
    """The Kineto session starts or stops tracing launches."""
    global _tracing
    with _lock:
        _tracing = on
        _update()


@contextlib.contextmanager
def launch_sites(enabled: bool = True) -> Iterator[None]:
    """Within the block, an asynchronous kernel error names the Python line that launched the kernel.

    The same as ``OPENREG_LAUNCH_SITES=1`` for the whole process. It costs a walk up the Python
    stack at every launch (about a microsecond), so it is off by default, like CUDA's device-side
    assertions.
    """
    global _sites
    with _lock:
        previous, _sites = _sites, enabled
        _update()
    try:
        yield
    finally:
        with _lock:
            _sites = previous
            _update()


if _sites:
    _update()
