"""The openreg graph behind ``torch.accelerator.Graph``: what the bridge's ``at::GraphImplInterface`` forwards to.

PyTorch 2.13's device-generic ``torch.accelerator.Graph`` holds a C++ ``at::GraphImplInterface`` that each
backend registers for its device type (``REGISTER_GRAPH_IMPL``, ATen/core/GraphImplInterface.h). openreg's
(``csrc/graph.cpp``) asks ``torch_openreg._runtime.graph_new`` for a :class:`GraphImpl` and forwards every
call to it. It does three things around the runtime's capture (``openreg.graph``):

* it routes the allocations of the capture's streams to the graph's private memory pool in the caching
  allocator, so that memory the graph's kernels use is never handed to other work (pools can be shared
  between graphs: ``graph_pool_handle()``, ``Graph.pool()``; ``reset()`` gives the pool up);
* it watches the memory the graph uses outside its pool (static inputs, parameters): a replay after one of
  those tensors was freed raises, where CUDA would read or write freed memory;
* it replays on the current stream of the device it captured on, like ``CUDAGraph.replay``.

It sits below the device module (``torch.openreg.Graph`` and friends in ``device/graphs.py`` build on it)
because the bridge's calls (``_runtime.py``) create it.
"""

from __future__ import annotations

import contextlib
import itertools

import openreg
from torch_openreg.memory import allocator

_pool_ids = itertools.count(1)
# at::GraphCaptureMode: Default (0, which is "global" for openreg, CUDA's default), Global, ThreadLocal, Relaxed
_MODES = {0: "global", 1: "global", 2: "thread_local", 3: "relaxed"}


def graph_pool_handle() -> tuple[int, int]:
    """An id for a memory pool that graphs may share (``torch.cuda.graph_pool_handle``)."""
    return (0, next(_pool_ids))


# LITERALINCLUDE START: GRAPH IMPL PYTHON
class GraphImpl:
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
