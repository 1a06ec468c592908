"""Devices of the simulated accelerator: how many, their properties, the current one.

How many devices there are and their capacity come from the environment
(``OPENREG_DEVICE_COUNT``, ``OPENREG_DEVICE_MEMORY``: :mod:`openreg.settings`).
Capacity is accounted, not reserved: pages are only committed when a kernel or
copy writes them.

The current device is thread-local, like the current CUDA context.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import dataclass, fields
from pathlib import Path

from . import settings
from .errors import ErrorCode, OpenRegError

_COUNT = settings.DEVICE_COUNT
_CAPACITY = settings.DEVICE_MEMORY


class UUID(str):
    """A device's UUID: its text (``str(props.uuid)``, as CUDA's ``_CUuuid`` prints) and its 16 ``bytes``."""

    @property
    def bytes(self) -> bytes:
        return uuid.UUID(self).bytes


# LITERALINCLUDE START: DEVICE PROPERTIES
@dataclass(frozen=True)
class DeviceProperties:
    """What ``cudaGetDeviceProperties`` reports, with ``torch.cuda.get_device_properties``'s 23 field names.

    ``total_memory`` is the simulated capacity (what ``mem_get_info`` and out-of-memory errors use) and
    ``multi_processor_count`` the host's cores (the kernels run on them; compiled code sizes its work by
    it). The descriptive fields come from the device profile selected when the device is first queried
    (``openreg/timing/data/properties``, each figure with its source), else from :data:`DEFAULTS`.
    """

    index: int
    name: str
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int
    L2_cache_size: int = 0  # noqa: N815 - torch.cuda's field names
    clock_rate: int = 0  # kHz
    memory_clock_rate: int = 0  # kHz
    memory_bus_width: int = 0  # bits
    warp_size: int = 32
    max_threads_per_block: int = 1024
    max_threads_per_multi_processor: int = 2048
    regs_per_multiprocessor: int = 65536
    shared_memory_per_block: int = 49152
    shared_memory_per_block_optin: int = 49152
    shared_memory_per_multiprocessor: int = 65536
    is_integrated: int = 0
    is_multi_gpu_board: int = 0
    gcnArchName: str = ""  # noqa: N815
    uuid: UUID = UUID("00000000-0000-0000-0000-000000000000")
    pci_bus_id: int = 0
    pci_device_id: int = 0
    pci_domain_id: int = 0

    def __repr__(self) -> str:  # the layout of torch.cuda's _CudaDeviceProperties repr
        return (f"_OpenRegDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // (1 << 20)}MB, multi_processor_count={self.multi_processor_count}, "
                f"uuid={self.uuid}, pci_bus_id={self.pci_bus_id}, pci_device_id={self.pci_device_id}, "
                f"pci_domain_id={self.pci_domain_id}, L2_cache_size={self.L2_cache_size // (1 << 20)}MB)")
# LITERALINCLUDE END: DEVICE PROPERTIES


# LITERALINCLUDE START: RUNTIME DEVICE
def device_count() -> int:
    """Number of simulated devices (``OPENREG_DEVICE_COUNT``)."""
    return _COUNT


def check_device(index: int) -> int:
    """Return ``index`` if it names a device, else raise INVALID_DEVICE."""
    if type(index) is int and 0 <= index < _COUNT:
        return index
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < _COUNT:
        raise OpenRegError(
            ErrorCode.INVALID_DEVICE,
            f"invalid device ordinal {index!r}: openreg has {_COUNT} device(s)"
            + (f", valid ordinals are 0..{_COUNT - 1}" if _COUNT else ""),
        )
    return index


class _Local(threading.local):
    """The calling thread's current device; the class default (0, like a fresh CUDA thread) spares
    threads that never set one an ``AttributeError`` raised and caught on every look-up."""

    device = 0


_local = _Local()


def get_device() -> int:
    """The calling thread's current device (0 until set, like a fresh CUDA thread)."""
    return _local.device


def set_device(index: int) -> None:
    """Make ``index`` the calling thread's current device."""
    _local.device = check_device(index)


def exchange_device(index: int) -> int:
    """Set the current device and return the previous one (for device guards)."""
    previous = get_device()
    if index != previous:
        set_device(index)
    return previous
