"""Device graphs on openreg: ``torch.accelerator.Graph``, and ``torch.cuda``'s graph API as ``torch.openreg``'s.

PyTorch 2.13's device-generic ``torch.accelerator.Graph`` holds a C++ ``at::GraphImplInterface`` that each
backend registers for its device type (``REGISTER_GRAPH_IMPL``, ATen/core/GraphImplInterface.h). openreg's
(``csrc/graph.cpp``) forwards every call to a :class:`_GraphImpl` here, which does three things around the
runtime's capture (``openreg.graph``):

* it routes the allocations of the capture's streams to the graph's private memory pool in the caching
  allocator, so that memory the graph's kernels use is never handed to other work (pools can be shared
  between graphs: ``graph_pool_handle()``, ``Graph.pool()``; ``reset()`` gives the pool up);
* it watches the memory the graph uses outside its pool (static inputs, parameters): a replay after one of
  those tensors was freed raises, where CUDA would read or write freed memory;
* it replays on the current stream of the device it captured on, like ``CUDAGraph.replay``.

Random operators need nothing here: an openreg random kernel draws from its generator's state when it
runs, so each replay draws fresh numbers, in stream order, and ``manual_seed`` makes replays repeat.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch

import openreg
from torch_openreg.memory import allocator

from .state import _index, _lazy_init, current_device, is_initialized

_pool_ids = itertools.count(1)
# at::GraphCaptureMode: Default (0, which is "global" for openreg, CUDA's default), Global, ThreadLocal, Relaxed
_MODES = {0: "global", 1: "global", 2: "thread_local", 3: "relaxed"}


def graph_pool_handle() -> tuple[int, int]:
    """An id for a memory pool that graphs may share (``torch.cuda.graph_pool_handle``)."""
    return (0, next(_pool_ids))


# LITERALINCLUDE START: GRAPH IMPL PYTHON
class _GraphImpl:
    """The openreg graph behind one ``torch.accelerator.Graph``: its capture, its runtime graph, its pool."""

    def __init__(self, keep_graph: bool) -> None:
        self.keep_graph = keep_graph
        self.debug = False
        self.device: int | None = None
        self.stream: openreg.Stream | None = None
        self.pool_id: tuple[int, int] | None = None
        self.capture: openreg.graph.Capture | None = None
        self.route: tuple | None = None
        self.graph: openreg.Graph | None = None
        self.watched: list[int] = []  # blocks outside the pool that the graph uses (see freed)
        self.stale: str | None = None  # why a replay must refuse

    def capture_begin(self, pool0: int, pool1: int, mode: int) -> None:
        if self.graph is not None or self.capture is not None:
            raise RuntimeError("this openreg graph already holds a captured graph (or is capturing one); "
                               "reset() it, or use a new Graph, to capture again")
        device = openreg.get_device()
        stream = openreg.current_stream(device)
        pool_id = (pool0, pool1) if (pool0, pool1) != (0, 0) else (next(_pool_ids), 0)
        capture = openreg.begin_capture(stream, _MODES[mode])  # refuses the default stream and nesting
        self.device, self.stream, self.pool_id, self.capture = device, stream, pool_id, capture
        self.route = allocator(device).begin_allocate_to_pool(pool_id, capture.includes)

    def capture_end(self) -> None:
        if self.capture is None:
            raise RuntimeError("capture_end() without capture_begin() on this openreg graph")
        alloc = allocator(self.device)
        alloc.end_allocate_to_pool(self.route)
        self.capture = self.route = None
        try:
            self.graph = openreg.end_capture(self.stream)
        except BaseException:
            alloc.release_pool(self.pool_id)
            self.pool_id = None
            raise
        self._watch()
        if not self.keep_graph:
            self.graph.instantiate()

    def instantiate(self) -> None:
        self._captured().instantiate()

    def replay(self) -> None:
        graph = self._captured()
        if self.stale is not None:
            raise RuntimeError(self.stale)
        graph.launch(openreg.current_stream(self.device))  # the capture's device, whatever is current now

    def reset(self) -> None:
        if self.capture is not None:
            raise RuntimeError("reset() during a capture: end the capture first (capture_end())")
        alloc = allocator(self.device) if self.device is not None else None
        for ptr in self.watched:
            alloc.unwatch(ptr, self)
        self.watched, self.stale = [], None
        if self.graph is not None:
            self.graph.release()  # the kernels and their pins go first, then the pool
            self.graph = None
        if self.pool_id is not None:
            alloc.release_pool(self.pool_id)
            self.pool_id = None

    def pool(self) -> tuple[int, int]:
        return self.pool_id if self.pool_id is not None else (0, 0)

    def enable_debug_mode(self) -> None:
        self.debug = True

    def debug_dump(self, path: str) -> None:
        if not self.debug:
            raise RuntimeError("debug_dump() needs enable_debug_mode() first")
        with open(path, "w") as f:
            f.write(self._captured().dot())

    def destroy(self) -> None:
        """The ``torch.accelerator.Graph`` is gone: end a capture it left open, give everything back."""
        if self.capture is not None:
            with contextlib.suppress(Exception):
                self.capture_end()
        self.reset()

    def _captured(self) -> openreg.Graph:
        if self.graph is None:
            raise RuntimeError("this openreg graph holds no captured graph: capture_begin() and capture_end() first")
        return self.graph

    def _watch(self) -> None:
        """Watch the blocks outside the pool that the kernels use; one freed already (during the capture) makes
        the graph stale at once."""
        alloc = allocator(self.device)
        ptrs = {b if type(b) is int else b[0] for node in self.graph.nodes for b in node.buffers}
        for ptr in ptrs:
            state = alloc.state_of(ptr)
            if state is None or state[1] == self.pool_id:
                continue  # not this allocator's memory (pinned host memory), or the graph's own pool
            if state[0] == "allocated" and alloc.watch(ptr, self):
                self.watched.append(ptr)
            else:
                self.freed(ptr, state[2])

    def freed(self, ptr: int, size: int) -> None:
        """The caching allocator freed a block the graph uses outside its pool: replays must refuse."""
        if ptr in self.watched:
            self.watched.remove(ptr)
        if self.stale is None:
            self.stale = (f"replay of an openreg graph whose captured memory was freed: the block at 0x{ptr:x} "
                          f"({size} bytes) on openreg:{self.device}, which its kernels use, is not in the graph's "
                          "pool and its tensor was freed; keep the tensors a graph reads and writes alive while it "
                          "may be replayed (CUDA graphs require the same), or capture again")
# LITERALINCLUDE END: GRAPH IMPL PYTHON


# LITERALINCLUDE START: GRAPH PYTHON API
class Graph(torch.accelerator.Graph):
    """``torch.openreg.Graph``: ``torch.cuda.CUDAGraph``'s interface on ``torch.accelerator.Graph`` (the same
    openreg graph underneath): ``capture_begin`` takes the pool and capture mode as CUDA's does."""

    def __new__(cls, keep_graph: bool = False, *, pool: tuple[int, int] | None = None,
                capture_error_mode: str = "global") -> Graph:
        return super().__new__(cls, keep_graph)

    def __init__(self, keep_graph: bool = False, *, pool: tuple[int, int] | None = None,
                 capture_error_mode: str = "global") -> None:
        super().__init__(keep_graph, pool=pool, capture_error_mode=capture_error_mode)

    def capture_begin(self, pool: tuple[int, int] | None = None, capture_error_mode: str | None = None,
                      check_input_liveness: bool = False) -> None:
        """Begin capturing the current stream's work (``CUDAGraph.capture_begin``). ``check_input_liveness`` is
        always on: a replay after a tensor the graph uses outside its pool was freed raises."""
        torch._C._acceleratorGraph.capture_begin(
            self, pool=self.graph_pool if pool is None else pool,
            capture_error_mode=self.capture_error_mode if capture_error_mode is None else capture_error_mode,
        )

    def debug_dump(self, debug_path: str) -> None:
        """Write the captured graph (openreg's DOT) to ``debug_path``, after ``enable_debug_mode()``."""
        super().debug_dump(debug_path)


