"""Report host accesses to device memory: a SIGSEGV/SIGBUS handler that names the allocation hit.

Device addresses are ``PROT_NONE`` for their whole life (kernels use the device's own view, see
``openreg.memory``), so a host read or write through a device pointer faults at once, whether a kernel
is using that memory or not. This handler (installed with the first device allocation) looks the
faulting address up among live allocations, prints what was hit, then restores the previous handler
and returns: the access faults again and the process ends the ordinary way (with faulthandler's
traceback when it is enabled). With ``OPENREG_MEMCHECK=1`` a kernel that touches a view its launch
did not name faults too, and is reported under the device address. A fault elsewhere is reported only when
it happens inside a kernel (naming the operator that was running: a CPU kernel that read past a buffer), then
goes to the previous handler too. The signal ABI is ``openreg.platform``'s.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable

from . import activity, memcheck, memory, platform
from .platform import libc

_previous = {sig: platform.SigAction() for sig in platform.FAULT_SIGNALS} if platform.SigAction else {}
_annotators: list[Callable[[int], str | None]] = []
_installed = False
_install_lock = threading.Lock()


# LITERALINCLUDE START: RUNTIME FAULT
def describe(addr: int) -> str | None:
    """The report for a host access at ``addr``, or None if it is not device memory."""
    kernel = False
    device_addr = memory.device_address(addr)  # a kernel's access through a view it was not given (memcheck)
    if device_addr is not None:
        addr, kernel = device_addr, True
    alloc = memory.find(addr, mapped=True)  # the padding past the end up to the granule is protected too
    if alloc is None or alloc.kind != memory.DEVICE:
        device = memory.arena_device(addr)
        if device is None:
            return None
        return (f"openreg: {'a kernel' if kernel else 'host code'} accessed device memory at 0x{addr:x} on "
                f"openreg:{device}, which no allocation holds (freed, or never allocated).\n")
    where = "inside" if addr - alloc.ptr < alloc.size else "past the end of"
    if kernel:
        why = ("which its launch did not name (OPENREG_MEMCHECK)" if memcheck.enabled else
               "and the host could not provide memory behind it (is the shared-memory file system full?)")
        report = (
            f"openreg: a kernel accessed device memory at 0x{addr:x}, offset {addr - alloc.ptr} {where} "
            f"allocation 0x{alloc.ptr:x} of {alloc.size} bytes on openreg:{alloc.device}, {why}.\n"
        )
    else:
        report = (
            f"openreg: host code accessed device memory at 0x{addr:x}, offset {addr - alloc.ptr} "
            f"{where} allocation 0x{alloc.ptr:x} of {alloc.size} bytes on openreg:{alloc.device}. "
            "Device memory is only accessible inside kernels and copies: copy the tensor to the "
            "host first (e.g. tensor.cpu()).\n"
        )
    for annotate in _annotators:  # what a client knows of that memory (which tensor block, allocated where)
        try:
            report += annotate(addr) or ""
        except Exception as exc:  # noqa: BLE001 - the report must get out whatever a client's annotator does
            report += f"openreg: fault annotator {annotate!r} failed: {exc!r}\n"
    return report


def add_annotator(fn: Callable[[int], str | None]) -> None:
    """Add ``fn(addr)``'s text to the report of a host access at ``addr`` (e.g. a caching allocator naming the
    block it carved there and the stack that allocated it). It runs inside the signal handler: it must only
    read what it already has."""
    if fn not in _annotators:
        _annotators.append(fn)


def _on_fault(signum: int, info: int, context: int) -> None:
    addr = platform.fault_address(info)
    message = describe(addr)
    kernel = activity.running.kernel  # a fault inside a kernel names the operator, wherever the access went
    if kernel is not None:
        message = (message or f"openreg: a native fault (signal {signum}) at 0x{addr:x}, outside device memory.\n")
        message += f"openreg: the fault happened inside kernel {kernel[0]} on openreg:{kernel[1]} stream {kernel[2]}.\n"
    if message:
        os.write(2, message.encode())
    libc.sigaction(signum, ctypes.byref(_previous[signum]), None)  # re-fault into the old handler
# LITERALINCLUDE END: RUNTIME FAULT


_callback = platform.FAULT_HANDLER(_on_fault)


def install() -> None:
    """Install the reporter once per process (idempotent); on a system without a known signal ABI, nothing."""
    global _installed
    with _install_lock:
        if _installed or platform.SigAction is None:
            return
        action = platform.SigAction()
        action.handler = ctypes.cast(_callback, ctypes.c_void_p).value
        action.flags = platform.SA_FLAGS
        for sig in platform.FAULT_SIGNALS:
            if libc.sigaction(sig, ctypes.byref(action), ctypes.byref(_previous[sig])) != 0:
                return
        _installed = True
