"""The caching allocator under a random workload: statistics and snapshot must tell the same story.

The allocator keeps its statistics incrementally, for speed (``torch_openreg/memory/stats.py``: only the
pools' values are stored, ``active`` shares ``allocation``'s objects until a block waits for another
stream, frees are derived). Every statistic is recomputed here from ``memory_snapshot()``-shaped
segments and from the operations performed, after every operation of a random sequence of
allocations, frees, ``record_stream`` calls, cache releases, out-of-memory failures and resets on two
streams. Where the pool holds no block waiting for another stream, the test also predicts which block
an allocation gets (best fit, lowest address first, CUDA's split rule) or which segment it adds.
"""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest

import openreg
from openreg import ErrorCode, OpenRegError
from torch_openreg import _runtime
from torch_openreg.memory import DeviceCachingAllocator
from torch_openreg.memory.stats import ARRAYS

MB = 1 << 20
POOLS = ("small_pool", "large_pool")
# inactive_split can peak inside one operation (a malloc releasing several waiting blocks), between
# two snapshots; every other statistic changes in one direction within an operation
EXACT_PEAKS = [name for name in ARRAYS if not name.startswith("inactive_split")]


def _pool(size: int) -> str:
    return "small_pool" if max(512, (size + 511) // 512 * 512) <= MB else "large_pool"


def _snapshot_stats(segments: list[dict]) -> dict[str, Counter]:
    """The current value of every statistic, per pool, from the segments alone."""
    found = {pool: Counter() for pool in POOLS}
    for segment in segments:
        count = found["small_pool" if segment["segment_type"] == "small" else "large_pool"]
        count["segment"] += 1
        count["reserved_bytes"] += segment["total_size"]
        blocks = segment["blocks"]
        for block in blocks:
            if block["state"] == "active_allocated":
                count["allocation"] += 1
                count["allocated_bytes"] += block["size"]
                count["requested_bytes"] += block["requested_size"]
            if block["state"] != "inactive":
                count["active"] += 1
                count["active_bytes"] += block["size"]
            elif len(blocks) > 1:
                count["inactive_split"] += 1
                count["inactive_split_bytes"] += block["size"]
    return found


def _check_layout(segments: list[dict]) -> None:
    for segment in segments:
        address = segment["address"]
        size = segment["total_size"]
        assert size % (2 * MB) == 0
        assert segment["segment_type"] == "large" or size == 2 * MB
        states = [block["state"] for block in segment["blocks"]]
        for block in segment["blocks"]:
            assert block["address"] == address and block["size"] > 0 and block["size"] % 512 == 0
            address += block["size"]
        assert address == segment["address"] + size, "blocks do not tile their segment"
        assert ("inactive", "inactive") not in zip(states, states[1:]), "free neighbours were not merged"


class Workload:
    """Drives one fresh allocator and keeps what the statistics must add up to."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.al = DeviceCachingAllocator(0)
        self.streams = [openreg.Stream(0), openreg.Stream(0)]
        self.current = 0
        self.gates: dict[int, threading.Event] = {}  # stream index -> event its queued work waits for
        self.live: dict[int, int] = {}  # pointer -> requested size
        self.events = {pool: Counter() for pool in POOLS}  # mallocs, frees and their bytes since the reset
        self.base: dict[tuple[str, str], int] = Counter()  # current value at the last accumulated reset
        self.high: dict[tuple[str, str], int] = Counter()  # highest value seen since the last peak reset
        self.ooms = 0
        self.seen: Counter = Counter()  # block states and situations the workload went through

    # -- operations -------------------------------------------------------------------------------
    def step(self) -> None:
        r = self.rng.random()
        if r < 0.45 or not self.live:
            self.malloc(self._size())
        elif r < 0.80:
            self.free(self.rng.choice(list(self.live)))
        elif r < 0.86:
            self.al.record_stream(self.rng.choice(list(self.live)), self.rng.choice(self.streams))
        elif r < 0.89:
            self.current = 1 - self.current
        elif r < 0.91:
            self.al.empty_cache()
            assert not any(len(s["blocks"]) == 1 and s["blocks"][0]["state"] == "inactive"
                           for s in self.al.snapshot()), "empty_cache kept a wholly free segment"
        elif r < 0.96:
            self.toggle_gate(self.rng.randrange(2))
        elif r < 0.97:
            self.out_of_memory()
        elif r < 0.98:
            self.reset(peak=self.rng.random() < 0.5)
        else:
            for ptr in self.rng.sample(list(self.live), min(len(self.live), self.rng.randint(1, 20))):
                self.free(ptr)

    def _size(self) -> int:
        r = self.rng.random()
        if r < 0.5:
            return self.rng.randint(0, 4096)
        if r < 0.8:
            return self.rng.randint(4096, MB)
        if r < 0.83:
            return MB + self.rng.choice([0, 1, 512])
        if r < 0.97:
            return self.rng.randint(MB, 9 * MB)
        return self.rng.choice([2 * MB, 2 * MB - 1, 10 * MB - 1, 10 * MB, 11 * MB, 21 * MB])

    def malloc(self, size: int) -> None:
        stream = self.streams[self.current]
        before = self.al.snapshot()
        expected = self._predict(before, size, stream)
        ptr = self.al.malloc(size, stream)
        after = self.al.snapshot()
        segment, block = next((s, b) for s in after for b in s["blocks"] if b["address"] == ptr)
        assert block["state"] == "active_allocated" and block["requested_size"] == size
        assert block["size"] >= size and segment["stream"] == stream.id
        assert segment["segment_type"] == _pool(size).replace("_pool", "")
        if expected is not None:
            free_ptr, block_size, segment_size = expected
            assert block["size"] == block_size
            if free_ptr is None:  # a new segment, the block at its start
                assert ptr == segment["address"] and segment["total_size"] == segment_size
            else:
                assert ptr == free_ptr
        self.live[ptr] = size
        count = self.events[_pool(size)]
        count["mallocs"] += 1
        count["requested"] += size
        count["bytes"] += block["size"]

    def _predict(self, segments: list[dict], size: int, stream: openreg.Stream) -> tuple | None:
        """``(pointer, block size, segment size)`` the allocation should get: pointer None for a new
        segment. None when blocks wait for other streams (which of them come back first is timing)."""
        if any(b["state"] == "active_pending_free" for s in segments for b in s["blocks"]):
            return None
        rounded = max(512, (size + 511) // 512 * 512)
        kind = "small" if rounded <= MB else "large"
        fits = sorted((b["size"], b["address"]) for s in segments for b in s["blocks"]
                      if s["stream"] == stream.id and s["segment_type"] == kind and b["state"] == "inactive"
                      and b["size"] >= rounded)
        if kind == "small":
            new_segment = 2 * MB
        else:  # CUDA's kLargeBuffer below kMinLargeAlloc, else the request rounded to kRoundLarge
            new_segment = 20 * MB if rounded < 10 * MB else (rounded + 2 * MB - 1) // (2 * MB) * (2 * MB)
        free_size, ptr = fits[0] if fits else (new_segment, None)
        split = free_size - rounded >= (512 if kind == "small" else MB + 1)
        return ptr, rounded if split else free_size, new_segment

    def free(self, ptr: int) -> None:
        size = self.live.pop(ptr)
        block = next(b for s in self.al.snapshot() for b in s["blocks"] if b["address"] == ptr)
        self.al.free(ptr)
        count = self.events[_pool(size)]
        count["frees"] += 1
        count["requested_freed"] += size
        count["bytes_freed"] += block["size"]

    def toggle_gate(self, index: int) -> None:
        """Hold a stream's queued work back, or let it finish: blocks recorded on it wait meanwhile."""
        if index in self.gates:
            self.gates.pop(index).set()
            self.streams[index].synchronize()
        elif not openreg.LAUNCH_BLOCKING:  # a blocking launch would wait for the gate forever
            gate = self.gates[index] = threading.Event()
            self.streams[index].launch(gate.wait, name="gate")

    def open_gates(self) -> None:
        for index in list(self.gates):
            self.toggle_gate(index)

    def out_of_memory(self) -> None:
        """A request the per-process fraction refuses: an error, and no allocation counted."""
        self.open_gates()  # the retry waits for the device's queued work
        before = self.al.stats.as_dict()
        self.al.fraction = 0.0
        try:
            with pytest.raises(OpenRegError) as caught:
                self.al.malloc(64 * MB, self.streams[self.current])  # bigger than any cached block
        finally:
            self.al.fraction = None
        self.ooms += 1
        assert caught.value.code == ErrorCode.OUT_OF_MEMORY
        assert "out of memory on openreg:0" in str(caught.value) and "memory fraction 0.0" in str(caught.value)
        after = self.al.stats.as_dict()
        assert after["num_ooms"] == before["num_ooms"] + 1
        assert after["num_alloc_retries"] == before["num_alloc_retries"] + 1
        for name in ("allocation", "allocated_bytes", "requested_bytes"):
            assert after[name] == before[name]

    def reset(self, peak: bool) -> None:
        stats = self.al.stats.as_dict()
        if peak:
            self.al.stats.reset_peak()
            self.high = Counter({(n, p): stats[n][p]["current"] for n in ARRAYS for p in ("all", *POOLS)})
        else:
            self.al.stats.reset_accumulated()
            self.base = Counter({(n, p): stats[n][p]["current"] for n in ARRAYS for p in ("all", *POOLS)})
            self.events = {pool: Counter() for pool in POOLS}

    # -- the checks -------------------------------------------------------------------------------
    def check(self) -> None:
        stats, segments = self.al.stats.as_dict(), self.al.snapshot()
        _check_layout(segments)
        self.seen.update(block["state"] for segment in segments for block in segment["blocks"])
        self.seen["split"] += any(len(segment["blocks"]) > 1 for segment in segments)
        self.seen["two streams"] += len({segment["stream"] for segment in segments}) == 2
        found = _snapshot_stats(segments)
        found["all"] = found["small_pool"] + found["large_pool"]
        for name in ARRAYS:
            for pool in ("all", *POOLS):
                s = stats[name][pool]
                key = (name, pool)
                assert s["current"] == found[pool][name], f"{name}.{pool}: {s}, the snapshot says {found[pool][name]}"
                assert s["allocated"] - s["freed"] == s["current"] - self.base[key], key
                self.high[key] = max(self.high[key], s["current"])
                if name in EXACT_PEAKS:
                    assert s["peak"] == self.high[key], f"{name}.{pool}: peak {s['peak']}, seen {self.high[key]}"
                else:
                    assert s["peak"] >= self.high[key], key
            for field in ("current", "allocated", "freed"):
                assert stats[name]["all"][field] == sum(stats[name][p][field] for p in POOLS), (name, field)
        for pool in POOLS:
            count = self.events[pool]
            assert stats["allocation"][pool]["allocated"] == stats["active"][pool]["allocated"] == count["mallocs"]
            assert stats["allocation"][pool]["freed"] == count["frees"]
            assert stats["requested_bytes"][pool]["allocated"] == count["requested"]
            assert stats["requested_bytes"][pool]["freed"] == count["requested_freed"]
            assert stats["allocated_bytes"][pool]["allocated"] == count["bytes"]
            assert stats["active_bytes"][pool]["allocated"] == count["bytes"]
            assert stats["allocated_bytes"][pool]["freed"] == count["bytes_freed"]
        segment = stats["segment"]["all"]
        assert stats["num_device_alloc"] - stats["num_device_free"] == segment["allocated"] - segment["freed"]

    def finish(self) -> None:
        self.open_gates()
        for ptr in list(self.live):
            self.free(ptr)
        self.al.empty_cache()
        self.check()
        assert self.al.snapshot() == [] and self.al.stats.as_dict()["reserved_bytes"]["all"]["current"] == 0


@pytest.mark.parametrize("seed", range(4))
def test_statistics_and_snapshot_agree_under_a_random_workload(seed):
    work = Workload(seed)
    try:
        for _ in range(500):
            work.step()
            work.check()
    finally:
        work.finish()
    # the workload is only a test if it split, merged, waited for streams and failed
    assert {"inactive", "active_allocated", "split", "two streams"} <= set(work.seen)
    assert openreg.LAUNCH_BLOCKING or work.seen["active_pending_free"]
    assert work.ooms


def test_the_allocator_serves_each_thread_on_its_current_stream():
    """Allocations come from the pool of the calling thread's current stream: the default stream on a
    thread that never set one (the runtime's per-thread default), the set one otherwise."""
    other = openreg.Stream(0)
    previous = openreg.set_stream(other)
    try:
        ptr = _runtime.malloc(512, 0)
        assert _runtime.allocator(0).active[ptr].stream is other
        _runtime.free(ptr)
        seen = {}

        def fresh_thread():
            ptr = _runtime.malloc(512, 0)
            seen["stream"] = _runtime.allocator(0).active[ptr].stream
            seen["current"] = [openreg.current_stream(d) for d in range(openreg.device_count())]
            _runtime.free(ptr)

        thread = threading.Thread(target=fresh_thread)
        thread.start()
        thread.join()
        assert seen["stream"] is openreg.default_stream(0)
        assert seen["current"] == [openreg.default_stream(d) for d in range(openreg.device_count())]
    finally:
        openreg.set_stream(previous)
    assert openreg.current_stream(0) is previous
