"""Writing straight into device memory through a CPU ``out=`` kernel: saves a copy of every output.

The mechanism runs the functional CPU kernel and copies its results into the outputs, and hands an
``out=`` kernel host tensors it copies in afterwards. Most operators have a real CPU ``out=`` kernel:
given the outputs' host views as ``out``, it computes in place. This module finds a functional
operator's ``out=`` overload and holds the kernel that runs it, with the two cases where a host view
of device memory cannot be handed over as it is (a kernel that resizes ``out``, or restrides it).
"""

from __future__ import annotations

import torch

from ..outputs import CpuDisagrees, copy_into
from ..traits import Kind, OpTraits


# LITERALINCLUDE START: OUT OVERLOAD
def out_overload(op: torch._ops.OpOverload, traits: OpTraits) -> tuple[torch._ops.OpOverload, tuple[str, ...]] | None:
    """The ``out=`` overload of a functional operator and the names of its ``out=`` arguments, if it has a
    real one (not PyTorch's generated functional-then-copy wrapper, which the functional kernel beats)."""
    found = _out_overload(op, traits)
    return None if found is None or _copies_after_all(found[0]) else found


def copying_out_overload(op: torch._ops.OpOverload,
                         traits: OpTraits) -> tuple[torch._ops.OpOverload, tuple[str, ...]] | None:
    """The generated functional-then-copy ``out=`` overload of a functional operator, if that is what it has:
    for small outputs (``dot``'s 0-dim result) its copy costs less than serving the functional kernel's
    allocations from device memory."""
    found = _out_overload(op, traits)
    return found if found is not None and _copies_after_all(found[0]) else None


def _out_overload(op: torch._ops.OpOverload, traits: OpTraits) -> tuple[torch._ops.OpOverload, tuple[str, ...]] | None:
    # an operator returning only fresh tensors or lists of them (the functional _foreach_ operators), writing nothing
    if not traits.returns or traits.mutates or any(r.kind is not Kind.FRESH for r in traits.returns):
        return None
    # The out= overload is usually "out" or "<overload>_out", but some are named after their
    # output ("threshold_backward.grad_input"): any overload with the same inputs plus one
    # keyword-only written tensor per return qualifies, the conventional names first.
    packet, overload = op.overloadpacket, op._schema.overload_name
    first = "out" if overload in ("", "default") else f"{overload}_out"
    inputs = [(a.name, str(a.type)) for a in op._schema.arguments]
    for candidate in [first, *(o for o in packet.overloads() if o != first)]:
        out_op = getattr(packet, candidate, None)
        if out_op is None or out_op is op:
            continue
        out_args = out_op._schema.arguments
        names = tuple(a.name for a in out_args if a.kwarg_only and a.alias_info and a.alias_info.is_write)
        rest = [(a.name, str(a.type)) for a in out_args if a.name not in names]
        if names and rest == inputs and len(names) == len(traits.returns):
            return None if out_op.name() in _UNFAITHFUL else (out_op, names)
    return None


# out= kernels that do not compute what their functional operator does (the functional kernel runs instead):
# - without the functional operator's argument checks: the CPU's functional ``max()`` and ``min()`` refuse an
#   empty tensor, their ``unary_out`` kernels return -inf / inf for it;
# - batch norm's CPU out= kernels in training mode read a non-contiguous input as if it were contiguous (wrong
#   outputs and statistics, PyTorch 2.13's ``batch_norm_cpu_out``; the functional kernel passes them a
#   contiguous copy): test_modules' test_non_contiguous_tensors of BatchNorm with track_running_stats=False.
_UNFAITHFUL = {"aten::max.unary_out", "aten::min.unary_out", "aten::native_batch_norm.out",
               "aten::_native_batch_norm_legit.out", "aten::_native_batch_norm_legit.no_stats_out"}


def _copies_after_all(out_op: torch._ops.OpOverload) -> bool:
    """Whether an out= overload is PyTorch's generated one for the CPU (``convolution.out``,
    ``native_layer_norm.out``, ``clone.out``): it runs the functional kernel into a new tensor and copies
    that into ``out``. The functional kernel, with its outputs allocated in device memory, does better."""
    name = out_op.name()
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    return not has(name, "CPU") and has(name, "CompositeExplicitAutograd")
# LITERALINCLUDE END: OUT OVERLOAD


# LITERALINCLUDE START: OUT KERNEL
def reduces(traits: OpTraits, outputs: list, tensors: list) -> bool:
    """Whether a loss reduces (every output smaller than an input): its CPU out= kernel uses ``out``
    as scratch space for the unreduced values and so resizes it. Other reductions (``sum``, a matrix
    product with a small result) write ``out`` directly; one that does not is learned at its first run."""
    if not traits.loss:
        return False
    biggest = max((t.numel() for t in tensors), default=0)
    return bool(outputs) and all(o.numel() < biggest for o in outputs)


