"""DLPack for openreg tensors: the extension-device type ``kDLExtDev``.

PyTorch's C++ side already maps PrivateUse1 to ``kDLExtDev`` both ways, so
``torch.utils.dlpack.to_dlpack`` / ``from_dlpack`` of a capsule round-trip an openreg
tensor without a copy. Its Python side does not: ``Tensor.__dlpack_device__`` (torch 2.13,
``torch/_tensor.py``) tests ``self.device.type == "privateuse1"``, a name that no longer
exists once the backend is renamed, and raises "Unknown device type openreg for Dlpack".
``torch.from_dlpack(tensor)`` calls it first, so it fails too. The wrapper below answers
for openreg tensors and leaves every other device to PyTorch's own method.
"""

from __future__ import annotations

import torch
from torch.utils.dlpack import DLDeviceType

# LITERALINCLUDE START: DLPACK DEVICE
_upstream_dlpack_device = torch.Tensor.__dlpack_device__


def _dlpack_device(self: torch.Tensor):
    if not torch.overrides.has_torch_function_unary(self) and self.device.type == "openreg":
        return (DLDeviceType.kDLExtDev, self.device.index or 0)
    return _upstream_dlpack_device(self)


def install() -> None:
    """Work around torch 2.13 comparing the device type with "privateuse1" instead of the backend's name."""
    if torch.Tensor.__dlpack_device__ is _upstream_dlpack_device:
        _dlpack_device.__doc__ = _upstream_dlpack_device.__doc__
        torch.Tensor.__dlpack_device__ = _dlpack_device
# LITERALINCLUDE END: DLPACK DEVICE
