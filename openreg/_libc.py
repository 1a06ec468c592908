"""The few libc calls the simulator needs (mmap, mprotect, munmap), through ctypes."""

from __future__ import annotations

import ctypes
import mmap
import os

_libc = ctypes.CDLL(None, use_errno=True)

_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mprotect.restype = ctypes.c_int
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

PAGE = mmap.PAGESIZE
PROT_NONE = mmap.PROT_NONE if hasattr(mmap, "PROT_NONE") else 0
PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
_MAP_FAILED = ctypes.c_void_p(-1).value


def round_up(size: int) -> int:
    """Round a byte count up to whole pages."""
    return (size + PAGE - 1) // PAGE * PAGE


def map_pages(size: int, prot: int, fd: int = -1) -> int | None:
    """Map ``size`` bytes: fresh anonymous memory, or the shared file ``fd``; None if the OS refuses."""
    if fd < 0:
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE
    else:
        flags = mmap.MAP_SHARED | _MAP_NORESERVE
    addr = _libc.mmap(None, size, prot, flags, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        return None
    return addr


def unmap_pages(addr: int, size: int) -> None:
    """Give pages back to the OS."""
    if _libc.munmap(addr, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"munmap(0x{addr:x}, {size}): {os.strerror(err)}")


def protect(addr: int, size: int, prot: int) -> None:
    """Change what the host may do with pages (``PROT_NONE`` or ``PROT_RW``)."""
    if _libc.mprotect(addr, size, prot) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mprotect(0x{addr:x}, {size}): {os.strerror(err)}")
