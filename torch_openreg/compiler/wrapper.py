"""Inductor's Python wrapper code for openreg: allocation on the right device, kernels as stream launches.

Inductor's ``PythonWrapperCodegen`` writes the ``call(args)`` function that runs a compiled graph: it
allocates buffers, calls kernels and extern kernels, frees buffers. For openreg three things change:

* buffers are allocated with ``empty_strided_openreg(size, stride, dtype, index)``, on the device index
  of the buffer (PyTorch writes ``empty_strided(..., device='openreg')``, which loses the index);
* a C++ kernel call becomes a launch on the device's current stream (PyTorch raises "device openreg
  nyi" for C++ kernels on devices other than the CPU and MPS);
* consecutive kernel calls, with only memory planning between them, become *one* launch that runs them
  in order: a launch costs microseconds of Python, the small kernels of a fused graph often less.

Extern kernels (``extern_kernels.mm``) and fallback operators (``aten.xxx``) stay as they are: they are
eager openreg operators, which launch their own kernels on the same stream, in program order.
"""

from __future__ import annotations

import dataclasses

from torch._inductor.codegen.common import IndentedBuffer
from torch._inductor.codegen.wrapper import (
    CommentLine,
    FreeIfNotReusedLine,
    FreeLine,
    KernelCallLine,
    KernelDefinitionLine,
    MemoryPlanningLine,
    PythonWrapperCodegen,
    ReuseLine,
    SubgraphPythonWrapperCodegen,
    WrapperLine,
)
from torch._inductor.utils import LineContext
from torch._inductor.virtualized import V


# LITERALINCLUDE START: LAUNCH LINE
@dataclasses.dataclass
class LaunchKernelsLine(WrapperLine):
    """One launch on ``openreg:index``'s current stream running ``kernels`` in order."""

    index: int
    kernels: list[tuple[str, list[str], list[str]]]  # (kernel name, call args, tensor args)

    def codegen(self, code: IndentedBuffer) -> None:
        tensors = list(dict.fromkeys(t for _, _, names in self.kernels for t in names))
        calls = ", ".join(f"{name}, ({''.join(a + ', ' for a in args)})" for name, args, _ in self.kernels)
        label = "+".join(name for name, _, _ in self.kernels)
        code.writeline(f"launch_kernels({self.index}, {label!r}, ({''.join(t + ', ' for t in tensors)}), {calls})")


def _is_openreg_cpp_call(line: object) -> bool:
    return isinstance(line, KernelCallLine) and not line.triton and line.device.type == "openreg"


def _launch_of(call: KernelCallLine) -> tuple[str, list[str], list[str]]:
    """(kernel, call arguments, tensor arguments) of a kernel call, for a launch.

    A host (CPU) tensor the kernel only reads, such as an optimizer's step count, is copied at launch
    time: the kernel runs later, and the host may change the tensor meanwhile (the next CPU kernel of the
    same graph increments that step count at once). Device tensors need no copy: the stream orders them.
    """
    args = [str(a) for a in call.call_args]
    types = [str(t) for t in (call.arg_types or [])]
    tensors = [a for a, t in zip(args, types) if t.endswith("*")]  # C++ pointer arguments
    args = [f"{a}.clone()" if t.startswith("const") and t.endswith("*") and _on_host(a) else a
            for a, t in zip(args, types)] + args[len(types):]
    return call.kernel_name, args, tensors


def _on_host(name: str) -> bool:
    buffer = V.graph.try_get_buffer(name)
    device = buffer.get_device() if buffer is not None else None
    return device is not None and device.type == "cpu"
# LITERALINCLUDE END: LAUNCH LINE


