"""Behaviours a ``torch.cuda`` user relies on, found by probing openreg the way such a user would.

Each test states what CUDA (or the CPU, where CUDA follows it) does and checks openreg against it.
"""

from __future__ import annotations

import pytest
import torch

import openreg


@pytest.fixture(autouse=True)
def _no_leak(no_leak):
    yield


def _cpu_error(dst_shape: tuple, src_shape: tuple) -> str:
    with pytest.raises(RuntimeError) as info:
        torch.empty(dst_shape).copy_(torch.empty(src_shape))
    return str(info.value)


COPIES = {
    "device to device": lambda dst, src: (torch.empty(dst, device="openreg"), torch.ones(src, device="openreg")),
    "peer": lambda dst, src: (torch.empty(dst, device="openreg:0"), torch.ones(src, device="openreg:1")),
    "pinned host to device": lambda dst, src: (torch.empty(dst, device="openreg"), torch.ones(src).pin_memory()),
    "device to pinned host": lambda dst, src: (torch.empty(dst).pin_memory(), torch.ones(src, device="openreg")),
}


@pytest.mark.parametrize("kind", COPIES)
@pytest.mark.parametrize("dst_shape, src_shape", [((3,), (4,)), ((4,), (2, 4))])
def test_copy_of_wrong_shape_raises_at_the_call(kind, dst_shape, src_shape):
    """CUDA checks a copy's shapes on the host: ``copy_`` raises the CPU's error before anything is queued,
    not a launch failure at the next synchronization."""
    if kind == "peer" and torch.openreg.device_count() < 2:
        pytest.skip("needs two openreg devices")
    dst, src = COPIES[kind](dst_shape, src_shape)
    with pytest.raises(RuntimeError) as info:
        dst.copy_(src, non_blocking=True)
    assert not isinstance(info.value, openreg.OpenRegError), info.value
    assert str(info.value) == _cpu_error(dst_shape, src_shape)
    torch.openreg.synchronize()  # nothing failed on the device
    src = torch.arange(float(dst.numel())).view(dst_shape)  # a copy that broadcasts still works
    torch.testing.assert_close(dst.copy_(src.to(dst.device)).cpu(), src)
