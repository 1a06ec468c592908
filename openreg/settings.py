"""Every environment setting of OpenReg, read in this one module, once, at import.

Like a driver reading its module parameters: changing a variable after ``import openreg`` has no
effect. The runtime reads most of them; ``torch_openreg`` reads its own here too (this module stays
torch-free). ``docs/runtime.md`` lists them in one table. A malformed value makes the import fail
with ``OpenRegError(INVALID_VALUE)`` naming the variable.
"""

from __future__ import annotations

import os
import re

from .errors import ErrorCode, OpenRegError

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Parse ``"4GiB"``, ``"512M"``, ``"1048576"`` into a byte count."""
    match = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not match:
        raise OpenRegError(ErrorCode.INVALID_VALUE, f"cannot parse memory size {text!r}")
    return int(match.group(1)) * _UNITS[match.group(2)]


def _count(name: str, default: str) -> int:
    raw = os.environ.get(name, default)
    if not raw.strip().isdigit():
        raise OpenRegError(ErrorCode.INVALID_VALUE, f"{name}={raw!r} is not a count")
    return int(raw)


def _flag(name: str, default: bool) -> bool:
    """On for anything but ``0`` or an empty value (as ``CUDA_LAUNCH_BLOCKING``); ``default`` when unset."""
    raw = os.environ.get(name)
    return default if raw is None else raw not in ("", "0")


# LITERALINCLUDE START: SETTINGS
# The runtime (openreg/)
DEVICE_COUNT = _count("OPENREG_DEVICE_COUNT", "2")  # number of simulated devices
DEVICE_MEMORY = parse_size(os.environ.get("OPENREG_DEVICE_MEMORY", "4GiB"))  # capacity of each device
LAUNCH_BLOCKING = _flag("OPENREG_LAUNCH_BLOCKING", False)  # every launch waits for its work (debugging)
STREAM_SANITIZER = _flag("OPENREG_STREAM_SANITIZER", False)  # every launch checked for races with other streams
DEVICE_PROFILE = os.environ.get("OPENREG_DEVICE_PROFILE") or None  # the timing model's device profile (off)
MEMCHECK = _flag("OPENREG_MEMCHECK", False)  # kernels see only the memory their launch names (debugging)
PORTABLE_SHM = _flag("OPENREG_PORTABLE_SHM", False)  # POSIX shm_open instead of Linux's memfd_create
PROTECTION_GRANULE = parse_size(os.environ.get("OPENREG_PROTECTION_GRANULE", "0"))  # 0: the OS page size
# The PyTorch integration (torch_openreg/)
FALLBACK_FAST = _flag("OPENREG_FALLBACK_FAST", True)  # the global fallback's accelerations (aten/fast/)
# planned calls launched in one bridge call (csrc/planned_launch.cpp); the copies and .item() registered from the bridge
# (csrc/copies.cpp); the device allocator's block cache (csrc/block_cache.cpp)
CPP_LAUNCH = _flag("OPENREG_CPP_LAUNCH", True)
LAUNCH_SITES = _flag("OPENREG_LAUNCH_SITES", False)  # profiler: each launch names the Python line that made it
OCCL_BLOCKING_WAIT = _flag("OCCL_BLOCKING_WAIT", False)  # collectives' Work.wait() blocks the host
# LITERALINCLUDE END: SETTINGS
