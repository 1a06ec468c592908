"""How an occl collective is launched: numbered, ticketed, queued as one kernel on a stream, then issued.

:class:`GroupLauncher` is the part of a process group's backend (:class:`~.backend.OCCL`) that does not
depend on which collective runs: it numbers each call for the checks against the peers (:mod:`.checks`),
takes a ticket for the order of issue on the transport, launches the kernel on the caller's stream or the
group's own stream (:mod:`.streams`), and batches calls while coalescing. Its kernel, when the stream
reaches it, waits for its turn, checks, hands host views to the transport and waits, GIL released.
"""

from __future__ import annotations

import threading
from datetime import timedelta

import torch

import openreg
from openreg.settings import LAUNCH_BLOCKING
from torch_openreg.aten.launch import detach_frames, host_views, launch
from torch_openreg.timing import costs as timing_costs

from .checks import Checker, MismatchError
from .ops import Op, TransportError, drain
from .streams import GroupStream
from .transport import Transport
from .work import Coalesced, Work


class GroupLauncher:
    """Launches the collectives of one occl process group (one per group and device type)."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, group: str) -> None:
        self.rank, self.size, self.group = rank, size, group
        self.transport = Transport(store, rank, size, timeout)
        self.checker = Checker(self.transport, group)
        self._lock = threading.Lock()  # launches of this group: numbers, tickets and launches in one order
        self._coalesced: list | None = None  # (name, device, ops, outputs, work) while coalescing
        self._last: dict[int, openreg.Event] = {}  # per device, the end of the last collective launched
        self._streams: dict[int, GroupStream] = {}  # per device, the stream the group's collectives run on
        self._closed = False

    # LITERALINCLUDE START: OCCL SUBMIT
    def _submit(self, name: str, device: int, ops: list[Op], outputs: list[torch.Tensor],
                blocking: bool = False, async_op: bool = True) -> Work:
        """Number ``ops`` for the checks, take a ticket and launch them as one kernel."""
        if self._coalesced is not None:  # launched later, with the whole group (end_coalescing)
            work = Coalesced(name, device, outputs)
            for op in ops:
                op.work = work
            with self._lock:
                self._start(ops)
            self._coalesced.append((name, device, ops, outputs, work))
            return work
        work = Work(name, device, outputs, blocking=blocking)
        for op in ops:
            op.work = work
        with self._lock:
            self._start(ops)
            self._launch(device, ops, work, f"occl:{name}", async_op)
        return work

    def _launch(self, device: int, ops: list[Op], work: Work, kernel_name: str, async_op: bool = True) -> None:
        """Queue the kernel (under the launch lock) and mark its end, where ProcessGroupNCCL would run it.

        ``async_op=False`` (the caller waits): on the caller's current stream. ``async_op=True`` (DDP's
        buckets, functional collectives, ``async_op=True`` calls): on the group's stream of ``device``,
        after the work queued so far on the caller's stream, so that the caller's stream goes on meanwhile.
        The queued kernel holds its tensors until it has run, so their memory cannot go back to the caller
        stream's pool while the collective may still use it (NCCL's stash of the tensors of an async op).
        """
        ticket = self.transport.ticket()
        caller = stream = openreg.current_stream(device)
        if openreg.is_capturing(caller):  # before the group's stream could join the capture
            self._withdraw(ops, ticket)
            openreg.refuse_capture(caller, f"occl: {kernel_name.removeprefix('occl:')} on openreg:{device} stream "
                                   f"{caller.id} during a graph capture: occl orders and checks each collective "
                                   "across ranks when it is launched, so a replay cannot repeat it")
        tensors = [t for op in ops for t in op.tensors]
        work.caller, work.kernel = caller, kernel_name
        if async_op:
            group_stream = self._streams.get(device)
            if group_stream is None:
                group_stream = self._streams[device] = GroupStream(device)
            work.group_stream, stream = group_stream, group_stream.stream
            group_stream.after(caller)  # the collective starts once the caller's stream reaches this point
            openreg.set_stream(stream)
        try:
            if openreg.timing.active:  # the timing model: alpha-beta over the interconnect (torch_openreg/timing)
                timing_costs.price_collective(kernel_name, tensors, self.size)
            launch(device, self._kernel, work.name, ticket, ops, work, tensors=tensors, writes=work.outputs,
                   name=kernel_name)
        except BaseException:
            if not work.ran:  # (with OPENREG_LAUNCH_BLOCKING=1 the kernel ran, and its error is the caller's)
                self._withdraw(ops, ticket)
            raise
        finally:
            if stream is not caller:
                openreg.set_stream(caller)
        work.record(stream)
        self._last[device] = work.event
        if LAUNCH_BLOCKING and stream is not caller:
            caller.check_error()  # the collective ran at its launch: its error is reported here

    def _withdraw(self, ops: list[Op], ticket: int) -> None:
        """A launch failed after its ops were numbered: give their places up, so no peer waits for them."""
        self.transport.release(ticket)
        for op in ops:
            if op.signature is not None and op.check is not None:
                self.checker.withdraw(op.check)

    def _start(self, ops: list[Op]) -> None:
        """At launch, on the host: number each collective for the checks against the peers."""
        if self._closed:
            raise RuntimeError(f"occl: process group {self.group!r} was destroyed")
        for op in ops:
            if op.signature is not None:
                op.check = self.checker.add(op.signature)

    def _kernel(self, name: str, ticket: int, ops: list[Op], work: Work) -> None:
        """On its stream: in ticket order, check against the peers and issue; then wait, GIL released.

        A failure is reported to the stream the collective was launched from, at its next synchronizing
        call, as a kernel launched there would report it (from the group's stream, by ``report_failure``).
        """
        work.ran = True
        handles: list = []
        finishes = []
        try:
            try:
                self.transport.turn(ticket)
                for op in ops:
                    self._verify(op)
                for op in ops:
                    finishes.append(op.issue(host_views(*op.tensors), handles))
            finally:
                self.transport.release(ticket)
            try:
                for handle in handles:
                    handle.wait()
            except RuntimeError as exc:
                raise TransportError(f"occl: {name} on rank {self.rank} of process group {self.group!r} failed in "
                                     f"the transport (a peer exited or timed out): {exc}") from exc
            for finish in finishes:
                if finish is not None:
                    finish()
        except BaseException as exc:
            drain(handles)  # gloo may still be writing into this kernel's memory: never leave before it is done
            # the message only: the exception's frames hold this kernel's Work, which C++ holds too (a
            # cycle through C++ that the garbage collector cannot see, keeping the tensors alive)
            work.error = f"{type(exc).__name__}: {exc}"
            if work.group_stream is None or not isinstance(exc, Exception):
                raise  # on the caller's own stream, which reports it (with its launch site, if asked)
            detach_frames(exc)  # its frames hold host views of device memory
            work.caller.report_failure(work.kernel, exc)
    # LITERALINCLUDE END: OCCL SUBMIT

    def _verify(self, op: Op) -> None:
        if op.verify is not None:
            op.verify()
        elif op.check is not None:
            try:
                self.checker.verify(op.check)
            except MismatchError:
                raise
            except RuntimeError as exc:
                raise TransportError(f"occl: rank {self.rank} of process group {self.group!r} could not reach its "
                                     f"peers (a peer exited or timed out): {exc}") from exc

    # --- coalescing (batch_isend_irecv, _coalescing_manager): one kernel for many calls ----------
    def start_coalescing(self) -> None:
        if self._coalesced is not None:
            raise RuntimeError("occl: start_coalescing called twice without end_coalescing")
        self._coalesced = []

    def end_coalescing(self) -> Work:
        calls, self._coalesced = self._coalesced, None
        if calls is None:
            raise RuntimeError("occl: end_coalescing called without start_coalescing")
        devices = {device for _, device, _, _, _ in calls}
        if len(devices) > 1:
            raise RuntimeError(f"occl: coalesced calls span devices {sorted(devices)}; one device per group")
        device = devices.pop() if devices else openreg.get_device()
        outputs = [t for call in calls for t in call[3]]
        names = ",".join(dict.fromkeys(call[0] for call in calls)) or "nothing"
        work = Work(f"coalesced({names})", device, outputs)
        with self._lock:
            self._launch(device, [op for call in calls for op in call[2]], work, "occl:coalesced")
        for call in calls:
            call[4].join(work)
        return work

    # --- lifetime ----------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """``destroy_process_group``: let launched collectives finish, then close the transport."""
        if self._closed:
            return
        self._closed = True
        for event in list(self._last.values()):
            try:
                event.synchronize()
            except Exception:  # noqa: BLE001 - its error stays on its stream, for the next synchronize
                pass
        self._last.clear()
        self.transport.close()

    def abort(self) -> None:
        """Close at once: kernels not yet issued fail; issued transfers end on the transport's timeout."""
        self._closed = True
        self._last.clear()
        self.transport.close()

    def set_timeout(self, timeout_ms: int) -> None:
        for pg in (self.transport.data, self.transport.ctrl):
            pg.set_timeout(timedelta(milliseconds=timeout_ms))
