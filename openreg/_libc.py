"""The few libc calls the simulator needs (mmap, mprotect, munmap, madvise, mincore, pread), through ctypes."""

from __future__ import annotations

import ctypes
import mmap
import os

libc = ctypes.CDLL(None, use_errno=True)  # the process's libc, one handle for the runtime (fault.py uses it too)

libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.restype = ctypes.c_int
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.mprotect.restype = ctypes.c_int
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.pread.restype = ctypes.c_ssize_t  # the copy engine's reads into host memory it is given by address
libc.pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]

PAGE = mmap.PAGESIZE
PROT_NONE = mmap.PROT_NONE if hasattr(mmap, "PROT_NONE") else 0
PROT_RW = mmap.PROT_READ | mmap.PROT_WRITE
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
_MAP_FIXED = 0x10
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
    addr = libc.mmap(None, size, prot, flags, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        return None
    return addr


def unmap_pages(addr: int, size: int) -> None:
    """Give pages back to the OS."""
    if libc.munmap(addr, size) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"munmap(0x{addr:x}, {size}): {os.strerror(err)}")


def protect(addr: int, size: int, prot: int) -> None:
    """Change what the host may do with pages (``PROT_NONE`` or ``PROT_RW``)."""
    if libc.mprotect(addr, size, prot) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mprotect(0x{addr:x}, {size}): {os.strerror(err)}")


# LITERALINCLUDE START: DEVICE PAGES
HUGE = 2 << 20  # a transparent huge page: mprotect changes one entry for it instead of 512
_MADV_DONTFORK = 10
_MADV_HUGEPAGE = 14
libc.madvise.restype = ctypes.c_int
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
libc.mincore.restype = ctypes.c_int
libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def map_device(size: int) -> int | None:
    """Private anonymous ``PROT_NONE`` pages for device memory; None if the OS refuses.

    Opening and closing pages costs ``mprotect`` time in proportion to the page-table entries it
    changes: a mapping of 2 MiB or more starts on a 2 MiB boundary and asks for transparent huge
    pages, so a large tensor's pages change as a few entries (8 MiB: 8 us against 210 us). Forked
    children do not inherit it (``MADV_DONTFORK``): device memory is not theirs to use, and sharing it
    copy-on-write would make every later write by the parent copy pages.
    """
    if size < HUGE:
        addr = map_pages(size, PROT_NONE)
    else:
        raw = map_pages(size + HUGE, PROT_NONE)
        if raw is None:
            return None
        addr = (raw + HUGE - 1) & ~(HUGE - 1)
        if addr > raw:
            unmap_pages(raw, addr - raw)
        unmap_pages(addr + size, raw + HUGE - addr)
        libc.madvise(addr, size, _MADV_HUGEPAGE)  # advice: a kernel without THP simply ignores it
    if addr is not None:
        libc.madvise(addr, size, _MADV_DONTFORK)
    return addr


def remap_shared(addr: int, size: int, fd: int) -> None:
    """Replace the pages at ``addr`` by the shared file ``fd`` (``PROT_NONE``), at the same address."""
    got = libc.mmap(addr, size, PROT_NONE, mmap.MAP_SHARED | _MAP_NORESERVE | _MAP_FIXED, fd, 0)
    if got != addr:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap(0x{addr:x}, {size}, MAP_FIXED): {os.strerror(err)}")


def resident(addr: int, size: int) -> list[tuple[int, int]]:
    """The ranges of pages at ``addr`` that hold data (the rest were never written: they read as zeros)."""
    pages = size // PAGE
    vec = ctypes.create_string_buffer(pages)
    if libc.mincore(addr, size, vec) != 0:
        return [(addr, addr + size)]  # cannot tell: all of it
    ranges: list[tuple[int, int]] = []
    for i, flags in enumerate(vec.raw):
        if flags & 1:
            lo = addr + i * PAGE
            if ranges and ranges[-1][1] == lo:
                ranges[-1] = (ranges[-1][0], lo + PAGE)
            else:
                ranges.append((lo, lo + PAGE))
    return ranges
# LITERALINCLUDE END: DEVICE PAGES
