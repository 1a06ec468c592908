"""The occl collectives: each call is checked, then launched as one kernel on the current stream.

c10d calls these methods through the C++ ``c10d::Backend`` of ``csrc/distributed/occl.cpp``
(``ProcessGroup`` -> ``c10d::allreduce_`` for PrivateUse1 -> ``Backend::allreduce`` -> here).
A call:

1. checks its arguments on the host (openreg tensors, one device, sizes that fit) and raises at
   once if they are wrong, like any operator;
2. numbers itself for the checks against its peers (:mod:`.checks`) and takes a ticket for the
   order of issue;
3. launches a kernel on the device's current stream. When the stream reaches it, the kernel waits
   for its turn, compares its description with the peers' (exchanged in windows on the transport's
   ``ctrl`` context), and hands host views of the device memory to the transport (gloo), then waits
   for the transfer, with the GIL released;
4. returns a :class:`~.work.Work` recorded right after the launch.

So a collective is ordered with the kernels around it on its stream, and the host goes on at
once; its error surfaces like any kernel's, at the next synchronizing call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta

import torch

import openreg
from torch_openreg import _C

from .checks import Header, MismatchError, Signature, describe
from .launcher import GroupLauncher
from .ops import AVG, BAND, BOR, BXOR, OP_NAMES, PREMUL_SUM, REDUCIBLE, SUM, HostBuffer, Op
from .work import Work


class OCCL(GroupLauncher):
    """The Python side of one occl process group: each collective's checks and what its kernel issues
    (:class:`~.launcher.GroupLauncher` numbers and launches it)."""

    # --- argument checks -------------------------------------------------------------------------
    def _device(self, name: str, *groups: Sequence[torch.Tensor]) -> int:
        """The one openreg device of a call's tensors; a clear error for anything else."""
        devices = set()
        for group in groups:
            for t in group:
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"occl: {name} expects tensors, got {type(t).__name__}")
                if t.device.type != "openreg":
                    raise RuntimeError(
                        f"occl: {name} got a tensor on {t.device}; the occl backend moves openreg tensors only. "
                        "Give CPU tensors a CPU backend too: init_process_group(backend='cpu:gloo,openreg:occl')")
                if t.layout != torch.strided:
                    raise RuntimeError(f"occl: {name} supports dense (strided) tensors only, got {t.layout}")
                devices.add(t.device.index)
        if len(devices) > 1:
            raise RuntimeError(f"occl: {name} got tensors on several devices {sorted(devices)}; one call moves "
                               "the tensors of one device")
        return devices.pop() if devices else openreg.get_device()

    def _one(self, name: str, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        if len(tensors) != 1:
            raise RuntimeError(f"occl: {name} takes one tensor per call, got {len(tensors)}")
        return tensors[0]

    def _root(self, name: str, root: int) -> None:
        if not 0 <= root < self.size:
            raise ValueError(f"occl: {name} root {root} is not a rank of process group {self.group!r} "
                             f"(size {self.size})")

    def _same(self, name: str, t: torch.Tensor, others: Sequence[torch.Tensor], what: str,
              numel: int | None = None) -> None:
        for i, o in enumerate(others):
            if o.dtype != t.dtype:
                raise RuntimeError(f"occl: {name} {what} {i} is {o.dtype}, the input is {t.dtype}")
            if numel is not None and o.numel() != numel:
                raise RuntimeError(f"occl: {name} {what} {i} has {o.numel()} elements, expected {numel}")

    def _reduction(self, name: str, reduction: tuple, t: torch.Tensor) -> tuple[int, object]:
        """``(op, premul factor)`` once ``op`` is known to apply to ``t``'s dtype."""
        op, scale, scale_tensor = reduction
        factor = scale_tensor if scale_tensor is not None else scale
        what = OP_NAMES[op] if 0 <= op < len(OP_NAMES) else str(op)
        if op > PREMUL_SUM:
            raise ValueError(f"occl: {name} got the reduce operation {what}")
        if op == PREMUL_SUM and factor is None:
            raise ValueError(f"occl: {name} PREMUL_SUM without a factor (build it with dist._make_nccl_premul_sum)")
        if t.dtype not in REDUCIBLE:
            raise RuntimeError(f"occl: {name} cannot reduce {t.dtype} (occl reduces "
                               f"{', '.join(sorted(str(d).removeprefix('torch.') for d in REDUCIBLE))})")
        if op in (BAND, BOR, BXOR) and (t.is_floating_point() or t.is_complex()):
            raise RuntimeError(f"occl: {name} {what} needs an integer or bool tensor, got {t.dtype}")
        if t.is_complex() and op not in (SUM, AVG, PREMUL_SUM):
            raise RuntimeError(f"occl: {name} {what} is not defined for complex tensors ({t.dtype})")
        if op in (AVG, PREMUL_SUM) and t.dtype == torch.bool:
            raise RuntimeError(f"occl: {name} {what} is not defined for bool tensors")
        if op == PREMUL_SUM and not (t.is_floating_point() or t.is_complex()):
            raise RuntimeError(f"occl: {name} PREMUL_SUM needs a floating point tensor, got {t.dtype}")
        return op, factor

    def _signature(self, same: str, text: str | None = None, sends=None, recvs=None) -> Signature:
        return Signature(same, text, sends, recvs, self.size)

    # --- reductions ------------------------------------------------------------------------------
    def _reduce_op(self, t: torch.Tensor, op: int, factor, issue_sum: Callable, root: int = -1) -> Op:
        """An op that reduces ``t`` with ``op``: PREMUL_SUM scales a copy first, AVG divides after.

        ``issue_sum(host buffer, transport op, handles)`` issues the transfer. The result lands in
        ``t`` on every rank (``root < 0``) or on ``root`` only; other ranks reduce a copy, since the
        transport may use its buffer as scratch.
        """
        factor_t = [factor] if isinstance(factor, torch.Tensor) and factor.device.type == "openreg" else []
        size, writes = self.size, root < 0 or root == self.rank

        def issue(views: list, handles: list):
            view = views[0]
            if op == PREMUL_SUM:
                scale = views[1] if factor_t else factor
                host = HostBuffer(view.resolve_conj().resolve_neg() * (
                    scale.to(view.dtype) if isinstance(scale, torch.Tensor) else scale))
            else:
                host = HostBuffer(view if writes else view.clone())
            issue_sum(host.t, SUM if op in (AVG, PREMUL_SUM) else op, handles)

            def finish() -> None:
                if not writes:
                    return
                if op == AVG:
                    host.t.div_(size, rounding_mode=None if host.t.is_floating_point() else "trunc")
                if host.staging is not view:
                    view.copy_(host.staging)
            return finish
        return Op([t, *factor_t], issue)

    # LITERALINCLUDE START: OCCL ALLREDUCE
    def allreduce(self, tensors: Sequence[torch.Tensor], reduction: tuple, timeout_ms: int,
                  async_op: bool = True) -> Work:
        name = "all_reduce"
        device = self._device(name, tensors)
        t = self._one(name, tensors)
        op, factor = self._reduction(name, reduction, t)
        sent = self._reduce_op(t, op, factor,
                               lambda buf, gop, handles: handles.append(self.transport.allreduce(buf, gop, timeout_ms)))
        sent.signature = self._signature(f"all_reduce {describe(t)} op={OP_NAMES[op]}")
        return self._submit(name, device, [sent], [t], async_op=async_op)
    # LITERALINCLUDE END: OCCL ALLREDUCE

    def allreduce_coalesced(self, tensors: Sequence[torch.Tensor], reduction: tuple, timeout_ms: int,
                            async_op: bool = True) -> Work:
        name = "all_reduce_coalesced"
        device = self._device(name, tensors)
        ops = []
        for t in tensors:
            op, factor = self._reduction(name, reduction, t)
            sent = self._reduce_op(
                t, op, factor,
                lambda buf, gop, handles: handles.append(self.transport.allreduce(buf, gop, timeout_ms)))
            sent.signature = self._signature(f"all_reduce_coalesced {describe(t)} op={OP_NAMES[op]}")
            ops.append(sent)
        return self._submit(name, device, ops, list(tensors), async_op=async_op)

    def reduce(self, tensors: Sequence[torch.Tensor], reduction: tuple, root: int, root_tensor: int,
               timeout_ms: int, async_op: bool = True) -> Work:
        name = "reduce"
        device = self._device(name, tensors)
        t = self._one(name, tensors)
        self._root(name, root)
        op, factor = self._reduction(name, reduction, t)
        sent = self._reduce_op(t, op, factor, lambda buf, gop, handles: handles.append(
            self.transport.reduce(buf, gop, root, timeout_ms)), root=root)
        sent.signature = self._signature(f"reduce {describe(t)} op={OP_NAMES[op]} root={root}")
        return self._submit(name, device, [sent], [t], async_op=async_op)

    def _reduce_scatter_op(self, name: str, out: torch.Tensor, inputs: list[torch.Tensor], reduction: tuple,
                           timeout_ms: int) -> Op:
        """Reduce ``inputs[j]`` of every rank into ``out`` of rank ``j``: one gloo reduce-scatter over a
        staged concatenation (the inputs keep their values)."""
        op, factor = self._reduction(name, reduction, out)
        self._same(name, out, inputs, "input", out.numel())
        n = len(inputs)
        size = self.size
        factor_t = [factor] if isinstance(factor, torch.Tensor) and factor.device.type == "openreg" else []

        def issue(views: list, handles: list):
            out_view, ins = views[0], views[1:1 + n]
            scale = views[-1] if factor_t else factor
            flat = torch.cat([v.resolve_conj().resolve_neg().reshape(-1) for v in ins])
            if op == PREMUL_SUM:
                flat.mul_(scale.to(flat.dtype) if isinstance(scale, torch.Tensor) else scale)
            result = HostBuffer(out_view, load=False)
            real = torch.view_as_real(flat) if flat.is_complex() else flat
            handles.append(self.transport.reduce_scatter_into(
                result.t.reshape(-1), real.reshape(-1), SUM if op in (AVG, PREMUL_SUM) else op, timeout_ms))

            def finish() -> None:
                if op == AVG:
                    result.t.div_(size, rounding_mode=None if result.t.is_floating_point() else "trunc")
                result.store()
            return finish

        sent = Op([out, *inputs, *factor_t], issue)
        sent.signature = self._signature(f"{name} {describe(out)} op={OP_NAMES[op]}")
        return sent

    def reduce_scatter(self, outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]],
                       reduction: tuple, timeout_ms: int, async_op: bool = True) -> Work:
        name = "reduce_scatter"
        device = self._device(name, outputs, *inputs)
        out = self._one(name, outputs)
        ins = list(self._one(name, inputs))
        if len(ins) != self.size:
            raise RuntimeError(f"occl: {name} needs one input per rank ({self.size}), got {len(ins)}")
        return self._submit(name, device, [self._reduce_scatter_op(name, out, ins, reduction, timeout_ms)], [out],
                            async_op=async_op)

    def reduce_scatter_tensor(self, output: torch.Tensor, input: torch.Tensor, reduction: tuple,
                              timeout_ms: int, async_op: bool = True) -> Work:
        name = "reduce_scatter_tensor"
        device = self._device(name, [output, input])
        return self._submit(name, device, [self._reduce_scatter_tensor_op(name, output, input, reduction,
                                                                          timeout_ms)], [output], async_op=async_op)

    def _reduce_scatter_tensor_op(self, name: str, output: torch.Tensor, input: torch.Tensor, reduction: tuple,
                                  timeout_ms: int) -> Op:
        if input.dtype != output.dtype:
            raise RuntimeError(f"occl: {name} input is {input.dtype}, output is {output.dtype}")
        if input.numel() != self.size * output.numel():
            raise RuntimeError(f"occl: {name} input has {input.numel()} elements; it must have world size "
                               f"({self.size}) x output ({output.numel()}) = {self.size * output.numel()}")
        chunks = list(input.reshape(-1).chunk(self.size)) if output.numel() else [input.reshape(-1)] * self.size
        return self._reduce_scatter_op(name, output, chunks, reduction, timeout_ms)

    def reduce_scatter_tensor_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                        reduction: tuple, timeout_ms: int, async_op: bool = True) -> Work:
        name = "reduce_scatter_tensor_coalesced"
        device = self._device(name, outputs, inputs)
        if len(outputs) != len(inputs):
            raise RuntimeError(f"occl: {name} got {len(outputs)} outputs for {len(inputs)} inputs")
        ops = [self._reduce_scatter_tensor_op(name, o, i, reduction, timeout_ms) for o, i in zip(outputs, inputs)]
        return self._submit(name, device, ops, list(outputs), async_op=async_op)

    # --- data movement (raw bytes: any dtype) ------------------------------------------------------
    def broadcast(self, tensors: Sequence[torch.Tensor], root: int, root_tensor: int, timeout_ms: int,
                  async_op: bool = True) -> Work:
        name = "broadcast"
        device = self._device(name, tensors)
        t = self._one(name, tensors)
        self._root(name, root)

        def issue(views: list, handles: list):
            buf = HostBuffer(views[0], raw=True, load=self.rank == root)
            handles.append(self.transport.broadcast(buf.t, root, timeout_ms))
            return buf.store

        return self._submit(name, device, [Op([t], issue, self._signature(f"broadcast {describe(t)} root={root}"))],
                            [t], async_op=async_op)

    def _allgather_op(self, name: str, outputs: list[torch.Tensor], t: torch.Tensor, timeout_ms: int) -> Op:
        if len(outputs) != self.size:
            raise RuntimeError(f"occl: {name} needs one output per rank ({self.size}), got {len(outputs)}")
        self._same(name, t, outputs, "output")
        even = all(o.numel() == t.numel() for o in outputs)
        rank, size = self.rank, self.size

        def issue(views: list, handles: list):
            src = HostBuffer(views[0], raw=True)
            outs = [HostBuffer(v, raw=True, load=False) for v in views[1:]]
            if even:
                handles.append(self.transport.allgather([o.t for o in outs], src.t, timeout_ms))
            else:  # uneven sizes: every rank broadcasts its own part
                outs[rank].t.copy_(src.t)
                for j in range(size):
                    handles.append(self.transport.broadcast(outs[j].t, j, timeout_ms))

            def finish() -> None:
                for o in outs:
                    o.store()
            return finish

        nbytes = t.numel() * t.element_size()
        return Op([t, *outputs], issue, self._signature(
            f"{name} {describe(t).split('[')[0]}", f"{name} {describe(t)} into {[describe(o) for o in outputs]}",
            sends=[nbytes] * size, recvs=[o.numel() * o.element_size() for o in outputs]))

    def allgather(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                  timeout_ms: int, async_op: bool = True) -> Work:
        name = "all_gather"
        device = self._device(name, inputs, *outputs)
        t = self._one(name, inputs)
        outs = list(self._one(name, outputs))
        return self._submit(name, device, [self._allgather_op(name, outs, t, timeout_ms)], outs, async_op=async_op)

    def allgather_coalesced(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor],
                            timeout_ms: int, async_op: bool = True) -> Work:
        name = "all_gather_coalesced"
        device = self._device(name, inputs, *outputs)
        if len(outputs) != len(inputs):
            raise RuntimeError(f"occl: {name} got {len(outputs)} output lists for {len(inputs)} inputs")
        ops = [self._allgather_op(name, list(o), t, timeout_ms) for o, t in zip(outputs, inputs)]
        return self._submit(name, device, ops, [t for o in outputs for t in o], async_op=async_op)

    def _allgather_into_op(self, name: str, output: torch.Tensor, t: torch.Tensor, timeout_ms: int) -> Op:
        if output.dtype != t.dtype:
            raise RuntimeError(f"occl: {name} output is {output.dtype}, input is {t.dtype}")
        if output.numel() != self.size * t.numel():
            raise RuntimeError(f"occl: {name} output has {output.numel()} elements; it must have world size "
                               f"({self.size}) x input ({t.numel()}) = {self.size * t.numel()}")

        def issue(views: list, handles: list):
            src, out = HostBuffer(views[0], raw=True), HostBuffer(views[1], raw=True, load=False)
            handles.append(self.transport.allgather_into(out.t, src.t, timeout_ms))
            return out.store

        return Op([t, output], issue, self._signature(f"{name} {describe(t)}"))

    def allgather_into_tensor(self, output: torch.Tensor, input: torch.Tensor, timeout_ms: int,
                              async_op: bool = True) -> Work:
        name = "all_gather_into_tensor"
        device = self._device(name, [output, input])
        return self._submit(name, device, [self._allgather_into_op(name, output, input, timeout_ms)], [output],
                            async_op=async_op)

    def allgather_into_tensor_coalesced(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor],
                                        timeout_ms: int, async_op: bool = True) -> Work:
        name = "all_gather_into_tensor_coalesced"
        device = self._device(name, outputs, inputs)
        if len(outputs) != len(inputs):
            raise RuntimeError(f"occl: {name} got {len(outputs)} outputs for {len(inputs)} inputs")
        ops = [self._allgather_into_op(name, o, i, timeout_ms) for o, i in zip(outputs, inputs)]
        return self._submit(name, device, ops, list(outputs), async_op=async_op)

    def _root_list(self, name: str, lists: Sequence[Sequence[torch.Tensor]], what: str, t: torch.Tensor,
                   root: int) -> list[torch.Tensor]:
        """The root's one tensor per rank (each like ``t``) of a gather or scatter; nothing elsewhere."""
        if self.rank != root:
            if any(len(part) for part in lists):
                raise RuntimeError(f"occl: {name} takes {what}s on the root rank ({root}) only")
            return []
        tensors = list(self._one(name, lists))
        if len(tensors) != self.size:
            raise RuntimeError(f"occl: {name} needs one {what} per rank ({self.size}) on the root, got {len(tensors)}")
        self._same(name, t, tensors, what, t.numel())
        return tensors

    def gather(self, outputs: Sequence[Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], root: int,
               timeout_ms: int, async_op: bool = True) -> Work:
        name = "gather"
        device = self._device(name, inputs, *outputs)
        t = self._one(name, inputs)
        self._root(name, root)
        outs = self._root_list(name, outputs, "output", t, root)

        def issue(views: list, handles: list):
            src = HostBuffer(views[0], raw=True)
            dsts = [HostBuffer(v, raw=True, load=False) for v in views[1:]]
            handles.append(self.transport.gather([d.t for d in dsts], src.t, root, timeout_ms))

            def finish() -> None:
                for d in dsts:
                    d.store()
            return finish

        return self._submit(name, device, [Op([t, *outs], issue, self._signature(
            f"gather {describe(t)} root={root}"))], outs, async_op=async_op)

    def scatter(self, outputs: Sequence[torch.Tensor], inputs: Sequence[Sequence[torch.Tensor]], root: int,
                timeout_ms: int, async_op: bool = True) -> Work:
        name = "scatter"
        device = self._device(name, outputs, *inputs)
        t = self._one(name, outputs)
        self._root(name, root)
        ins = self._root_list(name, inputs, "input", t, root)

        def issue(views: list, handles: list):
            dst = HostBuffer(views[0], raw=True, load=False)
            srcs = [HostBuffer(v, raw=True) for v in views[1:]]
            handles.append(self.transport.scatter(dst.t, [s.t for s in srcs], root, timeout_ms))
            return dst.store

        return self._submit(name, device, [Op([t, *ins], issue, self._signature(
            f"scatter {describe(t)} root={root}"))], [t], async_op=async_op)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                      input_splits: list[int], timeout_ms: int, async_op: bool = True) -> Work:
        name = "all_to_all_single"
        device = self._device(name, [output, input])
        if output.dtype != input.dtype:
            raise RuntimeError(f"occl: {name} output is {output.dtype}, input is {input.dtype}")
        ins = self._splits(name, "input", input, input_splits)
        outs = self._splits(name, "output", output, output_splits)
        row = input.element_size() * (input[0].numel() if input.dim() and input.shape[0] else 0)
        out_row = output.element_size() * (output[0].numel() if output.dim() and output.shape[0] else 0)

        def issue(views: list, handles: list):
            out, src = HostBuffer(views[0], raw=True, load=False), HostBuffer(views[1], raw=True)
            handles.append(self.transport.alltoall(out.t, src.t, [n * out_row for n in outs],
                                                   [n * row for n in ins], timeout_ms))
            return out.store

        return self._submit(name, device, [Op([output, input], issue, self._signature(
            f"{name} {describe(input).split('[')[0]}",
            f"{name} {describe(input)} splits {ins} into {describe(output)} splits {outs}",
            sends=[n * row for n in ins], recvs=[n * out_row for n in outs]))], [output], async_op=async_op)

    def _splits(self, name: str, what: str, t: torch.Tensor, splits: list[int]) -> list[int]:
        rows = t.shape[0] if t.dim() else 1
        if not splits:
            if rows % self.size:
                raise RuntimeError(f"occl: {name} {what} has {rows} rows, not divisible by the world size "
                                   f"({self.size}); pass split sizes")
            return [rows // self.size] * self.size
        if len(splits) != self.size or any(s < 0 for s in splits) or sum(splits) != rows:
            raise RuntimeError(f"occl: {name} {what} split sizes {list(splits)} must be {self.size} non-negative "
                               f"sizes adding up to its {rows} rows")
        return list(splits)

    def alltoall(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], timeout_ms: int,
                 async_op: bool = True) -> Work:
        name = "all_to_all"
        device = self._device(name, outputs, inputs)
        if len(outputs) != self.size or len(inputs) != self.size:
            raise RuntimeError(f"occl: {name} needs one input and one output per rank ({self.size}), got "
                               f"{len(inputs)} inputs and {len(outputs)} outputs")
        t = inputs[0]
        self._same(name, t, [*inputs, *outputs], "tensor")
        sends = [i.numel() * i.element_size() for i in inputs]
        recvs = [o.numel() * o.element_size() for o in outputs]
        n = self.size

        def issue(views: list, handles: list):
            src = torch.cat([HostBuffer(v, raw=True).t for v in views[n:]])
            dst = torch.empty(sum(recvs), dtype=torch.uint8)
            handles.append(self.transport.alltoall(dst, src, recvs, sends, timeout_ms))

            def finish() -> None:
                for part, view in zip(dst.split(recvs), views[:n]):
                    out = HostBuffer(view, raw=True, load=False)
                    out.t.copy_(part)
                    out.store()
            return finish

        return self._submit(name, device, [Op([*outputs, *inputs], issue, self._signature(
            f"{name} {describe(t).split('[')[0]}", f"{name} sends {sends} bytes, receives {recvs} bytes",
            sends=sends, recvs=recvs))], list(outputs), async_op=async_op)

    # LITERALINCLUDE START: OCCL P2P
    def send(self, tensors: Sequence[torch.Tensor], dst: int, tag: int) -> Work:
        name = "send"
        device = self._device(name, tensors)
        t = self._one(name, tensors)
        self._peer(name, dst)
        header = Header(t)
        with self._lock:  # the header goes ahead at launch time, in program order
            self._start([])
            sent_header = self.transport.send_header(header.buffer, dst, tag)

        def issue(views: list, handles: list):
            handles.append(self.transport.send(HostBuffer(views[0], raw=True).t, dst, tag))
            handles.append(sent_header)

        return self._submit(name, device, [Op([t], issue, verify=lambda: None)], [])

    def recv(self, tensors: Sequence[torch.Tensor], src: int, tag: int) -> Work:
        """Receive from ``src`` (``-1``: any source); the sender's header is checked before its data."""
        name = "recv" if src >= 0 else "recv_anysource"
        device = self._device(name, tensors)
        t = self._one(name, tensors)
        if src >= 0:
            self._peer(name, src)
        expected, received = Header(t), Header.empty()
        with self._lock:
            self._start([])
            got_header = self.transport.recv_header(received, src, tag)

        def verify() -> None:
            got_header.wait()
            sender = got_header.source_rank() if src < 0 else src
            received_op.work.source = sender
            wrong = expected.mismatch(received)
            if wrong is not None:
                nbytes, text = wrong
                drain = self.transport.recv(torch.empty(nbytes, dtype=torch.uint8), sender, tag)
                drain.wait()  # take the data off the wire: the sender's transfer completes normally
                raise MismatchError(f"occl: rank {self.rank} expected {expected.text} from rank {sender} (tag {tag}) "
                                    f"but rank {sender} sent {text}")

        def issue(views: list, handles: list):
            out = HostBuffer(views[0], raw=True, load=False)
            handles.append(self.transport.recv(out.t, received_op.work.source, tag))
            return out.store

        received_op = Op([t], issue, verify=verify)
        return self._submit(name, device, [received_op], [t], blocking=src < 0)
    # LITERALINCLUDE END: OCCL P2P

    def _peer(self, name: str, peer: int) -> None:
        if not 0 <= peer < self.size:
            raise ValueError(f"occl: {name} peer {peer} is not a rank of process group {self.group!r} "
                             f"(size {self.size})")
        if peer == self.rank:
            raise ValueError(f"occl: {name} to or from itself (rank {peer}) would never complete")

    def barrier(self, device: int | None, timeout_ms: int, async_op: bool = True) -> Work:
        """Every rank reaches this point of its stream; ``wait()`` then holds the host, as NCCL's does."""
        device = openreg.get_device() if device is None else device

        def issue(views: list, handles: list):
            handles.append(self.transport.barrier(timeout_ms))

        return self._submit("barrier", device, [Op([], issue, self._signature("barrier"))], [], blocking=True,
                            async_op=async_op)



# LITERALINCLUDE START: OCCL CREATE
def create(options, backend_options=None):
    """The creator ``Backend.register_backend`` calls (extended API): a C++ Backend over :class:`OCCL`."""
    timeout = options.timeout if isinstance(options.timeout, timedelta) else timedelta(seconds=options.timeout)
    impl = OCCL(options.store, options.group_rank, options.group_size, timeout, options.group_id)
    return _C._occl_backend(impl, options.group_rank, options.group_size, int(timeout.total_seconds() * 1000))
# LITERALINCLUDE END: OCCL CREATE
