"""Device graphs on openreg: ``torch.accelerator.Graph``, and ``torch.cuda``'s graph API as ``torch.openreg``'s.

PyTorch 2.13's device-generic ``torch.accelerator.Graph`` holds a C++ ``at::GraphImplInterface`` that each
backend registers for its device type (``REGISTER_GRAPH_IMPL``); openreg's forwards every call to a
:class:`torch_openreg.graph_impl.GraphImpl` (the capture, the private pool, the replay). This module gives it
``torch.cuda``'s Python API: ``Graph``, ``graph``, ``graph_pool_handle``, ``MemPool``, ``use_mem_pool``.

Random operators need nothing here: an openreg random kernel draws from its generator's state when it
runs, so each replay draws fresh numbers, in stream order, and ``manual_seed`` makes replays repeat.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import torch

import openreg
from torch_openreg.graph_impl import graph_pool_handle
from torch_openreg.memory import allocator

from .state import _index, _lazy_init, current_device, is_initialized


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
