"""Report host accesses to device memory: a SIGSEGV handler that names the allocation hit.

Device memory is mapped ``PROT_NONE`` outside kernels, so a stray host read or
write faults at once. This handler (installed with the first device
allocation) looks the faulting address up among live allocations, prints what
was hit, then restores the previous handler and returns: the access faults
again and the process ends the ordinary way (with faulthandler's traceback when
it is enabled). Faults elsewhere go straight to the previous handler.
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
from collections.abc import Callable

from . import memory
from ._libc import libc

_SA_SIGINFO = 0x4
_SA_ONSTACK = 0x08000000
_SI_ADDR_OFFSET = 16  # offsetof(siginfo_t, si_addr) on 64-bit Linux


class _SigAction(ctypes.Structure):
    _fields_ = [
        ("handler", ctypes.c_void_p),
        ("mask", ctypes.c_ulong * 16),
        ("flags", ctypes.c_int),
        ("restorer", ctypes.c_void_p),
    ]


_HANDLER_T = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
libc.sigaction.argtypes = [ctypes.c_int, ctypes.POINTER(_SigAction), ctypes.POINTER(_SigAction)]
_previous = _SigAction()
_annotators: list[Callable[[int], str | None]] = []
_installed = False
_install_lock = threading.Lock()


# LITERALINCLUDE START: RUNTIME FAULT
def describe(addr: int) -> str | None:
    """The report for a host access at ``addr``, or None if it is not device memory."""
    alloc = memory.find(addr, mapped=True)  # the page padding past the end is protected too
    if alloc is None or alloc.kind != memory.DEVICE:
        return None
    where = "inside" if addr - alloc.ptr < alloc.size else "past the end of"
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
    block it carved there and the stack that allocated it). It runs inside the SIGSEGV handler: it must only
    read what it already has."""
    if fn not in _annotators:
        _annotators.append(fn)


def _on_segv(signum: int, info: int, context: int) -> None:
    addr = ctypes.c_void_p.from_address(info + _SI_ADDR_OFFSET).value or 0
    message = describe(addr)
    if message:
        os.write(2, message.encode())
    libc.sigaction(signal.SIGSEGV, ctypes.byref(_previous), None)  # re-fault into the old handler
# LITERALINCLUDE END: RUNTIME FAULT


_callback = _HANDLER_T(_on_segv)


def install() -> None:
    """Install the reporter once per process (idempotent)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        action = _SigAction()
        action.handler = ctypes.cast(_callback, ctypes.c_void_p).value
        action.flags = _SA_SIGINFO | _SA_ONSTACK
        if libc.sigaction(signal.SIGSEGV, ctypes.byref(action), ctypes.byref(_previous)) == 0:
            _installed = True
