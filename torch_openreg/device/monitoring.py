"""What ``nvidia-smi`` reports of a device, for openreg: ``torch.cuda.utilization`` and its neighbours.

CUDA asks NVML; openreg asks its runtime, which knows when each device's streams ran work
(``openreg.activity``). Sensors the simulated device does not have (temperature, power) are refused
with the driver's NOT_SUPPORTED error rather than answered with invented numbers.
"""

from __future__ import annotations

from typing import Any

import openreg

from . import state

_IDLE_LAUNCHES = ("wait_event", "event_record")  # a stream waiting for another, an event timestamp: no work
_COPIES = ("copy", "memcpy")


def _index(device: Any) -> int:
    state._lazy_init()
    return state._index(device)


# LITERALINCLUDE START: UTILIZATION
def utilization(device: Any = None) -> int:
    """Percent of the last sample period (1 s) in which one or more kernels ran on the device."""
    fraction = openreg.activity.busy_fraction(_index(device), counts=lambda name: name not in _IDLE_LAUNCHES)
    return round(100 * fraction)


def memory_usage(device: Any = None) -> int:
    """Percent of the last sample period (1 s) in which device memory was being copied to, from or within
    the device (NVML's memory utilization; openreg counts its copy launches)."""
    fraction = openreg.activity.busy_fraction(_index(device), counts=lambda name: name.startswith(_COPIES))
    return round(100 * fraction)
# LITERALINCLUDE END: UTILIZATION


def clock_rate(device: Any = None) -> int:
    """Clock of the device in MHz: the host CPU's, whose cores run openreg's kernels."""
    return openreg.device.clock_rate(_index(device))


def temperature(device: Any = None) -> int:
    """Refused: the simulated device has no temperature sensor (NOT_SUPPORTED)."""
    raise openreg.OpenRegError(openreg.ErrorCode.NOT_SUPPORTED,
                               f"temperature is not supported on openreg:{_index(device)}: the simulated device "
                               "has no sensor (the host CPU's temperature would say nothing about a device)")


def power_draw(device: Any = None) -> int:
    """Refused: the simulated device has no power sensor (NOT_SUPPORTED)."""
    raise openreg.OpenRegError(openreg.ErrorCode.NOT_SUPPORTED,
                               f"power_draw is not supported on openreg:{_index(device)}: the simulated device "
                               "has no power sensor")
