"""Shared fixtures for the PyTorch-integration tests (``import torch`` autoloads openreg).

Every test starts on openreg:0 with the default streams current. At teardown every device is
synchronized, so a kernel error a test left unreported fails that test instead of a later one.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
import torch

import openreg

ROOT = Path(__file__).resolve().parents[2]


def _reset() -> None:
    for index in range(torch.openreg.device_count()):
        torch.openreg.set_stream(torch.openreg.default_stream(index))
    torch.openreg.set_device(0)


@pytest.fixture(autouse=True)
def openreg_state():
    """Start on openreg:0 and default streams; drain every device (reporting kernel errors) after."""
    _reset()
    yield
    errors = []
    for index in range(torch.openreg.device_count()):
        try:
            torch.openreg.synchronize(index)
        except RuntimeError as exc:  # keep draining the other devices, then fail the test
            errors.append(exc)
    _reset()
    assert not errors, f"the test left unreported kernel errors: {errors}"


def memory_in_use() -> list[int]:
    """Bytes allocated to tensors on every device (``torch.openreg.memory_allocated``), once idle and collected."""
    for index in range(torch.openreg.device_count()):
        torch.openreg.synchronize(index)
    gc.collect()
    return [torch.openreg.memory_allocated(index) for index in range(openreg.device_count())]


@pytest.fixture(name="memory_in_use")
def memory_in_use_fixture():
    """:func:`memory_in_use` for tests (this directory is not a package: ``tests/torch`` would shadow torch)."""
    return memory_in_use


def _allocated_once_idle() -> list[int]:
    for index in range(torch.openreg.device_count()):
        torch.openreg.synchronize(index)
    return [torch.openreg.memory_allocated(index) for index in range(openreg.device_count())]


@pytest.fixture
def no_leak():
    """Fail the test if device memory is not back to where it was when the test started (collecting garbage
    only where it is not: a full collection costs a fifth of a second or more in this large process)."""
    before = memory_in_use()
    yield
    after = _allocated_once_idle()
    if after != before:
        after = memory_in_use()  # reference cycles the test left may still hold device memory
    assert after == before, f"device memory leaked: {before} -> {after}"


@pytest.fixture
def asynchronous():
    """Skip when OPENREG_LAUNCH_BLOCKING makes every launch wait for its kernel."""
    if openreg.LAUNCH_BLOCKING:
        pytest.skip("needs asynchronous launches (OPENREG_LAUNCH_BLOCKING is set)")


@pytest.fixture
def fallback_fast():
    """Skip a test of one of the fallback's accelerations when OPENREG_FALLBACK_FAST=0 turns them off."""
    if not openreg.settings.FALLBACK_FAST:
        pytest.skip("tests an acceleration of the fallback (OPENREG_FALLBACK_FAST=0 turns them off)")


@pytest.fixture
def two_devices():
    if torch.openreg.device_count() < 2:
        pytest.skip("needs at least two openreg devices (OPENREG_DEVICE_COUNT >= 2)")


@pytest.fixture
def launches():
    """Names and stream ids of the kernels launched during the test: ``[(name, device, stream_id), ...]``."""
    seen: list[tuple[str, int, int]] = []

    def observe(name, device, stream_id, start, end):
        seen.append((name, device, stream_id))

    openreg.add_launch_observer(observe)
    yield seen
    for index in range(torch.openreg.device_count()):
        torch.openreg.synchronize(index)
    openreg.remove_launch_observer(observe)
