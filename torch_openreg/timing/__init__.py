"""The timing model in PyTorch: ``torch.openreg.simulate``, ``device_profiles``, ``set_device_profile``.

The runtime (``openreg.timing``) holds the device profiles, the model and the simulated clock; this
package prices PyTorch's launches (:mod:`.costs`) and reports on them (:mod:`.report`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

import openreg
from openreg.timing import DeviceProfile

from . import costs, python_calls

if TYPE_CHECKING:
    from .report import Report


def __getattr__(name: str):
    if name in ("Operator", "Report"):  # imported on first use: nothing here runs at ``import torch``
        from . import report

        return getattr(report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def device_profiles() -> dict[str, DeviceProfile]:
    """The built-in device profiles, by name (``h100-sxm``, ``a100-sxm``, ``t4``)."""
    return openreg.timing.profiles()


def get_device_profile() -> DeviceProfile | None:
    """The profile simulated time runs on, or None when it is off."""
    return openreg.timing.get_profile()


def set_device_profile(profile: str | os.PathLike | Mapping | DeviceProfile | None) -> DeviceProfile | None:
    """Turn simulated time on for the process with ``profile`` (a name, a profile file, a dict), or off
    with None (what ``OPENREG_DEVICE_PROFILE`` does at start-up). Returns the previous profile."""
    return openreg.timing.set_profile(profile)


# LITERALINCLUDE START: TIMING SIMULATE
class simulate:
    """``with torch.openreg.simulate("h100-sxm") as report:``: predict the work launched in the block
    on a device profile (a built-in name, a ``.json``/``.toml`` profile file or a dict of fields; the
    current profile when omitted). The report fills in as the block runs: ``report.device_time``,
    ``report.wall_time``, ``report.table()``, ``report.roofline()``. Resets the devices' peak memory
    statistics on entry."""

    def __init__(self, profile: str | os.PathLike | Mapping | DeviceProfile | None = None) -> None:
        if profile is None:
            profile = openreg.timing.get_profile()
            if profile is None:
                known = ", ".join(sorted(openreg.timing.profiles()))
                raise ValueError(f"simulate() needs a device profile (known profiles: {known}), "
                                 f"or {openreg.timing.ENV} set")
        from .report import Report

        self.report = Report(openreg.timing.resolve(profile))
        self._previous = None
        self._recording = None

    def __enter__(self) -> Report:
        self._previous = openreg.timing.set_profile(self.report.profile)
        for device in range(torch.openreg.device_count()):
            torch.openreg.reset_peak_memory_stats(device)
        costs.scratch_points.clear()
        self._recording = openreg.timing.recording()
        self.report.launches = self._recording.__enter__()
        self._start = self._now()
        self._calls = python_calls.Counter()
        self._calls.start()  # the program's Python calls cost the simulated host (python_calls.py)
        return self.report

    def _now(self) -> tuple[float, float]:
        """(the host's simulated time, when an event recorded on the current stream now would complete)."""
        stream = openreg.current_stream(torch.openreg.current_device())
        return openreg.timing.host_time(), openreg.timing.stream_time(stream)

    def __exit__(self, *exc) -> None:
        self._calls.stop()
        end = self._now()
        self.report.python_calls = self._calls.calls
        self._recording.__exit__(*exc)
        self.report.wall_time = end[1] - self._start[1]  # CUDA events around the block
        self.report.host_time = end[0] - self._start[0]
        for device in range(torch.openreg.device_count()):
            self.report.memory_peak[device] = max(torch.openreg.max_memory_allocated(device),
                                                  costs.scratch_peak(device, self.report.profile))
        openreg.timing.set_profile(self._previous)
# LITERALINCLUDE END: TIMING SIMULATE


__all__ = ["Operator", "Report", "device_profiles", "get_device_profile", "set_device_profile", "simulate"]
