"""The caching device allocator: PyTorch-side memory policy for openreg devices.

Like CUDA's caching allocator, it asks the driver (``openreg.malloc``) for
large *segments* and carves tensors out of them as *blocks*; freed blocks go
back to a pool and are reused without a driver call. ``empty_cache`` returns
wholly free segments to the driver.

* Pools: CUDA's size classes (``size_classes.py``): sizes round up to 512 bytes; requests up to 1 MiB
  come from the small pool (2 MiB segments), larger ones from the large pool (20 MiB segments for
  requests under 10 MiB, else the request rounded up to 2 MiB); a block larger than needed is split by
  CUDA's rule. Before the large pool grows, wholly free large segments too small for the request go
  back to the driver (openreg's own rule: a driver call costs microseconds here).
* Streams: a block belongs to the stream that was current when it was
  allocated and is only reused on that stream, so work still queued there
  finishes before the memory is handed out again. ``record_stream`` marks
  other streams that use it; such a block waits for events on those streams
  before it returns to its pool.
* Out of memory: when the driver (or the per-process fraction) refuses, the
  allocator waits for pending frees, releases its cache and retries once, then
  raises OUT_OF_MEMORY with CUDA's account of where the memory is.
* Private pools (CUDA's graph pools and ``MemPool``): allocations routed to a pool
  (those of a graph capture's streams, or of a thread inside ``use_mem_pool``) get
  blocks of its own segments only, and its blocks never serve other allocations. A
  pool lives while a graph or ``MemPool`` uses it; then its segments go back to the
  driver as soon as they are wholly free.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, insort
from collections.abc import Callable

import openreg
from openreg import ErrorCode, OpenRegError, hooks

from .history import History
from .size_classes import MIN_BLOCK, SMALL_SIZE, format_size, segment_size, split_threshold
from .stats import LARGE, SMALL, Stats

__all__ = ["DeviceCachingAllocator", "allocator", "format_size", "owner"]


class Block:
    """A piece of a segment: allocated, free in a pool, or waiting for other streams."""

    __slots__ = ("ptr", "size", "requested", "stream", "pool", "prev", "next", "allocated", "streams", "frames")

    def __init__(self, ptr: int, size: int, stream: openreg.Stream | None, pool: int) -> None:
        self.ptr, self.size, self.stream, self.pool = ptr, size, stream, pool
        self.requested = 0
        self.prev: Block | None = None
        self.next: Block | None = None
        self.allocated = False
        self.streams: set[openreg.Stream] | None = None  # other streams using it (record_stream)
        self.frames: list[dict] | None = None  # the allocating stack, while memory history is recorded


# LITERALINCLUDE START: PRIVATE POOL
class PrivatePool:
    """A private memory pool (``MempoolId_t``): segments only the allocations routed to it may use."""

    def __init__(self, pool_id: tuple[int, int], use_on_oom: bool = False, no_split: bool = False) -> None:
        self.id, self.use_on_oom, self.no_split = pool_id, use_on_oom, no_split
        self.use_count = 0  # graphs, MemPool objects and use_mem_pool contexts using it
        self.keys: dict[openreg.Stream, PoolStream] = {}

    def key(self, stream: openreg.Stream) -> PoolStream:
        key = self.keys.get(stream)
        if key is None:
            key = self.keys[stream] = PoolStream(self, stream)
        return key


class PoolStream:
    """What a pool's blocks have where ordinary blocks have their stream (``Block.stream``, the free lists'
    keys): the pool and the stream, so that a pool's blocks are reused on their own stream only, like any."""

    __slots__ = ("pool", "stream", "id")

    def __init__(self, pool: PrivatePool, stream: openreg.Stream) -> None:
        self.pool, self.stream, self.id = pool, stream, stream.id
# LITERALINCLUDE END: PRIVATE POOL


