"""Memory history of the caching allocator: what ``torch.cuda.memory._record_memory_history`` records.

While recording, each device allocator reports its actions here (``alloc``, ``free_requested``,
``free_completed``, ``segment_alloc``, ``segment_free``, ``oom``, ``snapshot``) as CUDA's
``TraceEntry`` dictionaries, in a ring buffer of ``max_entries``, and keeps the stack of every live
allocation on its block, so that a snapshot has the shape ``torch.cuda._memory_viz`` and
pytorch.org/memory_viz read.

Stacks are Python frames. ``stacks="all"`` (CUDA: Python and C++ frames) keeps the backend's own
frames too (``torch_openreg``, the ``openreg`` runtime: what C++ frames are to CUDA);
``stacks="python"`` keeps only the frames outside the backend. The allocator's own frames are never
recorded.
"""

from __future__ import annotations

import collections
import os
import sys
import time

import openreg

ACTIONS = ("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom", "snapshot")

_MEMORY = os.path.dirname(os.path.abspath(__file__))  # this package: the allocator itself
_PACKAGE = os.path.dirname(_MEMORY)
_ALLOCATOR = (_MEMORY, os.path.join(_PACKAGE, "_runtime.py"))  # the allocator and the bridge's entry to it
_BACKEND = (_PACKAGE, os.path.dirname(os.path.abspath(openreg.__file__)))


# LITERALINCLUDE START: HISTORY
class History:
    """The recording settings of one device allocator and its trace (a ring buffer)."""

    def __init__(self, enabled: str, context: str | None, stacks: str, max_entries: int, skip: set[str]) -> None:
        if enabled not in ("state", "all"):
            raise ValueError(f"enabled must be None, 'state' or 'all', got {enabled!r}")
        if context not in (None, "state", "alloc", "all"):
            raise ValueError(f"context must be None, 'state', 'alloc' or 'all', got {context!r}")
        if stacks not in ("python", "all"):
            raise ValueError(f"stacks must be 'python' or 'all', got {stacks!r}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be positive, got {max_entries}")
        unknown = set(skip) - set(ACTIONS)
        if unknown:
            raise ValueError(f"unknown actions to skip: {sorted(unknown)} (known: {list(ACTIONS)})")
        self.trace: collections.deque | None = collections.deque(maxlen=max_entries) if enabled == "all" else None
        self.state_frames = context is not None  # stacks of live allocations, on their blocks
        self.alloc_frames = context in ("alloc", "all")  # stacks in the trace's alloc entries
        self.free_frames = context == "all"  # ... and in its free entries
        self.skip_dirs = _ALLOCATOR if stacks == "all" else _BACKEND
        self.skip = frozenset(skip)

    def frames(self) -> list[dict]:
        """The calling Python stack, innermost first, without the frames ``stacks`` leaves out."""
        out, frame = [], sys._getframe(1)
        while frame is not None:
            code = frame.f_code
            if not code.co_filename.startswith(self.skip_dirs):
                out.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
            frame = frame.f_back
        return out

    def record(self, action: str, addr: int, size: int, stream: int, frames: list | None = None, **extra) -> None:
        if self.trace is not None and action not in self.skip:
            entry = {"action": action, "addr": addr, "size": size, "stream": stream,
                     "time_us": time.time_ns() // 1000, "frames": frames or []}
            entry.update(extra)
            self.trace.append(entry)
# LITERALINCLUDE END: HISTORY
