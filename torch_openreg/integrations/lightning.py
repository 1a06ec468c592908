"""Lightning's ``Trainer`` on openreg: ``import torch_openreg.integrations.lightning``, then
``L.Trainer(accelerator="openreg", devices=1)``.

Lightning 2.6 knows its accelerators by name (``AcceleratorRegistry``), and that registry is open:
the :class:`OpenRegAccelerator` registers itself as ``"openreg"`` when this module is imported.
Three decisions of ``_AcceleratorConnector`` (``lightning/pytorch/trainer/connectors/accelerator_connector.py``)
are not open: they list CUDA and MPS by name, and an accelerator they do not know gets the CPU's
answer. This module wraps each one, for the openreg accelerator only (everything else gets Lightning's
own answer):

- ``_choose_auto_accelerator``: ``accelerator="auto"`` picks openreg where Lightning would pick the CPU
  (a TPU, MPS or CUDA device still comes first), as it picks CUDA when there is a GPU;
- ``_choose_strategy``: one device gets ``SingleDeviceStrategy(openreg:N)`` (Lightning gives every
  accelerator it does not list ``SingleDeviceStrategy("cpu")``, so the model stayed on the CPU);
- ``_init_strategy``: the DDP family (``"ddp"``, ``"ddp_spawn"``, ...) gets :class:`OpenRegDDPStrategy`,
  whose process group puts CPU tensors on gloo and openreg tensors on ``occl``;
- ``_check_and_init_precision``: ``"16-mixed"``/``"bf16-mixed"`` autocast on openreg (Lightning builds
  ``MixedPrecision(..., "cuda")`` for every accelerator but the CPU and MPS, which disabled autocast
  with a warning).

Lightning has no entry point for accelerators (its only plugin entry points are callback factories,
loaded after the accelerator name was checked), so this module must be imported. It targets the
``lightning`` package (``import lightning as L``), not the separate ``pytorch_lightning`` distribution.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from lightning.fabric.accelerators.registry import _AcceleratorRegistry
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch.accelerators import Accelerator, AcceleratorRegistry
from lightning.pytorch.plugins.precision import MixedPrecision, Precision
from lightning.pytorch.strategies import (
    DDPStrategy,
    DeepSpeedStrategy,
    SingleDeviceStrategy,
    Strategy,
    StrategyRegistry,
)
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from torch.nn.parallel import DistributedDataParallel

__all__ = ["OpenRegAccelerator", "OpenRegDDPStrategy", "PROCESS_GROUP_BACKEND", "parse_devices"]

# CPU tensors (Lightning's own exchanges of objects and flags) on gloo, openreg tensors on occl:
# PyTorch 2.13 needs both named for a group that carries both kinds (docs/distributed.md).
PROCESS_GROUP_BACKEND = "cpu:gloo,openreg:occl"


# LITERALINCLUDE START: LIGHTNING DEVICES
def parse_devices(devices: int | str | Sequence[int]) -> list[int]:
    """Lightning's ``devices=`` for openreg: a count (``2``, ``"2"``, ``-1``: all) or indices (``[1]``, ``"0,1"``)."""
    count = torch.openreg.device_count()
    if isinstance(devices, str):
        text = devices.strip()
        try:
            devices = [int(p) for p in text.split(",") if p.strip()] if "," in text else int(text)
        except ValueError:
            message = f"devices={text!r} is neither a device count nor a list of indices"
            raise MisconfigurationException(message) from None
    if isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        raise MisconfigurationException(f"devices must be an int, a str or a list of ints, got {devices!r}")
    if isinstance(devices, int):
        if devices == -1:
            devices = count
        if devices <= 0:
            raise MisconfigurationException(f"devices={devices} is not a device count")
        if devices > count:
            raise MisconfigurationException(f"devices={devices} asks for more openreg devices than there are ({count})")
        return list(range(devices))
    indices = list(devices)
    bad = [i for i in indices if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < count]
    if not indices or bad or len(set(indices)) != len(indices):
        raise MisconfigurationException(
            f"devices={indices!r}: give distinct openreg device indices in [0, {count})"
            + (f" ({bad!r} are not)" if bad else ""))
    return indices
# LITERALINCLUDE END: LIGHTNING DEVICES


# LITERALINCLUDE START: LIGHTNING ACCELERATOR
class OpenRegAccelerator(Accelerator):
    """The openreg device for Lightning, shaped like its ``CUDAAccelerator``."""

    def setup_device(self, device: torch.device) -> None:
        if device.type != "openreg":
            raise MisconfigurationException(f"Device should be openreg, got {device} instead")
        torch.openreg.set_device(device)

    def teardown(self) -> None:
        torch.openreg.empty_cache()

    def get_device_stats(self, device: torch.device | str | int) -> dict[str, Any]:
        """The caching allocator's statistics, as ``torch.cuda.memory_stats`` (``DeviceStatsMonitor`` logs them)."""
        return torch.openreg.memory_stats(device)

    @staticmethod
    def parse_devices(devices: int | str | Sequence[int]) -> list[int]:
        return parse_devices(devices)

    @staticmethod
    def get_parallel_devices(devices: Sequence[int]) -> list[torch.device]:
        return [torch.device("openreg", i) for i in devices]

    @staticmethod
    def auto_device_count() -> int:
        return torch.openreg.device_count()

    @staticmethod
    def is_available() -> bool:
        return torch.openreg.is_available()

    @staticmethod
    def name() -> str:
        return "openreg"

    @classmethod
    def register_accelerators(cls, accelerator_registry: _AcceleratorRegistry) -> None:
        accelerator_registry.register(cls.name(), cls, description=cls.__name__, override=True)
