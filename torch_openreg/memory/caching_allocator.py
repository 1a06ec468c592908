"""The caching device allocator: PyTorch-side memory policy for openreg devices.

Like CUDA's caching allocator, it asks the driver (``openreg.malloc``) for
large *segments* and carves tensors out of them as *blocks*; freed blocks go
back to a pool and are reused without a driver call. ``empty_cache`` returns
wholly free segments to the driver.

* Pools: requests up to 1 MiB come from the small pool (2 MiB segments), larger
  ones from the large pool (segments of the request rounded up to 2 MiB: unlike
  CUDA's 20 MiB segments, which save driver calls that cost milliseconds, this keeps
  peak reserved memory near peak allocated; an openreg driver call costs microseconds).
  Sizes round up to 512 bytes; a block larger than needed is split. Before the large pool
  grows, wholly free large segments too small for the request go back to the driver.
* Streams: a block belongs to the stream that was current when it was
  allocated and is only reused on that stream, so work still queued there
  finishes before the memory is handed out again. ``record_stream`` marks
  other streams that use it; such a block waits for events on those streams
  before it returns to its pool.
* Out of memory: when the driver (or the per-process fraction) refuses, the
  allocator waits for pending frees, releases its cache and retries once, then
  raises OUT_OF_MEMORY with CUDA's account of where the memory is.
"""

from __future__ import annotations

import bisect
import threading

import openreg
from openreg import ErrorCode, OpenRegError

from .stats import LARGE, SMALL, Stats

KB, MB = 1 << 10, 1 << 20
ROUND = 512
SMALL_SIZE = 1 * MB
SMALL_SEGMENT = 2 * MB
OVERSIZE = 20 * MB  # large-pool segments above this count as oversize_segments
LARGE_ROUND = 2 * MB