# LITERALINCLUDE END: RUNTIME DEVICE


# LITERALINCLUDE START: FORK POISON
# A child forked after the runtime started has copies of its state but none of its
# worker threads: like a CUDA context, the runtime cannot be used there.
_started = False
_forked = False


def start() -> None:
    """Mark the runtime in use (first allocation or stream); refuse if this is a forked child."""
    global _started
    if _forked:
        raise OpenRegError(
            ErrorCode.NOT_INITIALIZED,
            "Cannot re-initialize OpenReg in forked subprocess. To use OpenReg with multiprocessing, "
            "you must use the 'spawn' start method",
        )
    _started = True


def _after_fork_in_child() -> None:
    global _forked
    _forked = _forked or _started


def forked() -> bool:
    """True in a child forked after the runtime started (the runtime is unusable there)."""
    return _forked


os.register_at_fork(after_in_child=_after_fork_in_child)
# LITERALINCLUDE END: FORK POISON


_CORES = os.cpu_count() or 1  # asked once: os.cpu_count() reads sysfs each time, and PyTorch asks per backward


# LITERALINCLUDE START: PROPERTY SOURCES
PROPERTIES = Path(__file__).with_name("timing") / "data" / "properties"  # per profile: figures and sources
# Without a profile: the host's L2 and clock (the device's kernels run on its cores), CUDA's programming-model
# limits that every current compute capability shares (DeviceProperties' defaults), no memory clock or bus.
_properties: dict[int, DeviceProperties] = {}
_properties_lock = threading.Lock()


def _profile_figures() -> dict:
    """The descriptive figures of the timing model's current device profile (empty without one, or for a
    profile without a properties file: a custom profile)."""
    from . import timing  # imported here: timing imports this module

    profile = timing.get_profile()
    path = PROPERTIES / f"{profile.name}.json" if profile is not None else None
    if path is None or not path.is_file():
        return {}
    figures = json.loads(path.read_text())
    return {f.name: figures[f.name] for f in fields(DeviceProperties) if f.name in figures}


def _host_figures() -> dict:
    l2 = 0
    for cache in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):  # Linux; 0 elsewhere
        try:
            if (cache / "level").read_text().strip() == "2":
                size = (cache / "size").read_text().strip()
                l2 = int(size[:-1]) * {"K": 1 << 10, "M": 1 << 20}[size[-1]] if size[-1] in "KM" else int(size)
        except (OSError, ValueError):
            pass
    try:
        clock = clock_rate(0) * 1000 if _COUNT else 0
    except OpenRegError:  # the host does not report its clock
        clock = 0
    return {"L2_cache_size": max(l2, 0), "clock_rate": clock}


def get_device_properties(index: int) -> DeviceProperties:
    """Static properties of a device, fixed when it is first queried (as a CUDA context reads them once)."""
    check_device(index)
    props = _properties.get(index)
    if props is None:
        with _properties_lock:
            props = _properties.get(index)
            if props is None:
                name = "OpenReg Simulated Device"
                identity = {"uuid": UUID(str(uuid.uuid5(uuid.NAMESPACE_URL, f"openreg:{index}"))),
                            "pci_bus_id": index, "gcnArchName": name}  # one bus per device; CUDA's gcnArchName
                props = _properties[index] = DeviceProperties(
                    index=index, name=name, total_memory=_CAPACITY, major=1, minor=0,
                    multi_processor_count=_CORES, **{**identity, **_host_figures(), **_profile_figures()})
    return props
# LITERALINCLUDE END: PROPERTY SOURCES


def device_capacity(index: int) -> int:
    """Bytes of memory the device has."""
    check_device(index)
    return _CAPACITY


def clock_rate(index: int) -> int:
    """The device's clock in MHz: the host CPU's current average, since its cores run the device's kernels."""
    check_device(index)
    try:
        with open("/proc/cpuinfo") as f:
            rates = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
    except OSError:
        rates = []
    if not rates:
        raise OpenRegError(ErrorCode.NOT_SUPPORTED, f"openreg:{index}: the host does not report its clock rate")
    return round(sum(rates) / len(rates))
