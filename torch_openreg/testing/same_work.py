"""Give the CPU run of a PyTorch test file the work openreg's run does (the suites runner's ``--same-work``).

PyTorch's testing helpers choose part of a test's work by device type, and openreg (the PrivateUse1 backend) is
treated like CUDA where the CPU is not: ``common_optimizers`` adds ``foreach=True`` configurations only for the
device types of ``torch.utils._foreach_utils._get_foreach_kernels_supported_devices()`` (CUDA, XPU, MTIA and the
PrivateUse1 backend, not the CPU) and ``fused=True`` ones only for an ``OptimizerInfo``'s ``supports_fused_on``
(the CPU, not openreg); ``torch.optim`` defaults to its foreach implementation on the same device types; the
foreach OpInfos' samples add interspersed empty tensors on any device but the CPU. So a test with the same name
does more (or other) work on openreg than on the CPU, and the literal time ratio of the two runs is not the cost
of openreg alone. This pytest plugin makes those choices for the CPU as they are made for openreg. The runner
loads it in one extra CPU subprocess only (``-p torch_openreg.testing.same_work``), never on
``import torch_openreg``; the test files are unchanged.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch
from torch.testing._internal import common_methods_invocations, common_optimizers

_INSTALLED = "_openreg_same_work"


# LITERALINCLUDE START: SAME WORK
def _foreach_devices_with_cpu(original: Callable[[], list[str]], mirrored: str) -> Callable[[], list[str]]:
    """``_get_foreach_kernels_supported_devices`` that lists the CPU wherever it lists ``mirrored``."""

    @functools.wraps(original)
    def devices() -> list[str]:
        found = list(original())
        return found + ["cpu"] if mirrored in found and "cpu" not in found else found

    return devices


def _fused_as_on(supports_fused_on: tuple[str, ...], mirrored: str) -> tuple[str, ...]:
    """An ``OptimizerInfo.supports_fused_on`` where the CPU is listed exactly when ``mirrored`` is."""
    others = tuple(device for device in supports_fused_on if device != "cpu")
    return others + ("cpu",) if mirrored in supports_fused_on else others


def _samples_as_off_the_cpu(call: Callable[..., Any]) -> Callable[..., Any]:
    """A foreach sample function's ``__call__`` that builds, for the CPU, the samples any other device gets
    (it compares ``str(device) == "cpu"``; ``"cpu:0"`` is the same device under another name)."""

    @functools.wraps(call)
    def samples(self, opinfo, device, *args, **kwargs):
        return call(self, opinfo, "cpu:0" if str(device) == "cpu" else device, *args, **kwargs)

    return samples


def install(mirrored: str | None = None) -> list[str]:
    """Make the CPU's device-type-dependent choices as for ``mirrored`` (the PrivateUse1 backend's name unless
    given); returns what it changed. A second call changes nothing."""
    mirrored = mirrored or torch._C._get_privateuse1_backend_name()
    if getattr(common_optimizers, _INSTALLED, False):
        return []
    changed = []
    # torch.optim's __init__ deletes its submodules' names: import them by name
    optim_modules = [importlib.import_module(f"torch.optim.{name}") for name in ("optimizer", "swa_utils")]
    for module in (common_optimizers, *optim_modules):
        name = "_get_foreach_kernels_supported_devices"
        setattr(module, name, _foreach_devices_with_cpu(getattr(module, name), mirrored))
        changed.append(f"{module.__name__}.{name}")
    for info in common_optimizers.optim_db:
        fused_on = _fused_as_on(tuple(info.supports_fused_on), mirrored)
        if fused_on != tuple(info.supports_fused_on):
            info.supports_fused_on = fused_on
            changed.append(f"{info.optim_cls.__name__}.supports_fused_on")
    sampler = common_methods_invocations.foreach_inputs_sample_func
    sampler.__call__ = _samples_as_off_the_cpu(sampler.__call__)
    changed.append(f"{sampler.__qualname__}.__call__")
    setattr(common_optimizers, _INSTALLED, True)
    return changed
# LITERALINCLUDE END: SAME WORK


install()  # as a pytest plugin: before the test files are collected