class OutKernel:
    """A queued ``out=`` kernel over host views (a class, not a closure: see ``fallback.CopyKernel``)."""

    __slots__ = ("name", "out_op", "cpu_args", "cpu_kwargs", "names", "scratch", "plan")
    fresh = False  # whether the outputs are the fallback's own, allocated from the meta run (not the caller's)

    def __init__(self, name: str, out_op, cpu_args: tuple, cpu_kwargs: dict, names: tuple, scratch: bool,
                 plan=None) -> None:
        self.name, self.out_op, self.cpu_args, self.cpu_kwargs = name, out_op, cpu_args, cpu_kwargs
        self.names, self.scratch, self.plan = names, scratch, plan

    def __call__(self) -> None:
        out_op, cpu_args, cpu_kwargs, plan = self.out_op, self.cpu_args, self.cpu_kwargs, self.plan
        if plan is not None and plan.clean:  # this call shape's CPU kernel kept its outputs as given: it will again
            out_op._op(*cpu_args, **cpu_kwargs)  # (OpOverload.__call__'s own call, without its frame)
            return
        if not self.scratch and id(out_op) not in _SCRATCH:  # (by id: an OpOverload hashes in Python)
            views = [v for v in [cpu_kwargs[n] for n in self.names] if isinstance(v, torch.Tensor)]
            shapes = [(v.shape, v.stride()) for v in views]
            try:
                out_op._op(*cpu_args, **cpu_kwargs)
                clean = True
                for view, (shape, stride) in zip(views, shapes):
                    if view.shape != shape:  # shrunk in place: the CPU's output shape is not the meta kernel's
                        raise CpuDisagrees(f"{self.name}: the CPU kernel resized an output from "
                                           f"{tuple(shape)} to {tuple(view.shape)}")
                    if view.stride() != stride:
                        _restride_back(view, stride)
                        clean = False
                if clean and plan is not None:  # (the outputs' geometry is a function of the call shape)
                    plan.clean = True
                return
            except RuntimeError as exc:
                message = str(exc)
                if self.fresh and message.startswith(_OUT_DTYPE):
                    # outputs allocated from the meta run in another dtype than the CPU's out= kernel gives them
                    # (``nll_loss_forward``'s total_weight: the weight's dtype on meta, the input's on the CPU)
                    raise CpuDisagrees(f"{self.name}: {message.splitlines()[0]}") from None
                if "not resizable" not in message:
                    raise
                _SCRATCH.add(id(out_op))
        # Some CPU out= kernels use ``out`` as scratch space and resize it (losses with a reduction
        # do). A host view of device memory cannot grow: compute into host tensors, then copy them in.
        copy_into(self.name, list(zip((cpu_kwargs[n] for n in self.names), self.on_host())))

    def on_host(self) -> list:
        """The results, computed into host tensors: the out= kernel given empty ones it sizes itself."""
        host = {n: _host_tensors(self.cpu_kwargs[n]) for n in self.names}
        self.out_op(*self.cpu_args, **{k: v for k, v in self.cpu_kwargs.items() if k not in host}, **host)
        return [host[n] for n in self.names]


class FunctionalOutKernel(OutKernel):
    """The ``out=`` kernel of a functional operator, which computes on the host through the operator itself
    (``binary_cross_entropy.out`` given a host tensor to size returns another reduction than the CPU's)."""

    __slots__ = ("functional",)
    fresh = True

    def __init__(self, name: str, functional, out_op, cpu_args: tuple, cpu_kwargs: dict, names: tuple,
                 scratch: bool, plan=None) -> None:
        self.name, self.out_op, self.cpu_args, self.cpu_kwargs = name, out_op, cpu_args, cpu_kwargs
        self.names, self.scratch, self.functional = names, scratch, functional  # (no super() call: per launch)
        self.plan = plan

    def on_host(self) -> list:
        result = self.functional(*self.cpu_args, **{k: v for k, v in self.cpu_kwargs.items() if k not in self.names})
        return [result] if len(self.names) == 1 else list(result)


def _host_tensors(views):
    """Empty host tensors of the views' dtypes, for a kernel to size as it likes."""
    if isinstance(views, torch.Tensor):
        return torch.empty(0, dtype=views.dtype)
    return [torch.empty(0, dtype=v.dtype) if v is not None else None for v in views]


def _restride_back(view: torch.Tensor, stride: tuple) -> None:
    """Undo an out= kernel's restriding of a host view (``max_unpool2d`` lays a channels-last result out
    channels-last): the device tensor keeps the strides it was given, so the values are moved to them."""
    values = view.clone()
    view.as_strided_(view.size(), stride)
    view.copy_(values)


# The out= overloads' own check of a given output's dtype (a structured kernel's): given the fallback's outputs, it
# means the meta kernel typed them otherwise than the CPU kernel does, which then decides (``CpuDisagrees``): a
# call the CPU refuses raises the functional kernel's own error, as on the CPU.
_OUT_DTYPE = "Expected out tensor to have dtype"
_SCRATCH: set = set()  # ids of the out= overloads whose CPU kernel turned out to resize ``out`` (learned)
# LITERALINCLUDE END: OUT KERNEL
