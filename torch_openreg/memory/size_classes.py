"""The caching allocator's size classes: how a request is rounded, which pool serves it, how big a
segment the pool asks the driver for, and when a block is split.

The figures and rules are those of CUDA's caching allocator (``c10/cuda/CUDACachingAllocator.cpp``:
``kMinBlockSize``, ``kSmallSize``, ``kSmallBuffer``, ``kLargeBuffer``, ``kMinLargeAlloc``,
``kRoundLarge``, ``round_size``, ``get_allocation_size``, ``should_split``), so that
``memory_allocated()``, ``memory_reserved()`` and their peaks read the same figures as on a GPU for the
same program: memory estimators and ``torch.cuda``-style memory tests compare them.
"""

from __future__ import annotations

KB, MB = 1 << 10, 1 << 20

# LITERALINCLUDE START: SIZE CLASSES
MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to a multiple of this
SMALL_SIZE = 1 * MB  # kSmallSize: requests up to this come from the small pool
SMALL_SEGMENT = 2 * MB  # kSmallBuffer: the small pool's segments
LARGE_SEGMENT = 20 * MB  # kLargeBuffer: the large pool's segments for requests under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MB  # kMinLargeAlloc: from here on a segment is the request itself, rounded
ROUND_LARGE = 2 * MB  # kRoundLarge: the rounding of those segments


def round_size(size: int) -> int:
    """The bytes a request of ``size`` takes (``round_size``): ``memory_allocated()`` counts this."""
    return MIN_BLOCK if size < MIN_BLOCK else (size + MIN_BLOCK - 1) // MIN_BLOCK * MIN_BLOCK


def is_small(rounded: int) -> bool:
    """Whether a rounded request belongs to the small pool."""
    return rounded <= SMALL_SIZE


def segment_size(rounded: int) -> int:
    """The segment a pool asks the driver for when nothing cached fits (``get_allocation_size``)."""
    if rounded <= SMALL_SIZE:
        return SMALL_SEGMENT
    if rounded < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return (rounded + ROUND_LARGE - 1) // ROUND_LARGE * ROUND_LARGE


def split_threshold(small: bool) -> int:
    """The smallest remainder split off a block (``should_split``): in the small pool any remainder of at
    least one ``MIN_BLOCK``; in the large pool only a remainder over ``SMALL_SIZE``, so that a large
    block never leaves behind a piece that only small requests could use."""
    return MIN_BLOCK if small else SMALL_SIZE + 1
# LITERALINCLUDE END: SIZE CLASSES


def format_size(n: int) -> str:
    """Human-readable byte count, as in CUDA's messages."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MB), ("KiB", KB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"
