"""The transport under ``occl``: gloo, moving host memory, with collectives issued in one order.

This is the part a vendor replaces with its own collective library. Every method takes host
tensors (inside a kernel: host views of device memory) and *issues* one transfer, returning a
handle with ``wait()``; nothing here knows about devices or streams.

Two gloo contexts are used: ``data`` carries the tensors, ``ctrl`` the small descriptions that let
every rank check a call against its peers before any data moves (:mod:`.checks`) and the headers
of point-to-point calls. Gloo matches collectives by the order they are issued in, and kernels on
different streams may run in any order, so a ticket taken at launch decides the order in which
kernels issue (:meth:`Transport.turn`).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Sequence
from datetime import timedelta

import torch
from torch._C._distributed_c10d import (
    AllgatherOptions,
    AllreduceOptions,
    AllToAllOptions,
    BarrierOptions,
    BroadcastOptions,
    GatherOptions,
    PrefixStore,
    ProcessGroupGloo,
    ReduceOp,
    ReduceOptions,
    ReduceScatterOptions,
    ScatterOptions,
    Store,
)

# c10d's ReduceOp.RedOpType numbers (the C++ bridge passes them as ints), as gloo takes them
GLOO_OPS = {0: ReduceOp.SUM, 2: ReduceOp.PRODUCT, 3: ReduceOp.MIN, 4: ReduceOp.MAX,
            5: ReduceOp.BAND, 6: ReduceOp.BOR, 7: ReduceOp.BXOR}


class Closed(RuntimeError):
    """The process group was destroyed while a collective waited for its turn."""


class Transport:
    """Two gloo contexts over ``store`` and the ticket order of issue on ``data``."""

    def __init__(self, store: Store, rank: int, size: int, timeout: timedelta) -> None:
        self.rank, self.size, self.timeout = rank, size, timeout
        self.data = ProcessGroupGloo(PrefixStore("occl/data/", store), rank, size, timeout)
        self.ctrl = ProcessGroupGloo(PrefixStore("occl/ctrl/", store), rank, size, timeout)
        self._cond = threading.Condition()
        self._tickets = itertools.count()  # launches take them under their group's launch lock
        self._turn = 0  # ticket whose kernel may issue now
        self._released: set[int] = set()  # tickets that finished issuing (or will never issue)
        self._waiting = 0  # kernels waiting for their turn
        self._closed = False

    # LITERALINCLUDE START: OCCL TURNS
    def ticket(self) -> int:
        """The next place in the order of issue (taken at launch, in program order).

        Lock-free on purpose: a launch must never wait for a lock a kernel holds (on a loaded
        machine, a kernel thread preempted while holding one stalls the host for a time slice).
        """
        return next(self._tickets)

    def turn(self, ticket: int) -> None:
        """Wait until every earlier ticket has issued; the kernel then issues and calls :meth:`release`.

        The kernels of one process group on one device run in order on the group's stream, but a group may
        use several devices, whose streams run in any order; gloo matches transfers by their order of issue,
        so a kernel that runs early waits here (with the GIL released) for those launched before it. Only
        issuing is ordered: transfers already issued run on gloo's threads while the next kernel issues.
        """
        if self._turn == ticket and not self._closed:  # the common case, no lock: only this ticket moves it on
            return
        with self._cond:
            self._waiting += 1
            try:
                while self._turn != ticket and not self._closed:
                    self._cond.wait()
            finally:
                self._waiting -= 1
        if self._closed:
            raise Closed("occl: the process group was destroyed before this collective ran")

    def release(self, ticket: int) -> None:
        """``ticket`` has issued its transfers (or never will): let the next one go."""
        with self._cond:
            if ticket == self._turn and not self._released:
                self._turn += 1
            else:
                self._released.add(ticket)
                while self._turn in self._released:
                    self._released.discard(self._turn)
                    self._turn += 1
            if self._waiting:
                self._cond.notify_all()
    # LITERALINCLUDE END: OCCL TURNS

    def close(self) -> None:
        """Wake every kernel still waiting for its turn (they fail) and shut gloo down."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for pg in (self.data, self.ctrl):
            with contextlib.suppress(Exception):
                pg.shutdown()

    # --- ctrl: small host buffers --------------------------------------------------------------
    def exchange(self, mine: bytes | bytearray) -> list[bytes]:
        """All-gather one small buffer per rank (every rank's of the same length); waits for it."""
        n = len(mine)
        out = bytearray(self.size * n)
        self.ctrl._allgather_base(torch.frombuffer(out, dtype=torch.uint8),
                                  torch.frombuffer(bytearray(mine), dtype=torch.uint8)).wait()
        return [bytes(out[i * n:(i + 1) * n]) for i in range(self.size)]

    def send_header(self, header: torch.Tensor, dst: int, tag: int):
        return self.ctrl.send([header], dst, tag)

    def recv_header(self, header: torch.Tensor, src: int, tag: int):
        if src < 0:
            return self.ctrl.recv_anysource([header], tag)
        return self.ctrl.recv([header], src, tag)

    # --- data: host views, issued from kernels in ticket order -----------------------------------
    def allreduce(self, t: torch.Tensor, op: int, timeout_ms: int = -1):
        return self.data.allreduce([t], _opts(AllreduceOptions, timeout_ms, reduceOp=GLOO_OPS[op]))

    def broadcast(self, t: torch.Tensor, root: int, timeout_ms: int = -1):
        return self.data.broadcast([t], _opts(BroadcastOptions, timeout_ms, rootRank=root))

    def reduce(self, t: torch.Tensor, op: int, root: int, timeout_ms: int = -1):
        return self.data.reduce([t], _opts(ReduceOptions, timeout_ms, reduceOp=GLOO_OPS[op], rootRank=root))

    def allgather(self, outputs: Sequence[torch.Tensor], t: torch.Tensor, timeout_ms: int = -1):
        return self.data.allgather([list(outputs)], [t], _opts(AllgatherOptions, timeout_ms))

    def allgather_into(self, out: torch.Tensor, t: torch.Tensor, timeout_ms: int = -1):
        return self.data._allgather_base(out, t, _opts(AllgatherOptions, timeout_ms))

    def gather(self, outputs: Sequence[torch.Tensor], t: torch.Tensor, root: int, timeout_ms: int = -1):
        lists = [list(outputs)] if self.rank == root else []
        return self.data.gather(lists, [t], _opts(GatherOptions, timeout_ms, rootRank=root))

    def scatter(self, t: torch.Tensor, inputs: Sequence[torch.Tensor], root: int, timeout_ms: int = -1):
        lists = [list(inputs)] if self.rank == root else []
        return self.data.scatter([t], lists, _opts(ScatterOptions, timeout_ms, rootRank=root))

    def reduce_scatter_into(self, out: torch.Tensor, t: torch.Tensor, op: int, timeout_ms: int = -1):
        opts = _opts(ReduceScatterOptions, timeout_ms, reduceOp=GLOO_OPS[op])
        return self.data._reduce_scatter_base(out, t, opts)

    def alltoall(self, out: torch.Tensor, t: torch.Tensor, out_splits: list[int], in_splits: list[int],
                 timeout_ms: int = -1):
        return self.data.alltoall_base(out, t, out_splits, in_splits, _opts(AllToAllOptions, timeout_ms))

    def send(self, t: torch.Tensor, dst: int, tag: int):
        return self.data.send([t], dst, tag)

    def recv(self, t: torch.Tensor, src: int, tag: int):
        return self.data.recv([t], src, tag)

    def barrier(self, timeout_ms: int = -1):
        return self.data.barrier(_opts(BarrierOptions, timeout_ms))


_OPTIONS: dict[tuple, object] = {}


def _opts(kind: type, timeout_ms: int, **fields):
    """A c10d options object (one per distinct value: gloo copies what it needs from it); a negative
    timeout leaves the group's own."""
    key = (kind, timeout_ms, *fields.items())
    opts = _OPTIONS.get(key)
    if opts is None:
        opts = kind()
        for name, value in fields.items():
            setattr(opts, name, value)
        if timeout_ms is not None and timeout_ms >= 0:
            opts.timeout = timedelta(milliseconds=timeout_ms)
        if len(_OPTIONS) < 1024:
            _OPTIONS[key] = opts
    return opts