# LITERALINCLUDE END: LIGHTNING ACCELERATOR


# LITERALINCLUDE START: LIGHTNING DDP
class OpenRegDDPStrategy(DDPStrategy):
    """``DDPStrategy`` with openreg's process-group backends and without the CUDA stream it wraps DDP in.

    ``DDPStrategy._setup_model`` builds ``DistributedDataParallel`` inside ``torch.cuda.stream(torch.cuda.Stream())``
    whenever the device has an index, which fails without CUDA. Here DDP is built on the current stream:
    its first broadcast of the parameters must come after their copies to the device, which the current
    (default) stream holds in order (openreg's host-to-device copies are asynchronous).
    """

    def _setup_model(self, model: torch.nn.Module) -> DistributedDataParallel:
        return DistributedDataParallel(module=model, device_ids=self.determine_ddp_device_ids(), **self._ddp_kwargs)

    def _get_process_group_backend(self) -> str:
        return self._process_group_backend or PROCESS_GROUP_BACKEND
# LITERALINCLUDE END: LIGHTNING DDP


def _is_openreg(flag: Accelerator | str) -> bool:
    return flag == "openreg" or isinstance(flag, OpenRegAccelerator)


def _wrap(cls: type, name: str, make: Callable[[Callable], Callable], static: bool = False) -> None:
    """Replace ``cls.name`` by ``make(original)`` once (importing twice, or reloading, wraps nothing twice)."""
    original = cls.__dict__[name]
    original = original.__func__ if isinstance(original, staticmethod) else original
    original = getattr(original, "__openreg_wrapped__", original)
    wrapper = functools.wraps(original)(make(original))
    wrapper.__openreg_wrapped__ = original
    setattr(cls, name, staticmethod(wrapper) if static else wrapper)


# LITERALINCLUDE START: LIGHTNING CONNECTOR
def _choose_auto_accelerator(original: Callable[[], str]) -> Callable[[], str]:
    def choose() -> str:
        choice = original()
        return "openreg" if choice == "cpu" and OpenRegAccelerator.is_available() else choice

    return choose


def _choose_strategy(original: Callable) -> Callable:
    def choose(self: _AcceleratorConnector) -> Strategy | str:
        if _is_openreg(self._accelerator_flag) and self._num_nodes_flag == 1 and len(self._parallel_devices) == 1:
            return SingleDeviceStrategy(device=self._parallel_devices[0])
        return original(self)  # "ddp" (or "ddp_fork" in a notebook), made openreg's by _init_strategy

    return choose


def _init_strategy(original: Callable) -> Callable:
    def init(self: _AcceleratorConnector) -> None:
        original(self)
        if not _is_openreg(self._accelerator_flag) or type(self.strategy) is not DDPStrategy:
            return
        if not isinstance(self._strategy_flag, str):
            raise MisconfigurationException(
                "DDPStrategy builds DistributedDataParallel on a CUDA stream; on openreg pass "
                "torch_openreg.integrations.lightning.OpenRegDDPStrategy(...) with the same arguments")
        self.strategy = OpenRegDDPStrategy(**StrategyRegistry[self._strategy_flag]["init_params"])

    return init


def _check_and_init_precision(original: Callable) -> Callable:
    def init(self: _AcceleratorConnector) -> Precision:
        mixed = self._precision_flag in ("16-mixed", "bf16-mixed")
        plain = isinstance(self.strategy, (SingleDeviceStrategy, DDPStrategy)) and not isinstance(
            self.strategy, DeepSpeedStrategy)  # DeepSpeed (a DDPStrategy) brings its own precision plugin
        if not (_is_openreg(self._accelerator_flag) and mixed and self._precision_plugin_flag is None and plain):
            return original(self)
        self._validate_precision_choice()
        rank_zero_info(f"Using {'16bit' if self._precision_flag == '16-mixed' else 'bfloat16'} Automatic Mixed"
                       " Precision (AMP) on openreg")
        return MixedPrecision(self._precision_flag, "openreg")  # its GradScaler("openreg") for 16-mixed

    return init


def install() -> None:
    """Register the accelerator as ``"openreg"`` and wrap the connector's decisions (idempotent)."""
    OpenRegAccelerator.register_accelerators(AcceleratorRegistry)
    _wrap(_AcceleratorConnector, "_choose_auto_accelerator", _choose_auto_accelerator, static=True)
    _wrap(_AcceleratorConnector, "_choose_strategy", _choose_strategy)
    _wrap(_AcceleratorConnector, "_init_strategy", _init_strategy)
    _wrap(_AcceleratorConnector, "_check_and_init_precision", _check_and_init_precision)
# LITERALINCLUDE END: LIGHTNING CONNECTOR


install()
