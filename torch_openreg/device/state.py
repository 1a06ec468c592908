"""What the parts of ``torch.openreg`` need from the device module, below all of them.

Lazy initialization (as ``torch.cuda``'s: behind a lock, calls queued until it happens, refused in a
child forked after it) and device indices. The submodules (``memory``, ``random``, ``streams``, ``graphs``)
import this module at their top, so the imports run down the layers; the package re-exports it as
``torch.openreg``'s. What the bridge needs (``_runtime.py``) lies below the whole device module.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Callable
from typing import Any

import torch

import openreg


class DeferredOpenRegCallError(RuntimeError):
    """A call queued before initialization (``_lazy_call``) failed when initialization ran it
    (``torch.cuda.DeferredCudaCallError``); the message has the stack that queued it."""


_initialized = False
_in_bad_fork = False
_init_lock = threading.RLock()  # re-entrant: a queued call may queue or initialize again
_queued_calls: list[tuple[Callable[[], None], list[str], str | None]] = []


# LITERALINCLUDE START: LAZY INIT
def is_initialized() -> bool:
    """Whether the device runtime has been initialized in this process."""
    return _initialized and not _in_bad_fork


def _is_in_bad_fork() -> bool:
    return _in_bad_fork or openreg.device.forked()


def _lazy_call(fn: Callable[[], None], rng: str | None = None) -> None:
    """Run ``fn`` now if initialized, else when initialization happens, in the order of the calls.

    ``rng`` tags random-state calls (``"one"`` device or ``"all"``): a queued ``"all"`` call replaces
    every random-state call queued before it, which it would overwrite anyway.
    """
    with _init_lock:
        if not is_initialized():
            if rng == "all":
                _queued_calls[:] = [call for call in _queued_calls if call[2] is None]
            _queued_calls.append((fn, traceback.format_stack(), rng))
            return
    fn()


def _lazy_init() -> None:
    global _initialized
    if is_initialized():
        return
    with _init_lock:
        if is_initialized():
            return
        if _is_in_bad_fork():
            raise RuntimeError(
                "Cannot re-initialize OpenReg in forked subprocess. To use OpenReg with "
                "multiprocessing, you must use the 'spawn' start method"
            )
        if openreg.device_count() == 0:  # as torch.cuda's "No CUDA GPUs are available"; seeds queued stay queued
            raise RuntimeError("No openreg devices are available (OPENREG_DEVICE_COUNT is 0)")
        openreg.fault.install()
        _initialized = True
        for fn, stack, _ in _queued_calls:
            try:
                fn()
            except Exception as exc:
                raise DeferredOpenRegCallError(f"OpenReg call failed lazily at initialization: {exc}\nQueued "
                                               "at:\n" + "".join(stack)) from exc
        _queued_calls.clear()


def init() -> None:
    """Initialize the device now rather than on first use."""
    _lazy_init()


def _after_fork_in_child() -> None:
    global _initialized, _in_bad_fork
    if _initialized:
        _in_bad_fork = True
    _initialized = False


os.register_at_fork(after_in_child=_after_fork_in_child)


def _index(device: Any) -> int:
    """Turn ``None``/int/str/torch.device into a device index, checking it is openreg."""
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "openreg":
        raise ValueError(f"expected an openreg device, got {device}")
    return current_device() if device.index is None else device.index


def current_device() -> int:
    """Index of the calling thread's current device."""
    _lazy_init()
    return openreg.get_device()
# LITERALINCLUDE END: LAZY INIT