class graph:  # noqa: N801 - torch.cuda.graph's name
    """Capture the work of a ``with`` block into ``openreg_graph`` (``torch.cuda.graph``).

    It synchronizes the device and empties the caching allocator's cache first, then captures on ``stream``
    (by default a side stream of the current device, kept for the process: the default stream cannot be
    captured). An exception inside the block (a host synchronization the capture refused, say) ends the
    capture and goes on unchanged.
    """

    default_capture_stream: torch.Stream | None = None  # the last one used (CUDA's attribute)
    _side_streams: dict[int, torch.Stream] = {}

    def __init__(self, openreg_graph: torch.accelerator.Graph, pool: tuple[int, int] | None = None,
                 stream: torch.Stream | None = None, capture_error_mode: str = "global",
                 check_input_liveness: bool = False) -> None:
        # check_input_liveness: always on in openreg (a replay after a captured input was freed raises)
        if stream is None:
            device = current_device()
            stream = graph._side_streams.get(device)
            if stream is None:
                stream = graph._side_streams[device] = torch.openreg.Stream(device)
            graph.default_capture_stream = stream
        self.graph, self.pool, self.capture_error_mode = openreg_graph, pool, capture_error_mode
        self.stream_ctx = torch.openreg.stream(stream)

    def __enter__(self) -> None:
        openreg.graph.check_not_capturing()  # before the synchronize, which a capture would refuse
        torch.openreg.synchronize()
        torch.openreg.empty_cache()
        self.stream_ctx.__enter__()
        try:
            if isinstance(self.graph, Graph) or not isinstance(self.graph, torch.accelerator.Graph):
                self.graph.capture_begin(self.pool, capture_error_mode=self.capture_error_mode)
            else:  # a plain torch.accelerator.Graph: its capture_begin takes no arguments
                torch._C._acceleratorGraph.capture_begin(self.graph, pool=self.pool,
                                                         capture_error_mode=self.capture_error_mode)
        except BaseException:
            self.stream_ctx.__exit__(None, None, None)
            raise

    def __exit__(self, kind: type | None, value: BaseException | None, tb: Any) -> None:
        try:
            self.graph.capture_end()
        except RuntimeError:
            if kind is None:
                raise  # else the block's own exception says what went wrong; the capture is over either way
        finally:
            self.stream_ctx.__exit__(kind, value, tb)


