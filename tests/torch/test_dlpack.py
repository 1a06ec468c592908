"""DLPack for openreg tensors: kDLExtDev, zero-copy round trips."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close
from torch.utils.dlpack import DLDeviceType, from_dlpack, to_dlpack

import torch_openreg.dlpack


def test_dlpack_device_is_ext_dev(two_devices):
    x = torch.ones(3, device="openreg:1")
    assert x.__dlpack_device__() == (DLDeviceType.kDLExtDev, 1)
    assert torch.ones(2, device="openreg").__dlpack_device__() == (DLDeviceType.kDLExtDev, 0)
    assert torch.nn.Parameter(torch.ones(2, device="openreg")).__dlpack_device__() == (DLDeviceType.kDLExtDev, 0)
    assert torch.ones(2).__dlpack_device__() == (DLDeviceType.kDLCPU, 0)  # other devices: PyTorch's own answer


def test_upstream_dlpack_device_still_needs_the_workaround():
    """torch 2.13 compares with "privateuse1", not the renamed backend; when this fails, drop the workaround."""
    with pytest.raises(ValueError, match="Unknown device type openreg for Dlpack"):
        torch_openreg.dlpack._upstream_dlpack_device(torch.ones(2, device="openreg"))


def test_capsule_round_trip_shares_memory():
    x = torch.arange(12.0, device="openreg").reshape(3, 4)
    y = from_dlpack(to_dlpack(x))
    assert y.device == x.device
    assert y.data_ptr() == x.data_ptr()
    assert y.shape == x.shape and y.stride() == x.stride() and y.dtype == x.dtype
    y.add_(1)  # a write through one is seen through the other
    assert_close(x.cpu(), torch.arange(1.0, 13.0).reshape(3, 4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_from_dlpack_of_tensor_zero_copy(dtype):
    x = torch.ones(5, device="openreg", dtype=dtype)
    y = torch.from_dlpack(x)
    assert y.device == x.device and y.dtype == dtype
    assert y.data_ptr() == x.data_ptr()


def test_strided_view_and_second_device(two_devices):
    base = torch.arange(20.0, device="openreg:1").reshape(4, 5)
    view = base[1:, ::2]
    y = torch.from_dlpack(view)
    assert y.device == torch.device("openreg", 1)
    assert y.data_ptr() == view.data_ptr() and y.stride() == view.stride()
    assert_close(y.cpu(), view.cpu())


def test_dlpack_with_cross_device_copy_to_cpu():
    x = torch.arange(4.0, device="openreg")
    y = torch.from_dlpack(x, device="cpu")
    assert y.device.type == "cpu"
    assert_close(y, torch.arange(4.0))
