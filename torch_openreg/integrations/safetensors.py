"""safetensors files loaded straight onto an openreg device.

safetensors 0.8's Rust binding parses the ``device`` argument of ``load_file`` / ``safe_open`` /
``load_model`` itself, against a fixed list of names (``cpu``, ``cuda``, ``mps``, ``npu``, ``xpu``,
``xla``, ``mlu``, ``musa``, ``hpu``, with ``:N``): ``device="openreg"`` fails with "device openreg is
invalid". An integer is the exception: it becomes ``Device::Anonymous(N)``, handed to PyTorch unchanged
(``tensor.to(N)``), and PyTorch reads a bare index as a device of the current accelerator, which is
openreg once the backend is loaded. So ``load_file(path, device=1)`` loads onto ``openreg:1``: that is
the route, and these helpers take openreg's device names and pass the index. Saving needs nothing:
``save_file`` copies openreg tensors to the host itself.
"""

from __future__ import annotations

import os
from typing import Any

import safetensors
import safetensors.torch
import torch

__all__ = ["device_argument", "load_file", "safe_open"]


# LITERALINCLUDE START: SAFETENSORS DEVICE
def device_argument(device: torch.device | str | int) -> str | int:
    """What safetensors' ``device=`` accepts for ``device``: the index of an openreg device, other devices unchanged."""
    device = torch.device(device)
    if device.type != "openreg":
        return str(device)
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is None or accelerator.type != "openreg":
        raise RuntimeError(f"safetensors places a bare device index on the current accelerator, which is "
                           f"{accelerator}, not openreg: it cannot load onto {device}")
    index = torch.openreg.current_device() if device.index is None else device.index
    if not 0 <= index < torch.openreg.device_count():
        raise ValueError(f"{device}: openreg has {torch.openreg.device_count()} devices")
    return index


def load_file(filename: str | os.PathLike, device: torch.device | str | int = "openreg") -> dict[str, torch.Tensor]:
    """``safetensors.torch.load_file`` onto ``device`` (``"openreg"``, ``"openreg:1"``, ``torch.device``, ...)."""
    return safetensors.torch.load_file(filename, device=device_argument(device))


def safe_open(filename: str | os.PathLike, device: torch.device | str | int = "openreg") -> Any:
    """``safetensors.safe_open(filename, framework="pt", device=...)`` with openreg device names."""
    return safetensors.safe_open(filename, framework="pt", device=device_argument(device))
# LITERALINCLUDE END: SAFETENSORS DEVICE