# A free list is sorted by (size, address), as ``size << KEY_SHIFT | ptr``: an int is built and
# compared faster than a tuple.
KEY_SHIFT = 64
PTR_MASK = (1 << KEY_SHIFT) - 1
SMALL_SPLIT, LARGE_SPLIT = split_threshold(True), split_threshold(False)
SPARE_BLOCKS = 64  # Block objects that merging freed, kept for the next split (creating one costs more)


class DeviceCachingAllocator:
    """The caching allocator of one device.

    ``malloc`` and ``free`` run for every tensor, so they are written for speed: the lock is taken
    with ``acquire``/``release`` (cheaper than ``with``: docs/performance.md), free lists are per pool and then per
    stream, and each event updates the statistics in one call.
    """

    def __init__(self, device: int) -> None:
        self.device = device
        # Re-entrant: a garbage collection inside malloc can free a tensor, whose free lands here.
        self.lock = threading.RLock()
        self.stats = Stats()
        # indexed by pool (SMALL, LARGE; 0 unused): stream -> sorted keys of its free blocks
        self.free_lists: tuple[dict[openreg.Stream, list[int]], ...] = ({}, {}, {})
        self.free_blocks: dict[int, Block] = {}
        self.active: dict[int, Block] = {}
        self.segments: dict[int, Block] = {}  # segment base -> its first block
        self.pending: list[tuple[list[openreg.Event], Block]] = []
        self.fraction: float | None = None
        self._spare: list[Block] = []
        self.history: History | None = None  # memory history recording (torch.openreg.memory._record_memory_history)
        self.segment_frames: dict[int, list[dict]] = {}  # segment base -> the stack that created it, while recording
        self.pools: dict[tuple[int, int], PrivatePool] = {}
        self.routes: list[tuple[Callable[[openreg.Stream], bool], PrivatePool]] = []  # newest first
        self.watchers: dict[int, list] = {}  # block pointer -> who wants to know when it is freed (graphs)

    # LITERALINCLUDE START: CACHING MALLOC
    def malloc(self, size: int, stream: openreg.Stream) -> int:
        """A block of at least ``size`` bytes for use on ``stream``."""
        lock = self.lock
        lock.acquire()
        try:
            if self.pending:
                self._process_pending()
            split = True
            if self.routes:  # a graph capture or use_mem_pool is underway: this allocation may belong to a pool
                stream = self._route(stream)
                split = type(stream) is not PoolStream or not stream.pool.no_split
            rounded = (size + MIN_BLOCK - 1) & -MIN_BLOCK  # size_classes.round_size, written out for speed
            if rounded < MIN_BLOCK:
                rounded = MIN_BLOCK
            pool = SMALL if rounded <= SMALL_SIZE else LARGE
            free_blocks = self.free_blocks
            keys = self.free_lists[pool].get(stream)
            i = bisect_left(keys, rounded << KEY_SHIFT) if keys else 0
            taken = 0
            if keys and i < len(keys):  # best fit: the smallest big enough, the lowest address first
                block = free_blocks.pop(keys.pop(i) & PTR_MASK)
                if block.prev is not None or block.next is not None:
                    taken = block.size  # a split block leaves inactive_split
            else:
                try:
                    block = self._new_segment(pool, stream, rounded, size)
                except OpenRegError as error:
                    return self._malloc_on_oom(size, stream, error)
                keys = self._free_keys(pool, stream)
            rest = block.size - rounded
            if split and rest >= (SMALL_SPLIT if pool == SMALL else LARGE_SPLIT):  # the rest becomes a free block
                spare = self._spare
                piece = spare.pop() if spare else Block(0, 0, None, 0)
                piece.ptr = at = block.ptr + rounded
                piece.size, piece.stream, piece.pool, piece.requested = rest, stream, pool, 0
                following = block.next
                piece.prev, piece.next = block, following
                if following is not None:
                    following.prev = piece
                block.next, block.size = piece, rounded
                insort(keys, rest << KEY_SHIFT | at)
                free_blocks[at] = piece
            else:
                rest = 0
            block.allocated, block.requested = True, size
            ptr = block.ptr
            self.active[ptr] = block
            _owners[ptr] = self
            self.stats.on_malloc(pool, block.size, size, taken, rest)
            if self.history is not None:
                self._record_alloc(block)
            if hooks.allocated:  # the stream sanitizer: where the memory was handed out, for its reports
                for hook in hooks.allocated:
                    hook(ptr, size, self.device, stream.id)
            return ptr
        finally:
            lock.release()

    def free(self, ptr: int) -> None:
        """Return a block to its pool (after other streams that used it are done)."""
        lock = self.lock
        lock.acquire()
        try:
            block = self.active.pop(ptr)
            del _owners[ptr]
            block.allocated = False
            if hooks.cached:  # the stream sanitizer: its accesses stay, the next tensor here is checked against them
                for hook in hooks.cached:
                    hook(ptr, block.size, self.device, block.stream.id)
            if self.watchers:
                for watcher in self.watchers.pop(ptr, ()):
                    watcher.freed(ptr, block.size)
            if self.history is not None:
                self._record_free("free_requested", block)
            if block.streams:
                self.stats.on_free(block.pool, block.size, block.requested)
                events = []
                for stream in block.streams:
                    if openreg.is_capturing(stream):
                        continue  # its use is recorded in a graph, ordered there (a capture cannot query events)
                    event = openreg.Event()
                    event.record(stream)
                    events.append(event)
                block.streams = None
                self.pending.append((events, block))
            else:
                if self.history is not None:  # before _release, which may merge the block into a neighbour
                    self._record_free("free_completed", block)
                owner = block.stream
                self._release(block, block.requested)
                if type(owner) is PoolStream and owner.pool.use_count == 0:
                    self._free_pool(owner.pool)  # the last user is gone: its segments go as they become free
        finally:
            lock.release()
    # LITERALINCLUDE END: CACHING MALLOC

    # LITERALINCLUDE START: POOL ROUTING
    def begin_allocate_to_pool(self, pool_id: tuple[int, int], accepts: Callable[[openreg.Stream], bool],
                               **options: bool) -> tuple:
        """Route the allocations on streams ``accepts`` takes to the pool ``pool_id`` (created on first use) until
        :meth:`end_allocate_to_pool`; the route counts as a use of the pool until :meth:`release_pool`."""
        with self.lock:
            pool = self.use_pool(pool_id, **options)
            route = (accepts, pool)
            self.routes.insert(0, route)
            return route

    def end_allocate_to_pool(self, route: tuple) -> None:
        with self.lock:
            self.routes.remove(route)

    def use_pool(self, pool_id: tuple[int, int], **options: bool) -> PrivatePool:
        """Count one more use of the pool ``pool_id``, creating it on first use."""
        with self.lock:
            pool = self.pools.get(pool_id)
            if pool is None:
                pool = self.pools[pool_id] = PrivatePool(pool_id, **options)
            pool.use_count += 1
            return pool

    def release_pool(self, pool_id: tuple[int, int]) -> None:
        """One use of the pool is over; after the last, its segments go back to the driver once wholly free."""
        with self.lock:
            pool = self.pools[pool_id]
            pool.use_count -= 1
            if pool.use_count == 0:
                self._free_pool(pool)

    def _route(self, stream: openreg.Stream | PoolStream) -> openreg.Stream | PoolStream:
        for accepts, pool in self.routes:
            if type(stream) is not PoolStream and accepts(stream):
                return pool.key(stream)
        return stream

    def _free_pool(self, pool: PrivatePool) -> None:
        """Give an unused pool's wholly free segments back; forget the pool once it has none left."""
        left = False
        for head in list(self.segments.values()):
            if type(head.stream) is PoolStream and head.stream.pool is pool:
                if head.next is None and not head.allocated and head.ptr in self.free_blocks:
                    self._release_segment(head)
                else:
                    left = True
        if not left and self.pools.get(pool.id) is pool:
            del self.pools[pool.id]
            for key in pool.keys.values():
                for lists in self.free_lists:
                    if not lists.get(key, True):
                        del lists[key]

    def _malloc_on_oom(self, size: int, stream: openreg.Stream | PoolStream, error: OpenRegError) -> int:
        """Out of memory outside the pools: a ``MemPool(use_on_oom=True)`` serves the allocation if it can."""
        if error.code == ErrorCode.OUT_OF_MEMORY and type(stream) is not PoolStream:
            for pool in list(self.pools.values()):
                if pool.use_on_oom and pool.use_count:
                    try:
                        return self.malloc(size, pool.key(stream))
                    except OpenRegError:
                        continue
        raise error

    def watch(self, ptr: int, watcher: object) -> bool:
        """Call ``watcher.freed(ptr, size)`` when the live block at ``ptr`` is freed; False if none is there."""
        with self.lock:
            if ptr not in self.active:
                return False
            if bridge_exclude is not None:  # its free must come here, to reach the watcher
                bridge_exclude(ptr)
            self.watchers.setdefault(ptr, []).append(watcher)
            return True

    def unwatch(self, ptr: int, watcher: object) -> None:
        with self.lock:
            watchers = self.watchers.get(ptr)
            if watchers and watcher in watchers:
                watchers.remove(watcher)
                if not watchers:
                    del self.watchers[ptr]

    def state_of(self, ptr: int) -> tuple[str, tuple[int, int] | None, int] | None:
        """``("allocated" or "free", the id of its pool or None, its size)`` for the block holding ``ptr``;
        None when no segment of this allocator holds it."""
        with self.lock:
            block = self.active.get(ptr) or self.free_blocks.get(ptr)
            if block is None:
                for head in self.segments.values():
                    if head.ptr <= ptr:
                        block = head
                        while block is not None and not block.ptr <= ptr < block.ptr + block.size:
                            block = block.next
                        if block is not None:
                            break
            if block is None:
                return None
            pool = block.stream.pool.id if type(block.stream) is PoolStream else None
            return ("allocated" if block.allocated else "free", pool, block.size)
    # LITERALINCLUDE END: POOL ROUTING

    # LITERALINCLUDE START: RECORD HISTORY
    def _record_alloc(self, block: Block) -> None:
        history = self.history
        frames = history.frames() if history.state_frames or history.alloc_frames else None
        block.frames = frames if history.state_frames else None
        history.record("alloc", block.ptr, block.size, block.stream.id, frames if history.alloc_frames else None)

    def _record_free(self, action: str, block: Block) -> None:
        history = self.history
        frames = history.frames() if history.free_frames and action == "free_requested" else None
        block.frames = None
        history.record(action, block.ptr, block.size, block.stream.id, frames)

    def _record_segment(self, action: str, head: Block, size: int) -> None:
        history = self.history
        frames = history.frames() if history.alloc_frames and action == "segment_alloc" else None
        if action == "segment_alloc" and history.state_frames:
            self.segment_frames[head.ptr] = frames if frames is not None else history.frames()
        else:
            self.segment_frames.pop(head.ptr, None)
        history.record(action, head.ptr, size, head.stream.id, frames)
    # LITERALINCLUDE END: RECORD HISTORY

    def record_stream(self, ptr: int, stream: openreg.Stream) -> None:
        """Note that ``stream`` uses the block at ``ptr`` (``Tensor.record_stream``)."""
        with self.lock:
            block = self.active.get(ptr)
            home = block.stream.stream if block is not None and type(block.stream) is PoolStream else None
            if block is not None and stream is not (home or block.stream):
                if bridge_exclude is not None:  # its free must come here, to wait for that stream
                    bridge_exclude(ptr)
                if block.streams is None:
                    block.streams = {stream}
                else:
                    block.streams.add(stream)

    def reused(self, ptr: int, count: int) -> None:
        """The bridge's block cache handed the live block at ``ptr`` out again ``count`` times, each time
        freed by its tensor just before: counted as those frees and allocations."""
        with self.lock:
            block = self.active[ptr]
            self.stats.on_reuse(block.pool, block.size, block.requested, count)

    def empty_cache(self) -> None:
        """Give every wholly free segment back to the driver."""
        with self.lock:
            self._process_pending()
            for head in list(self.segments.values()):
                if type(head.stream) is PoolStream and head.stream.pool.use_count:
                    continue  # a pool in use keeps its segments (a graph's replays write there)
                if head.next is None and not head.allocated and head.ptr in self.free_blocks:
                    self._release_segment(head)

    def _release_segment(self, head: Block) -> None:
        """Give a wholly free segment (its only block, ``head``, free in its pool) back to the driver."""
        self._remove_free(head)
        del self.segments[head.ptr]
        openreg.free(head.ptr)
        if self.history is not None:
            self._record_segment("segment_free", head, head.size)
        self.stats.counters["num_device_free"] += 1
        self.stats.update(head.pool, ("segment", -1), ("reserved_bytes", -head.size))

    # -- pools ------------------------------------------------------------------------------------
    # A free block is counted in inactive_split while its segment is split. The hot paths (malloc,
    # _release) edit the free lists in place and tell the statistics once per event.
    def _free_keys(self, pool: int, stream: openreg.Stream) -> list[int]:
        """The sorted free-list keys of ``stream`` in ``pool``, created on first use."""
        lists = self.free_lists[pool]
        keys = lists.get(stream)
        if keys is None:
            keys = lists[stream] = []
        return keys

    def _remove_free(self, block: Block) -> None:
        keys = self.free_lists[block.pool][block.stream]
        del keys[bisect_left(keys, block.size << KEY_SHIFT | block.ptr)]
        del self.free_blocks[block.ptr]

    def _release(self, block: Block, requested: int = -1) -> None:
        """A block nobody uses any more: merge it with free neighbours (of its segment, so of its free
        list) and pool it. The Block objects merged away are kept for the next split. ``requested``
        (its tensor's request), if given, also counts the free: one statistics call instead of two."""
        pool, size = block.pool, block.size
        free_blocks, spare = self.free_blocks, self._spare
        keys = self.free_lists[pool].get(block.stream)
        if keys is None:
            keys = self._free_keys(pool, block.stream)
        merged = merged_bytes = 0
        before = block.prev
        if before is not None and before.ptr in free_blocks:
            del keys[bisect_left(keys, before.size << KEY_SHIFT | before.ptr)]
            del free_blocks[before.ptr]
            merged, merged_bytes = 1, before.size
            before.size += size
            following = before.next = block.next
            if following is not None:
                following.prev = before
            if len(spare) < SPARE_BLOCKS:
                spare.append(block)
            block = before
        after = block.next
        if after is not None and after.ptr in free_blocks:
            del keys[bisect_left(keys, after.size << KEY_SHIFT | after.ptr)]
            del free_blocks[after.ptr]
            merged += 1
            merged_bytes += after.size
            block.size += after.size
            following = block.next = after.next
            if following is not None:
                following.prev = block
            if len(spare) < SPARE_BLOCKS:
                spare.append(after)
        insort(keys, block.size << KEY_SHIFT | block.ptr)
        free_blocks[block.ptr] = block
        split = block.prev is not None or block.next is not None
        self.stats.on_release(pool, size, merged, merged_bytes, block.size if split else 0, requested)

    def _process_pending(self) -> None:
        if self.pending:
            still = []
            for events, block in self.pending:
                if all(e.query() for e in events):
                    if self.history is not None:
                        self._record_free("free_completed", block)
                    owner = block.stream
                    self._release(block)
                    if type(owner) is PoolStream and owner.pool.use_count == 0:
                        self._free_pool(owner.pool)
                else:
                    still.append((events, block))
            self.pending = still
            if not still:
                self.stats.converge()

    # -- segments and out of memory ---------------------------------------------------------------
    # LITERALINCLUDE START: CACHING OOM
    def _new_segment(self, pool: int, stream: openreg.Stream, rounded: int, requested: int) -> Block:
        size = segment_size(rounded)
        if pool == LARGE:
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
                if self.history is not None:
                    self.history.record("oom", 0, requested, stream.id, self.history.frames(),
                                        device_free=openreg.mem_get_info(self.device)[0])
                raise OpenRegError(ErrorCode.OUT_OF_MEMORY, self._oom_message(requested, size)) from None
        self.stats.counters["num_device_alloc"] += 1
        self.stats.update(pool, ("segment", 1), ("reserved_bytes", size))
        head = Block(ptr, size, stream, pool)
        self.segments[ptr] = head
        if self.history is not None:
            self._record_segment("segment_alloc", head, size)
        return head

    def _driver_malloc(self, size: int) -> int:
        if self.fraction is not None:
            limit = int(self.fraction * openreg.device_capacity(self.device))
            reserved = self.stats.current("reserved_bytes")
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
        allocated = self.stats.current("allocated_bytes")
        reserved = self.stats.current("reserved_bytes")
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

    # LITERALINCLUDE START: RELEASE UNFIT
    def _release_unfit(self, stream: openreg.Stream, size: int) -> None:
        """Before growing the large pool by ``size``, give back wholly free large segments of this
        stream that are too small for the request, up to ``size`` bytes.

        They could not serve it, and keeping them while adding a segment is what makes peak reserved
        memory outgrow peak allocated memory (training steps alternate between activation sizes). A
        driver call costs microseconds, so returning them early is cheap.
        """
        freed = 0
        for key in list(self.free_lists[LARGE].get(stream, ())):
            head = self.free_blocks[key & PTR_MASK]
            if freed >= size:
                break
            if head.prev is None and head.next is None and head.ptr in self.segments:
                self._release_segment(head)
                freed += head.size
    # LITERALINCLUDE END: RELEASE UNFIT
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
                                   "state": state, "frames": block.frames or []})
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
                    "segment_pool_id": head.stream.pool.id if type(head.stream) is PoolStream else (0, 0),
                    "is_expandable": False,
                    "frames": self.segment_frames.get(base, []),
                    "blocks": blocks,
                })
        return segments


_allocators: list[DeviceCachingAllocator] = [DeviceCachingAllocator(i) for i in range(openreg.device_count())]


# LITERALINCLUDE START: BRIDGE CACHE HOOKS
# The bridge's block cache (csrc/block_cache.cpp, torch_openreg/memory/block_cache.py) holds freed blocks
# that this allocator still counts as allocated. Whoever looks at an allocator through allocator() sees it
# after the cache has given them back; a block used by another stream or watched is freed here, not held.
bridge_flush: Callable[[int], None] | None = None
bridge_exclude: Callable[[int], None] | None = None


def allocator(device: int) -> DeviceCachingAllocator:
    """The caching allocator of ``device``, up to date (the bridge's block cache flushed)."""
    found = _allocators[openreg.device.check_device(device)]
    if bridge_flush is not None:
        bridge_flush(found.device)
    return found
# LITERALINCLUDE END: BRIDGE CACHE HOOKS


_owners: dict[int, DeviceCachingAllocator] = {}  # block pointer -> the allocator that handed it out


def owner(ptr: int) -> DeviceCachingAllocator:
    """The allocator that handed out the block at ``ptr``."""
    found = _owners.get(ptr)
    return found if found is not None else _allocators[openreg.pointer_attributes(ptr).device]
