"""The stream a process group's collectives run on, one per device: NCCL's internal stream.

A collective is launched on the group's stream after an event wait on the caller's current stream, so it
starts once the caller's earlier work is done and the caller's stream goes on meanwhile; ``Work.wait()``
makes the caller's stream wait for the collective's end. That is as safe as a launch on the caller's stream,
and lets the collective overlap later work there (DDP's bucketed all-reduces and the rest of backward).

Each event wait is a queued item on the group's stream, and a loop of ``all_reduce`` calls would make the
two streams wait for each other, item by item. So the group's stream remembers how far it already follows a
caller's stream: when nothing was queued on the caller since its last collective, or since the caller
waited for one, the new collective needs no wait of its own (its stream is in order already).
"""

from __future__ import annotations

import openreg


# LITERALINCLUDE START: OCCL GROUP STREAM
class GroupStream:
    """One process group's collective stream on one device."""

    def __init__(self, device: int) -> None:
        self.stream = openreg.Stream(device)
        # (caller stream, its launch count): the caller's work up to there is ordered before our last launch
        self._follows: tuple[openreg.Stream, int] | None = None

    def after(self, caller: openreg.Stream) -> None:
        """Make the next launch here wait for the work queued on ``caller`` so far (``cudaStreamWaitEvent``)."""
        seq = caller.launched
        if self._follows is None or self._follows[0] is not caller or self._follows[1] != seq:
            ready = openreg.Event(device=caller.device)
            ready.record(caller)
            self.stream.wait_event(ready)
            self._follows = (caller, seq)

    def waited(self, caller: openreg.Stream, before: int) -> None:
        """``caller`` now waits for an event of this stream, queued after its launch number ``before``: if this
        stream followed ``caller`` up to ``before``, it still does (the wait only waits for this stream)."""
        if self._follows is not None and self._follows[0] is caller and self._follows[1] == before:
            self._follows = (caller, caller.launched)
# LITERALINCLUDE END: OCCL GROUP STREAM
