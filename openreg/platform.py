"""The operating-system calls of the runtime, in one module: a shared-memory object mapped twice, page
protection, the fault signals' ABI and the page size.

POSIX only. Linux is what this project tests: there the object is a ``memfd_create`` file, or with
``OPENREG_PORTABLE_SHM=1`` the code path other POSIX systems take (``shm_open``, unlinked at once; an
unlinked temporary file where ``shm_open`` is missing). The protection granule is the OS page size, or
``OPENREG_PROTECTION_GRANULE`` (a multiple of it: 16 KiB is Apple silicon's page). What a Windows port
needs instead is in docs/runtime.md ("Porting").
"""

from __future__ import annotations

import ctypes
import mmap
import os
import secrets
import signal
import sys
import tempfile

from . import settings
from .errors import ErrorCode, OpenRegError

libc = ctypes.CDLL(None, use_errno=True)  # the process's libc, one handle for the runtime

libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.restype = ctypes.c_int
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mprotect.restype = ctypes.c_int
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.madvise.restype = ctypes.c_int
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

LINUX = sys.platform.startswith("linux")
PAGE = mmap.PAGESIZE  # the OS page size: 4 KiB on x86-64 Linux, 16 KiB on Apple silicon; never assumed
PROT_NONE = getattr(mmap, "PROT_NONE", 0)
PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0)
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_FIXED = getattr(mmap, "MAP_FIXED", 0x10)  # 0x10 on Linux, macOS and the BSDs
_MADV_DONTFORK = 10  # Linux
_FALLOC_PUNCH_HOLE = 0x1 | 0x2  # Linux: FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE


def _granule() -> int:
    granule = settings.PROTECTION_GRANULE or PAGE
    if granule % PAGE or granule & (granule - 1):
        raise OpenRegError(ErrorCode.INVALID_VALUE, f"OPENREG_PROTECTION_GRANULE={granule} is not a power-of-two "
                           f"multiple of the page size ({PAGE})")
    return granule


GRANULE = _granule()  # what allocations are rounded to and protected by
MEMFD = LINUX and not settings.PORTABLE_SHM and hasattr(os, "memfd_create")


def round_up(size: int) -> int:
    """Round a byte count up to whole protection granules."""
    return (size + GRANULE - 1) // GRANULE * GRANULE


# LITERALINCLUDE START: SHARED OBJECT
def create_shared(name: str, size: int) -> int:
    """A new shared-memory object of ``size`` bytes (reading as zeros, taking memory only where written);
    its descriptor (close-on-exec). Nothing names it in the file system: only the descriptor reaches it."""
    if MEMFD:
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
    else:
        fd = _posix_object(name)
    try:
        os.ftruncate(fd, size)
    except OSError:
        os.close(fd)
        raise
    return fd


def _posix_object(name: str) -> int:
    """``shm_open`` of a fresh name, unlinked at once (macOS and the BSDs); an unlinked temporary file
    where POSIX shared memory is missing. (macOS limits the name to 31 characters.)"""
    try:
        import _posixshmem  # the C module behind multiprocessing.shared_memory
    except ImportError:
        _posixshmem = None
    if _posixshmem is not None:
        path = f"/{name}.{os.getpid()}.{secrets.token_hex(4)}"
        try:
            fd = _posixshmem.shm_open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            pass
        else:
            _posixshmem.shm_unlink(path)
            os.set_inheritable(fd, False)
            return fd
    fd, path = tempfile.mkstemp(prefix=name)
    os.unlink(path)
    return fd


def map_twice(fd: int, size: int, offset: int = 0) -> tuple[int, int] | None:
    """Map ``size`` bytes of the object ``fd`` from ``offset`` twice: ``(device range, view)``. The device
    range is ``PROT_NONE``, the view read/write; both are the same memory. None if the OS refuses."""
    device = _map(size, PROT_NONE, mmap.MAP_SHARED | _MAP_NORESERVE, fd, offset)
    if device is None:
        return None
    view = _map(size, PROT_RW, mmap.MAP_SHARED | _MAP_NORESERVE, fd, offset)
    if view is None:
        unmap(device, size)
        return None
    if LINUX:  # forked children inherit neither (their device memory is not theirs; see device.forked)
        libc.madvise(device, size, _MADV_DONTFORK)
        libc.madvise(view, size, _MADV_DONTFORK)
    return device, view
