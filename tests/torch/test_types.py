"""Type strings, legacy type names and the OPENREG aliases PyTorch creates when the backend is renamed."""

from __future__ import annotations

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity


@pytest.mark.parametrize(("dtype", "name"), [
    (torch.float32, "FloatTensor"), (torch.float64, "DoubleTensor"), (torch.float16, "HalfTensor"),
    (torch.bfloat16, "BFloat16Tensor"), (torch.int64, "LongTensor"), (torch.int32, "IntTensor"),
    (torch.int16, "ShortTensor"), (torch.int8, "CharTensor"), (torch.uint8, "ByteTensor"), (torch.bool, "BoolTensor"),
])
def test_type_strings(dtype, name):
    x = torch.zeros(2, dtype=dtype, device="openreg")
    assert x.type() == f"torch.openreg.{name}"
    cpu = torch.zeros(2, dtype=dtype)
    assert cpu.type() == f"torch.{name}"
    # conversion by legacy name: to the device and dtype it names
    y = torch.ones(2).type(f"torch.openreg.{name}")
    assert y.device.type == "openreg" and y.dtype == dtype
    back = x.type(f"torch.{name}")
    assert back.device.type == "cpu" and back.dtype == dtype


def test_generated_is_openreg_properties():
    x = torch.ones(1, device="openreg")
    assert x.is_openreg and not torch.ones(1).is_openreg
    assert x.untyped_storage().is_openreg
    assert torch.nn.Linear(1, 1).openreg().weight.is_openreg


def test_legacy_tensor_classes_are_openregs_own():
    """torch generates torch.cuda.FloatTensor-style classes for CPU and CUDA only (python_tensor.cpp); openreg
    defines its own in Python (docs/cuda_api.md), outside torch's registry of tensor types."""
    assert not any("openreg" in str(c) for c in torch._tensor_classes)
    assert isinstance(torch.openreg.FloatTensor(2), torch.openreg.FloatTensor)


def test_profiler_activity_and_device_type_aliases():
    assert ProfilerActivity.OPENREG == ProfilerActivity.PrivateUse1
    assert str(ProfilerActivity.OPENREG) == "ProfilerActivity.OPENREG"
    assert ProfilerActivity.PrivateUse1.name == "OPENREG"
    assert DeviceType.OPENREG == DeviceType.PrivateUse1
    assert str(DeviceType.PrivateUse1) == "DeviceType.OPENREG"
    assert torch._C._get_privateuse1_backend_name() == "openreg"