def format_size(n: int) -> str:
    """Human-readable byte count, as in CUDA's messages."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", MB), ("KiB", KB)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


class Block:
    """A piece of a segment: allocated, free in a pool, or waiting for other streams."""

    __slots__ = ("ptr", "size", "requested", "stream", "pool", "prev", "next", "allocated", "streams", "split_counted")

    def __init__(self, ptr: int, size: int, stream: openreg.Stream, pool: int) -> None:
        self.ptr, self.size, self.stream, self.pool = ptr, size, stream, pool
        self.requested = 0
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.streams: set[openreg.Stream] = set()
        self.split_counted = False

    @property
    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class DeviceCachingAllocator:
    """The caching allocator of one device."""

    def __init__(self, device: int) -> None:
        self.device = device
        self.lock = threading.RLock()
        self.stats = Stats()
        self.free_lists: dict[tuple[int, openreg.Stream], list[tuple[int, int]]] = {}
        self.free_blocks: dict[int, Block] = {}
        self.active: dict[int, Block] = {}
        self.segments: dict[int, Block] = {}  # segment base -> its first block
        self.pending: list[tuple[list[openreg.Event], Block]] = []
        self.fraction: float | None = None

    # LITERALINCLUDE START: CACHING MALLOC
    def malloc(self, size: int, stream: openreg.Stream) -> int:
        """A block of at least ``size`` bytes for use on ``stream``."""
        with self.lock:
            self._process_pending()
            rounded = max(ROUND, (size + ROUND - 1) // ROUND * ROUND)
            pool = SMALL if rounded <= SMALL_SIZE else LARGE
            block = self._take_free(pool, stream, rounded)
            if block is None:
                block = self._new_segment(pool, stream, rounded, size)
            if block.size - rounded >= (ROUND if pool == SMALL else SMALL_SIZE + 1):
                self._split(block, rounded)
            block.allocated, block.requested = True, size
            self.active[block.ptr] = block
            _owners[block.ptr] = self
            self.stats.on_malloc(pool, block.size, size)
            return block.ptr

    def free(self, ptr: int) -> None:
        """Return a block to its pool (after other streams that used it are done)."""
        with self.lock:
            block = self.active.pop(ptr)
            del _owners[ptr]
            block.allocated = False
            self.stats.on_free(block.pool, block.size, block.requested)
            if block.streams:
                events = []
                for stream in block.streams:
                    event = openreg.Event()
                    event.record(stream)
                    events.append(event)
                block.streams = set()
                self.pending.append((events, block))
            else:
                self._release(block)
    # LITERALINCLUDE END: CACHING MALLOC

    def record_stream(self, ptr: int, stream: openreg.Stream) -> None:
        """Note that ``stream`` uses the block at ``ptr`` (``Tensor.record_stream``)."""
        with self.lock:
            block = self.active.get(ptr)
            if block is not None and stream is not block.stream:
                block.streams.add(stream)

    def empty_cache(self) -> None:
        """Give every wholly free segment back to the driver."""
        with self.lock:
            self._process_pending()
            for head in list(self.segments.values()):
                if head.next is None and not head.allocated and head.ptr in self.free_blocks:
                    self._release_segment(head)

    def _release_segment(self, head: Block) -> None:
        """Give a wholly free segment (its only block, ``head``, free in its pool) back to the driver."""
        self._remove_free(head)
        del self.segments[head.ptr]
        openreg.free(head.ptr)
        self.stats.counters["num_device_free"] += 1
        self.stats.update(head.pool, ("segment", -1), ("reserved_bytes", -head.size))
        if head.pool == LARGE and head.size > OVERSIZE:
            self.stats.oversize_segments.add(-1)

    # -- pools ------------------------------------------------------------------------------------
    def _take_free(self, pool: int, stream: openreg.Stream, size: int) -> Block | None:
        entries = self.free_lists.get((pool, stream))
        if not entries:
            return None
        i = bisect.bisect_left(entries, (size, 0))
        if i == len(entries):
            return None
        block = self.free_blocks[entries[i][1]]
        self._remove_free(block)
        return block

    def _insert_free(self, block: Block) -> None:
        bisect.insort(self.free_lists.setdefault((block.pool, block.stream), []), (block.size, block.ptr))
        self.free_blocks[block.ptr] = block
        if block.is_split:
            block.split_counted = True
            self.stats.move("inactive_split", "inactive_split_bytes", block.pool, 1, block.size)

    def _remove_free(self, block: Block) -> None:
        entries = self.free_lists[(block.pool, block.stream)]
        del entries[bisect.bisect_left(entries, (block.size, block.ptr))]
        del self.free_blocks[block.ptr]
        if block.split_counted:
            block.split_counted = False
            self.stats.move("inactive_split", "inactive_split_bytes", block.pool, -1, -block.size)

    def _split(self, block: Block, size: int) -> None:
        rest = Block(block.ptr + size, block.size - size, block.stream, block.pool)
        rest.prev, rest.next = block, block.next
        if block.next is not None:
            block.next.prev = rest
        block.next, block.size = rest, size
        self._insert_free(rest)

    def _release(self, block: Block) -> None:
        """A block nobody uses any more: merge it with free neighbours and pool it."""
        self.stats.move("active", "active_bytes", block.pool, -1, -block.size)
        for neighbour in (block.prev, block.next):
            if neighbour is not None and neighbour.ptr in self.free_blocks:
                self._remove_free(neighbour)
                first, second = (neighbour, block) if neighbour is block.prev else (block, neighbour)
                first.size += second.size
                first.next = second.next
                if second.next is not None:
                    second.next.prev = first
                if block is second:
                    block = first
        self._insert_free(block)

    def _process_pending(self) -> None:
        if self.pending:
            still = []
            for events, block in self.pending:
                if all(e.query() for e in events):
                    self._release(block)
                else:
                    still.append((events, block))
            self.pending = still

    # -- segments and out of memory ---------------------------------------------------------------
    # LITERALINCLUDE START: CACHING OOM
    def _new_segment(self, pool: int, stream: openreg.Stream, rounded: int, requested: int) -> Block:
        if pool == SMALL:
            size = SMALL_SEGMENT
        else:
            size = (rounded + LARGE_ROUND - 1) // LARGE_ROUND * LARGE_ROUND
            self._release_unfit(stream, size)
        try:
            ptr = self._driver_malloc(size)
        except OpenRegError as first:
            if first.code != ErrorCode.OUT_OF_MEMORY:
                raise
            self.stats.counters["num_alloc_retries"] += 1
            self._free_everything_cached()
            try:
                ptr = self._driver_malloc(size)
            except OpenRegError as second:
                if second.code != ErrorCode.OUT_OF_MEMORY:
                    raise
                self.stats.counters["num_ooms"] += 1
                raise OpenRegError(ErrorCode.OUT_OF_MEMORY, self._oom_message(requested, size)) from None
        self.stats.counters["num_device_alloc"] += 1
        self.stats.update(pool, ("segment", 1), ("reserved_bytes", size))
        if pool == LARGE and size > OVERSIZE:
            self.stats.oversize_segments.add(1)
        head = Block(ptr, size, stream, pool)
        self.segments[ptr] = head
        return head

    # LITERALINCLUDE START: RELEASE UNFIT
    def _release_unfit(self, stream: openreg.Stream, size: int) -> None:
        """Before growing the large pool by ``size``, give back wholly free large segments of this
        stream that are too small for the request, up to ``size`` bytes.

        They could not serve it, and keeping them while adding a segment is what makes peak reserved
        memory outgrow peak allocated memory (training steps alternate between activation sizes). A
        driver call costs microseconds, so returning them early is cheap.
        """
        freed = 0
        for _, ptr in list(self.free_lists.get((LARGE, stream), ())):
            head = self.free_blocks[ptr]
            if freed >= size:
                break
            if head.prev is None and head.next is None and head.ptr in self.segments:
                self._release_segment(head)
                freed += head.size
    # LITERALINCLUDE END: RELEASE UNFIT

    def _driver_malloc(self, size: int) -> int:
        if self.fraction is not None:
            limit = int(self.fraction * openreg.device_capacity(self.device))
            reserved = self.stats.arrays["reserved_bytes"][0].current
            if reserved + size > limit:
                raise OpenRegError(ErrorCode.OUT_OF_MEMORY, "over the per-process memory fraction")
        return openreg.malloc(size, self.device)

    def _free_everything_cached(self) -> None:
        """Wait for the device's work and for blocks held back by other streams, then release all free
        segments. The runtime releases a segment only once no queued work names it (frees are
        stream-ordered), so without the wait the retry would find the memory still taken."""
        openreg.stream.drain(self.device)
        if self.pending:
            self.stats.counters["num_sync_all_streams"] += 1
            for events, _ in self.pending:
                for event in events:
                    event.synchronize()
        self.empty_cache()

    def _oom_message(self, requested: int, segment: int) -> str:
        free, total = openreg.mem_get_info(self.device)
        allocated = self.stats.arrays["allocated_bytes"][0].current
        reserved = self.stats.arrays["reserved_bytes"][0].current
        message = (
            f"OpenReg out of memory on openreg:{self.device}. Tried to allocate {format_size(requested)} "
            f"(a new {format_size(segment)} segment). Device {self.device} has a total capacity of "
            f"{format_size(total)} of which {format_size(free)} is free. Of the allocated memory "
            f"{format_size(allocated)} is allocated by PyTorch, and {format_size(reserved - allocated)} "
            "is reserved by PyTorch but unallocated."
        )
        if self.fraction is not None:
            limit = int(self.fraction * total)
            message += f" The per-process memory fraction {self.fraction} limits this process to {format_size(limit)}."
        return message
    # LITERALINCLUDE END: CACHING OOM

    # -- introspection ----------------------------------------------------------------------------
    def snapshot(self) -> list[dict]:
        """Segments and their blocks, shaped like ``torch.cuda.memory_snapshot()``."""
        pending = {block.ptr for _, block in self.pending}
        segments = []
        with self.lock:
            for base, head in sorted(self.segments.items()):
                blocks, block = [], head
                while block is not None:
                    if block.allocated:
                        state = "active_allocated"
                    elif block.ptr in pending:
                        state = "active_pending_free"
                    else:
                        state = "inactive"
                    blocks.append({"address": block.ptr, "size": block.size, "requested_size": block.requested,
                                   "state": state})
                    block = block.next
                segments.append({
                    "device": self.device,
                    "address": base,
                    "total_size": sum(b["size"] for b in blocks),
                    "allocated_size": sum(b["size"] for b in blocks if b["state"] == "active_allocated"),
                    "active_size": sum(b["size"] for b in blocks if b["state"] != "inactive"),
                    "requested_size": sum(b["requested_size"] for b in blocks if b["state"] == "active_allocated"),
                    "stream": head.stream.id,
                    "segment_type": "small" if head.pool == SMALL else "large",
                    "blocks": blocks,
                })
        return segments


_allocators: list[DeviceCachingAllocator] = [DeviceCachingAllocator(i) for i in range(openreg.device_count())]


def allocator(device: int) -> DeviceCachingAllocator:
    """The caching allocator of ``device``."""
    return _allocators[openreg.device.check_device(device)]


_owners: dict[int, DeviceCachingAllocator] = {}  # block pointer -> the allocator that handed it out


def owner(ptr: int) -> DeviceCachingAllocator:
    """The allocator that handed out the block at ``ptr``."""
    found = _owners.get(ptr)
    return found if found is not None else _allocators[openreg.pointer_attributes(ptr).device]