# LITERALINCLUDE START: GROUP LAUNCHES
def group_launches(lines: list) -> list:
    """Merge each run of openreg kernel calls separated only by memory planning into one launch.

    The launch takes the place of the run's last kernel call. Allocations in the run stay before it;
    frees in the run move after it (the launch still names those buffers); a buffer reused under a new
    name in the run is named by its new name in the kernels before the reuse (same memory).
    """
    out: list = []
    run: list = []  # lines from the first kernel call of the current run

    def flush() -> None:
        calls = [i for i, line in enumerate(run) if _is_openreg_cpp_call(line)]
        if not calls:
            out.extend(run)
            run.clear()
            return
        kernels: list[tuple[str, list[str], list[str]]] = []
        frees: list = []
        for line in run[: calls[-1] + 1]:
            if _is_openreg_cpp_call(line):
                kernels.append(_launch_of(line))
            elif isinstance(line, (FreeIfNotReusedLine, FreeLine)):
                frees.append(line)
            else:
                if isinstance(line, ReuseLine):
                    old, new = line.node.get_name(), line.reused_as.get_name()
                    kernels = [(k, _rename(a, old, new), _rename(t, old, new)) for k, a, t in kernels]
                out.append(line)
        out.append(LaunchKernelsLine(run[calls[0]].device.index, kernels))
        out.extend(frees)
        out.extend(run[calls[-1] + 1:])
        run.clear()

    for line in lines:
        if _is_openreg_cpp_call(line):
            run.append(line)
        elif run and _between_launches(line):
            run.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return out


def _between_launches(line: object) -> bool:
    """Lines that may sit inside a merged launch's span: memory planning, kernel definitions (they go to the
    module's header), comments and line contexts (bookkeeping for debug output)."""
    if isinstance(line, str):
        return line.lstrip().startswith("#")
    return isinstance(line, (MemoryPlanningLine, FreeLine, CommentLine, KernelDefinitionLine, LineContext))


def _rename(names: list[str], old: str, new: str) -> list[str]:
    return [new if n == old else n for n in names]
# LITERALINCLUDE END: GROUP LAUNCHES


# LITERALINCLUDE START: WRAPPER CODEGEN
class _OpenRegWrapper:
    """The overrides, shared by the graph wrapper and the subgraph wrapper (control flow, regions)."""

    def write_header(self) -> None:
        super().write_header()
        self.imports.writeline("from torch_openreg.compiler.runtime import empty_strided_openreg, launch_kernels")

    def make_allocation(self, name, device, dtype, shape, stride, allocation_shape=None, is_pinned=False) -> str:
        if device.type != "openreg":
            return super().make_allocation(name, device, dtype, shape, stride, allocation_shape, is_pinned)
        allocation_shape = shape if allocation_shape is None else allocation_shape
        size, strides = self.codegen_python_shape_tuple(allocation_shape), self.codegen_python_shape_tuple(stride)
        index = device.index if device.index is not None else V.graph.get_current_device_or_throw().index
        out = f"{name} = empty_strided_openreg({size}, {strides}, {dtype}, {index})"
        if allocation_shape != shape:
            out += f".as_strided({self.codegen_python_shape_tuple(shape)}, {strides})"
        return out

    def run_wrapper_ir_passes(self, is_inference: bool) -> None:
        super().run_wrapper_ir_passes(is_inference)  # memory planning first: it decides frees and reuses
        self.lines = group_launches(self.lines)

    def _generate_kernel_call_helper(self, kernel_name, call_args, *, device=None, triton=True, **kwargs) -> None:
        device = device or V.graph.get_current_device_or_throw()
        if device.type == "openreg" and not triton:  # a call the grouping pass did not see: a launch of its own
            call = KernelCallLine(self, kernel_name, call_args, (), (), kwargs.get("arg_types"), False, {}, None,
                                  device, "", "")
            LaunchKernelsLine(device.index, [_launch_of(call)]).codegen(self.wrapper_call)
            return
        super()._generate_kernel_call_helper(kernel_name, call_args, device=device, triton=triton, **kwargs)


class OpenRegPythonWrapperCodegen(_OpenRegWrapper, PythonWrapperCodegen):
    """``PythonWrapperCodegen`` for openreg graphs."""

    @staticmethod
    def create(is_subgraph, subgraph_name, parent_wrapper, partition_signatures=None) -> PythonWrapperCodegen:
        if is_subgraph:
            return OpenRegSubgraphWrapperCodegen(subgraph_name, parent_wrapper, partition_signatures)
        return OpenRegPythonWrapperCodegen()


class OpenRegSubgraphWrapperCodegen(_OpenRegWrapper, SubgraphPythonWrapperCodegen):
    """``SubgraphPythonWrapperCodegen`` for openreg: subgraphs (``torch.cond``, regions) launch the same way."""

    def write_header(self) -> None:
        SubgraphPythonWrapperCodegen.write_header(self)  # a subgraph shares its parent's imports
# LITERALINCLUDE END: WRAPPER CODEGEN