def is_current_stream_capturing() -> bool:
    """Whether a graph capture is underway on the current stream of the current device (False before init)."""
    if not is_initialized():
        return False
    return openreg.is_capturing(openreg.current_stream())
# LITERALINCLUDE END: GRAPH PYTHON API


# LITERALINCLUDE START: MEMPOOL
class MemPool:
    """``torch.cuda.MemPool``: a private pool of the caching allocator on the current device.

    Allocations go to it inside :func:`use_mem_pool` (this thread's) or a graph capture given its ``id`` as
    ``pool``; its blocks serve those allocations only. It lives while this object, a graph or a
    ``use_mem_pool`` uses it; then its segments go back to the device as soon as they are free.
    """

    def __init__(self, allocator: Any = None, use_on_oom: bool = False, no_split: bool = False) -> None:
        if allocator is not None:
            raise NotImplementedError("openreg has no pluggable allocators: a MemPool uses the caching allocator "
                                      "(allocator=None)")
        self._id, self.device = graph_pool_handle(), current_device()
        _allocator(self.device).use_pool(self._id, use_on_oom=bool(use_on_oom), no_split=bool(no_split))
        weakref.finalize(self, _allocator(self.device).release_pool, self._id)

    @property
    def id(self) -> tuple[int, int]:
        """The pool's id (what a graph capture takes as ``pool``)."""
        return self._id

    @property
    def allocator(self) -> None:
        """Always ``None``: the pool belongs to the caching allocator."""
        return None

    def use_count(self) -> int:
        """How many users hold the pool: this object, graphs, ``use_mem_pool`` contexts."""
        pool = _allocator(self.device).pools.get(self._id)
        return pool.use_count if pool is not None else 0

    def snapshot(self, include_traces: bool = True) -> list[dict]:
        """The segments of this pool, as ``torch.openreg.memory_snapshot()`` describes segments."""
        return [seg for seg in _allocator(self.device).snapshot() if seg["segment_pool_id"] == self._id]


@contextlib.contextmanager
def use_mem_pool(pool: MemPool, device: Any = None) -> Iterator[None]:
    """Route this thread's allocations on ``device`` (default: current) to ``pool`` (``torch.cuda.use_mem_pool``)."""
    _lazy_init()
    alloc = _allocator(_index(device))
    me = threading.get_ident()
    route = alloc.begin_allocate_to_pool(pool.id, lambda stream: threading.get_ident() == me)
    try:
        yield
    finally:
        alloc.end_allocate_to_pool(route)
        alloc.release_pool(pool.id)
# LITERALINCLUDE END: MEMPOOL


_allocator = allocator