# LITERALINCLUDE END: SHARED OBJECT


def map_host(size: int) -> int | None:
    """Fresh read/write anonymous memory (pinned host memory); None if the OS refuses."""
    return _map(size, PROT_RW, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)


def _map(size: int, prot: int, flags: int, fd: int, offset: int) -> int | None:
    """mmap, on a granule boundary (the OS only promises its page: a larger granule reserves room to align)."""
    if GRANULE == PAGE:
        addr = libc.mmap(None, size, prot, flags, fd, offset)
        return None if addr is None or addr == _MAP_FAILED else addr
    raw = libc.mmap(None, size + GRANULE, PROT_NONE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
    if raw is None or raw == _MAP_FAILED:
        return None
    addr = (raw + GRANULE - 1) & ~(GRANULE - 1)
    got = libc.mmap(addr, size, prot, flags | _MAP_FIXED, fd, offset)  # replaces that part of the reservation
    if got != addr:
        unmap(raw, size + GRANULE)
        return None
    if addr > raw:
        unmap(raw, addr - raw)
    if raw + GRANULE > addr:
        unmap(addr + size, raw + GRANULE - addr)
    return addr


def unmap(addr: int, size: int) -> None:
    """Give an address range back to the OS."""
    if libc.munmap(addr, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"munmap(0x{addr:x}, {size}): {os.strerror(err)}")


def protect(addr: int, size: int, prot: int) -> None:
    """Change what the host may do with pages (``PROT_NONE`` or ``PROT_RW``)."""
    if libc.mprotect(addr, size, prot) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mprotect(0x{addr:x}, {size}): {os.strerror(err)}")


_fallocate = getattr(libc, "fallocate", None) if LINUX else None
if _fallocate is not None:
    _fallocate.restype = ctypes.c_int
    _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def release_pages(fd: int, offset: int, size: int) -> None:
    """Give the memory behind ``size`` bytes of the object at ``offset`` back to the OS (they read as zeros
    again): a punched hole on Linux (memfd, POSIX shared memory and temporary files alike). Elsewhere the
    pages stay until the range is allocated and written again (documented in docs/memory.md)."""
    if _fallocate is not None:
        _fallocate(fd, _FALLOC_PUNCH_HOLE, offset, size)


# LITERALINCLUDE START: FAULT ABI
# The fault reporter's ABI: struct sigaction and where siginfo_t keeps the faulting address. Linux
# (x86-64 and aarch64 glibc) is what runs here; macOS's layout is written from its headers, untested.
if LINUX:
    class SigAction(ctypes.Structure):
        _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_ulong * 16), ("flags", ctypes.c_int),
                    ("restorer", ctypes.c_void_p)]

    SA_FLAGS = 0x4 | 0x08000000  # SA_SIGINFO | SA_ONSTACK
    SI_ADDR_OFFSET = 16  # si_signo, si_errno, si_code, padding: then the union, si_addr first
elif sys.platform == "darwin":
    class SigAction(ctypes.Structure):  # type: ignore[no-redef]
        _fields_ = [("handler", ctypes.c_void_p), ("mask", ctypes.c_uint32), ("flags", ctypes.c_int)]

    SA_FLAGS = 0x40 | 0x1  # SA_SIGINFO | SA_ONSTACK
    SI_ADDR_OFFSET = 24  # si_signo, si_errno, si_code, si_pid, si_uid, si_status, then si_addr
else:
    SigAction = None  # type: ignore[assignment,misc]  # no reporter: faults end the process unexplained
    SA_FLAGS = SI_ADDR_OFFSET = 0
# SIGSEGV on Linux; macOS reports some protection faults as SIGBUS.
FAULT_SIGNALS = (signal.SIGSEGV, signal.SIGBUS)
FAULT_HANDLER = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
if SigAction is not None:
    libc.sigaction.argtypes = [ctypes.c_int, ctypes.POINTER(SigAction), ctypes.POINTER(SigAction)]


def fault_address(info: int) -> int:
    """The faulting address in the ``siginfo_t`` at ``info``."""
    return ctypes.c_void_p.from_address(info + SI_ADDR_OFFSET).value or 0
# LITERALINCLUDE END: FAULT ABI
