"""``torch.openreg.set_sync_debug_mode``: warn or fail where the host waits for the device.

A host that waits for the device (``.item()``, ``.cpu()``, a copy from or to pageable memory, an
operator whose output shape depends on the data, an explicit synchronize) stalls the pipeline of
asynchronous launches. CUDA's sync debug mode finds such waits hidden in PyTorch code; openreg offers
the same without a GPU. Each place where openreg's host waits calls :func:`check` with the name of the
operation; the simulator's own waits (the first run of a call shape, which checks its arguments on the
host; a generator read; an allocator retry) are not the user's and do not.

A report counts as many host synchronizations as CUDA's kernel makes for the operation
(:data:`CUDA_SYNCS`), so that a tool counting the warnings reads the same on both.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

_MODES = {"default": 0, "warn": 1, "error": 2}
mode = 0  # read directly on hot paths: 0 costs one comparison


class _Reporting(threading.local):
    inside = False  # an operation already reported is running: its own host waits are part of it


_reporting = _Reporting()


# LITERALINCLUDE START: SYNC DEBUG
# Operators whose CUDA kernels wait for the device more than once per call; any other reported operation
# waits once. aten::repeat_interleave.Tensor without output_size reads the output's size (the sum of the
# repeats) and then checks that no repeat is negative: two device-to-host reads, two warnings on CUDA
# (measured: PyTorch 2.11 on an H100). openreg's kernel computes on the host and waits once.
CUDA_SYNCS = {"aten::repeat_interleave.Tensor": 2}


def set_sync_debug_mode(debug_mode: int | str) -> None:
    """``"default"``/0: nothing; ``"warn"``/1: warn at each synchronizing operation; ``"error"``/2: raise."""
    global mode
    if isinstance(debug_mode, str):
        if debug_mode not in _MODES:
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")
        debug_mode = _MODES[debug_mode]
    if debug_mode not in (0, 1, 2):
        raise RuntimeError(f"invalid value of debug_mode {debug_mode!r}, expected 0, 1 or 2")
    mode = int(debug_mode)


def get_sync_debug_mode() -> int:
    """The current mode: 0 (default), 1 (warn) or 2 (error)."""
    return mode


def check(operation: str) -> None:
    """Called where the host is about to wait for the device because of ``operation``."""
    if mode == 0 or _reporting.inside:
        return
    message = f"called a synchronizing openreg operation: {operation}"
    if mode == 2:
        raise RuntimeError(message)
    syncs = CUDA_SYNCS.get(operation, 1)
    for n in range(1, syncs + 1):
        warnings.warn(message + (f" (host synchronization {n} of {syncs})" if syncs > 1 else ""),
                      UserWarning, stacklevel=2)


@contextlib.contextmanager
def reported(operation: str | None) -> Iterator[None]:
    """:func:`check` ``operation`` (None: a wait of the simulator's own, not reported), then run the block
    without reporting the host waits it makes itself (``nonzero`` copies its result to the device: one
    synchronizing operation, reported once)."""
    if operation is not None:
        check(operation)
    previous, _reporting.inside = _reporting.inside, True
    try:
        yield
    finally:
        _reporting.inside = previous


def run_reported(operation: str | None, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, a host wait for the device, :func:`reported` as ``operation`` while the mode is on
    (a host path's kernel, run now: the simulator needs its result; CUDA waits too where ``operation``)."""
    if mode == 0:
        return fn(*args)
    with reported(operation):
        return fn(*args)
# LITERALINCLUDE END: SYNC DEBUG
