"""Shared fixtures for the runtime tests: these tests drive ``openreg`` alone and never import torch.

Every test starts on device 0 with the default streams current, and on teardown the
fixture synchronizes every device (so a kernel error a test forgot to consume fails
that test) and checks that device memory is back where it was (nothing leaked).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import openreg  # noqa: E402  (after the path fix above)

# How long a gated kernel waits before giving up, so a failing test never hangs the suite.
GATE_TIMEOUT = 10.0


@pytest.fixture(autouse=True)
def clean_runtime():
    """Reset per-thread state before a test; after it, drain all work and check for leaks."""
    for device in range(openreg.device_count()):
        openreg.set_stream(openreg.default_stream(device))
    openreg.set_device(0)
    before = [openreg.memory_used(d) for d in range(openreg.device_count())]
    yield
    for device in range(openreg.device_count()):
        openreg.synchronize(device)  # raises if a test left a kernel error unreported
        openreg.set_stream(openreg.default_stream(device))
    openreg.set_device(0)
    after = [openreg.memory_used(d) for d in range(openreg.device_count())]
    assert after == before, f"device memory leaked by the test: {before} -> {after}"


@pytest.fixture
def two_devices():
    """Skip unless the runtime was configured with at least two devices."""
    if openreg.device_count() < 2:
        pytest.skip("needs OPENREG_DEVICE_COUNT >= 2")


@pytest.fixture
def asynchronous():
    """Skip when OPENREG_LAUNCH_BLOCKING makes every launch synchronous."""
    if openreg.LAUNCH_BLOCKING:
        pytest.skip("needs asynchronous launches (OPENREG_LAUNCH_BLOCKING is set)")


class Gate:
    """A latch a kernel can block on, so a test controls exactly when device work proceeds."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def wait(self) -> None:
        if not self._event.wait(GATE_TIMEOUT):
            raise TimeoutError("gate was never opened")

    def open(self) -> None:
        self._event.set()


@pytest.fixture
def gate(asynchronous):
    """A :class:`Gate`, opened at teardown (before the runtime is drained) even if the test failed."""
    g = Gate()
    yield g
    g.open()


@pytest.fixture
def run_python(run_python):
    """The shared runner (tests/conftest.py), with this suite's 30 s default timeout."""
    return functools.partial(run_python, timeout=30.0)


@pytest.fixture
def host_prot():
    """``host_prot(addr)``: the host's permissions on the page holding ``addr``: ``'---'`` (device memory
    outside kernels) or ``'rw-'``."""
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs /proc/self/maps")

    def prot(addr: int) -> str:
        with open("/proc/self/maps") as maps:
            for line in maps:
                span, perms = line.split()[:2]
                start, end = (int(x, 16) for x in span.split("-"))
                if start <= addr < end:
                    return perms[:3]  # private, or shared once exported to another process: the same to the host
        raise LookupError(f"0x{addr:x} is not mapped")

    return prot
