"""What the fallback needs to know about an operator, read once from its schema: a frozen record.

Which arguments are tensors and which are written (``Tensor(a!)``), which returns alias which
argument, whether it draws random numbers, and the few lists of operators whose CPU kernel needs a
rule of its own. :func:`traits_of` builds the record the first time an operator is seen.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import torch

# How much of where a tensor sits in its storage is part of a call shape (``OpTraits.placed``, arguments.call_key):
UNPLACED = 0  # none: fresh outputs do not depend on it, so the slices of one tensor share one call shape
ABSOLUTE = 1  # the storage offset and size: a view's offset is its input's plus the view's own
RELATIVE = 2  # the storage size, and the offset only against the other arguments in the same storage: what
#               an in-place or out= kernel's overlap checks see (``x[i] += y[i]`` for every i is one call shape)

# LITERALINCLUDE START: NUMBER KEYS
# How a Python number argument counts in a call shape (``OpTraits.numbers``, arguments.call_key):
NUMBER_VALUE = 0  # its type and value: a number may shape the outputs (a size, a dimension, arange's end)
NUMBER_TYPE = 1  # its type alone: optimizers' numbers (foreach, fused), which change every step
NUMBER_CLASS = 2  # its type and its value's class (arguments.number_class): a pointwise operator's numbers shape
#                   its outputs by their type alone, and its checks see only a number's sign, zero, NaN, infinity
#                   and the dtype limits it exceeds (an int8 or float16 overflow), never the value itself
# LITERALINCLUDE END: NUMBER KEYS

# LITERALINCLUDE START: NEVER FALLBACK
# Operators whose CPU kernel would be wrong for device memory: they raise instead.
NEVER_FALLBACK = {
    "aten::_pin_memory": "pinning applies to CPU tensors; openreg memory is device memory",
    "aten::_pin_memory.out": "pinning applies to CPU tensors; openreg memory is device memory",
    "aten::to_mkldnn": "MKL-DNN tensors live on the CPU only; copy the tensor to the CPU first",
}
# Operators that may take CPU index tensors alongside openreg tensors (as on CUDA).
CPU_INDICES_OK = {
    "aten::index.Tensor", "aten::index.Tensor_out", "aten::index_put_", "aten::index_put", "aten::_index_put_impl_",
    # PyTorch's test_sort_and_select fills a CUDA tensor at CPU indices (index_fill with a 1-element CPU index)
    "aten::index_fill_.int_Scalar", "aten::index_fill_.int_Tensor", "aten::index_fill.int_Scalar",
    "aten::index_fill.int_Tensor",
}
# The foreach pointwise operators' packed ``scalars`` tensor, which CUDA's kernels require on the CPU (and refuse
# on the device: "Expected scalars to be on CPU")
CPU_SCALARS = {
    "aten::_foreach_addcdiv.Tensor", "aten::_foreach_addcdiv_.Tensor", "aten::_foreach_addcdiv.Tensor_out",
    "aten::_foreach_addcmul.Tensor", "aten::_foreach_addcmul_.Tensor", "aten::_foreach_addcmul.Tensor_out",
}
CPU_INDICES_OK |= CPU_SCALARS
# Operators whose meta kernel disagrees with their CPU kernel on output shapes or dtypes (the meta
# kernels follow CUDA: e.g. eval-mode batch norm statistics of size C, not 0; float statistics for
# bfloat16 inputs). The CPU kernel decides what they return: they always run now (``Route.NOW``).
CPU_DECIDES_OUTPUTS = {"aten::_batch_norm_with_update", "aten::_embedding_bag", "aten::_embedding_bag_forward_only"}
# The ranges' out= overloads: the CPU kernel keeps an out= tensor of the right number of elements in its own shape
# and strides (``torch.arange(0, 4, out=x.narrow(1, 1, 2))`` fills the 2x2 view), where the meta kernel resizes
# it to 1-d, which wrote the values onto the wrong elements. The CPU kernel decides them too.
CPU_DECIDES_OUT = ("aten::arange", "aten::linspace", "aten::logspace", "aten::range")
# Normalizations whose statistics outputs (1 and 2) the CPU kernel shapes its own way: in the input's
# dtype unless a reduced-precision input meets float32 parameters, and empty when not training. The
# meta run's outputs are corrected by that rule (cpu_rules.cpu_statistics), so they stay queued.
CPU_STATISTICS = {"aten::native_batch_norm", "aten::_native_batch_norm_legit", "aten::native_layer_norm"}
# The convolution's meta kernel gives a contiguous output where the CPU's oneDNN kernel keeps a
# channels-last input or weight channels-last: the meta run's output takes the CPU's layout (cpu_rules.cpu_layout).
CPU_LAYOUT = {"aten::convolution"}
# Operators whose CPU kernel gives ``torch.result_type`` of its first two arguments where PyTorch's meta kernel
# differs: ``pow(bool_tensor, True)`` is bool on the CPU (and CUDA), int64 by the meta kernel (test_foreach's
# test_parity for _foreach_pow compares with per-tensor pow). Functional overloads only (cpu_rules.result_type).
CPU_RESULT_TYPE = {"aten::pow"}
# Operators whose CPU kernel allocates its first output in the suggested memory format of one input (the position
# given), where the meta kernel gives a contiguous one: PyTorch's test_modules checks channels-last outputs of the
# padding modules (cpu_rules.input_layout); the backward kernels' gradient takes the layout of ``self`` (argument 1).
CPU_LAYOUT_OF_INPUT = {
    **dict.fromkeys(("aten::reflection_pad2d", "aten::reflection_pad3d", "aten::replication_pad2d",
                     "aten::replication_pad3d", "aten::max_pool3d_with_indices"), 0),
    **dict.fromkeys(("aten::reflection_pad2d_backward", "aten::reflection_pad3d_backward",
                     "aten::replication_pad2d_backward", "aten::replication_pad3d_backward"), 1),
}
# Of those, the ones whose 4-D input is one unbatched volume (C, D, H, W): the CPU kernel lays its outputs out as
# channels_last_3d of the batch of one, where its input is laid out so (test_pooling's test_max_pool3d_ndhwc).
UNBATCHED_3D = {"aten::max_pool3d_with_indices"}
# Operators whose CUDA kernel reads its inputs on the host to check them (``.item()``: the host waits), so that a
# bad value raises at the call, not at a later synchronization: such calls run now (``Route.NOW``). The value says
# which calls check, from the call (aten/call.py): segment_reduce only without ``unsafe``; histc when it takes its
# range from the data (min == max).
HOST_CHECKS = {
    "aten::segment_reduce": lambda call: not call.named("unsafe"),
    "aten::histc": lambda call: call.named("min") == call.named("max"),
}
# LITERALINCLUDE END: NEVER FALLBACK


# LITERALINCLUDE START: OP TRAITS
class Kind(enum.Enum):
    """What a return is: a new tensor, a view of an argument, or an argument it writes (in place, out=)."""

    FRESH = "fresh"
    VIEW = "view"
    INPLACE = "inplace"


@dataclass(frozen=True)
class Return:
    kind: Kind
    arg: int | None  # the argument a VIEW or INPLACE return aliases


@dataclass(frozen=True, eq=False)
class OpTraits:
    """What the fallback knows about one operator overload (built by :func:`traits_of`)."""

    name: str  # "aten::add.Tensor"
    schema_name: str  # "aten::add"
    blocked: str | None  # why it must never fall back (NEVER_FALLBACK), or None
    arguments: tuple  # the schema's arguments
    positions: dict[str, int]  # argument name -> position
    tensor_args: tuple[int, ...]  # positions of the ``Tensor`` arguments (a Python number may stand there)
    generators: tuple[str, ...]  # the ``Generator?`` arguments: replaced by the device generator's CPU state
    out_args: tuple[str, ...]  # keyword-only written arguments (``out=``)
    returns: tuple[Return, ...]
    mutates: bool  # writes an argument
    functional: bool  # returns only fresh tensors and writes nothing
    returns_tensors: bool  # returns only tensors (else the host needs the values now)
    numbers: int  # how its Python numbers count in a call shape (NUMBER_VALUE / NUMBER_TYPE / NUMBER_CLASS)
    # How much of where its tensors sit in their storage its outputs and checks depend on (arguments.py's
    # UNPLACED / ABSOLUTE / RELATIVE): a view's offset is absolute; written arguments need only the overlaps
    # with the other arguments (relative); fresh outputs need none, so the slices of a tensor (``x[i]`` for
    # each row) share one call shape (one meta run, one checking run, one plan), not one each.
    placed: int
    loss: bool  # has a ``reduction`` argument
    cpu_decides: bool  # CPU_DECIDES_OUTPUTS
    cpu_statistics: bool  # CPU_STATISTICS
    cpu_layout: bool  # CPU_LAYOUT
    layout_of: int | None  # CPU_LAYOUT_OF_INPUT (functional overloads only)
    cpu_result_type: bool  # CPU_RESULT_TYPE (functional overloads only)
    host_checks: Any  # HOST_CHECKS: which calls the host checks (None: none)
    pure_view: bool  # returns views of its arguments and writes nothing: metadata only, no kernel
    # The host waits for the device because of the data, as it would on CUDA (not because of what the simulator
    # needs): PyTorch tags such operators. The sync debug mode (torch.openreg.set_sync_debug_mode) reports these.
    host_waits: bool

    def value(self, args: tuple, kwargs: dict, index: int) -> Any:
        """The argument at ``index`` as called (its default when not passed)."""
        if index < len(args):
            return args[index]
        a = self.arguments[index]
        return kwargs.get(a.name, a.default_value if a.has_default_value() else None)


def _is_write(a: Any) -> bool:
    return a.alias_info is not None and a.alias_info.is_write


def traits_of(op: torch._ops.OpOverload) -> OpTraits:
    """The traits of ``op``, read from its schema the first time it is seen."""
    traits = _traits.get(op)
    if traits is None:
        traits = _traits[op] = _read(op)
    return traits


def _read(op: torch._ops.OpOverload) -> OpTraits:
    schema = op._schema
    name = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    arguments = tuple(schema.arguments)
    alias_args = {s: i for i, a in enumerate(arguments) if a.alias_info is not None for s in a.alias_info.before_set}
    returns = tuple(
        Return(Kind.FRESH, None) if r.alias_info is None else Return(
            Kind.INPLACE if r.alias_info.is_write else Kind.VIEW, alias_args.get(next(iter(r.alias_info.before_set)))
        )
        for r in schema.returns
    )
    mutates = any(_is_write(a) for a in arguments)
    out_args = tuple(a.name for a in arguments if a.kwarg_only and _is_write(a))
    return OpTraits(
        name=name,
        schema_name=schema.name,
        blocked=NEVER_FALLBACK.get(name) or NEVER_FALLBACK.get(schema.name),
        arguments=arguments,
        positions={a.name: i for i, a in enumerate(arguments)},
        tensor_args=tuple(i for i, a in enumerate(arguments) if str(a.type) == "Tensor"),
        generators=tuple(a.name for a in arguments if "Generator" in str(a.type)),
        out_args=out_args,
        returns=returns,
        mutates=mutates,
        functional=bool(returns) and not mutates and all(
            r.kind is Kind.FRESH and str(s.type) == "Tensor" for r, s in zip(returns, schema.returns)
        ),
        returns_tensors=all(str(r.type) in ("Tensor", "List[Tensor]", "Optional[Tensor]") for r in schema.returns),
        # An optimizer's numbers (a learning rate, Adam's bias corrections) change every step but never the
        # output metadata: keying calls by their values would treat every step as a new call shape.
        numbers=_numbers(schema.name, op.tags),
        placed=_placement(returns, mutates),
        loss="reduction" in (a.name for a in arguments),
        cpu_decides=schema.name in CPU_DECIDES_OUTPUTS or (schema.name in CPU_DECIDES_OUT and bool(out_args)),
        cpu_statistics=schema.name in CPU_STATISTICS,
        cpu_layout=schema.name in CPU_LAYOUT,
        layout_of=None if out_args else CPU_LAYOUT_OF_INPUT.get(schema.name),
        cpu_result_type=schema.name in CPU_RESULT_TYPE and not out_args and not mutates,
        host_checks=HOST_CHECKS.get(schema.name),
        pure_view=bool(returns) and not mutates and all(r.kind is Kind.VIEW for r in returns),
        host_waits=bool({torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output} & set(op.tags))
        or schema.name in HOST_CHECKS,
    )


def _numbers(name: str, tags: list) -> int:
    if name.startswith(("aten::_foreach_", "aten::_fused_")):
        return NUMBER_TYPE
    if torch.Tag.pointwise in tags and torch.Tag.nondeterministic_seeded not in tags:
        return NUMBER_CLASS  # LBFGS's ``p.add_(d, alpha=t)`` with a new t each step: one call shape, not one each
    return NUMBER_VALUE


def _placement(returns: tuple, mutates: bool) -> int:
    if any(r.kind is Kind.VIEW for r in returns) or not (returns or mutates):
        return ABSOLUTE
    return RELATIVE if mutates or any(r.kind is not Kind.FRESH for r in returns) else UNPLACED


_traits: dict[torch._ops.OpOverload, OpTraits] = {}
# LITERALINCLUDE END: OP TRAITS
