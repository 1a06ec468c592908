"""What each openreg launch costs, for the runtime's timing model: FLOPs from PyTorch's own formulas
(``torch.utils.flop_counter``), bytes from the tensors read and written, the class of kernel.

The runtime launch carries an optional :class:`openreg.timing.Cost`; the launch sites of this package
call the ``price_*`` functions below, only while simulated time is on (``openreg.timing.active``), and
the functions hand the cost to the runtime with ``openreg.timing.next_cost`` for the launch that
follows. An operator's cost is memoized by its arguments' metadata, so a training loop pays one meta
run per call shape.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

import openreg
from openreg.timing import Cost

aten = torch.ops.aten

# LITERALINCLUDE START: TIMING KINDS
MATRIX = {
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_scaled_mm", "_int_mm",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward",
    "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_backward", "_efficient_attention_backward",
}
CONV = {
    "convolution", "_convolution", "convolution_backward", "convolution_overrideable",
    "convolution_backward_overrideable", "cudnn_convolution", "_slow_conv2d_forward", "_slow_conv2d_backward",
}
COPY = {"copy_", "clone", "_to_copy", "_copy_from", "_copy_from_and_resize", "contiguous", "_foreach_copy_"}
# Normalizations, softmaxes and losses read everything and reduce: PyTorch tags the plain reductions.
REDUCTION = {
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "native_layer_norm",
    "native_layer_norm_backward", "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
    "native_group_norm", "native_group_norm_backward", "nll_loss_forward", "nll_loss_backward", "cumsum",
    "cumprod", "sort", "topk", "_foreach_norm", "embedding_dense_backward",
}
# LITERALINCLUDE END: TIMING KINDS

_DTYPES = {
    torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
    torch.int8: "int8", torch.uint8: "int8",
    **{d: "float8" for d in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)},
}
_NUMBERS = (bool, int, float, complex)
_CACHE_SIZE = 8192
_cache: dict[tuple, Cost | None] = {}
_names: dict[torch._ops.OpOverload, str] = {}


def kind_of(op: torch._ops.OpOverload) -> str:
    """The kernel class the model prices ``op`` as."""
    name = op.overloadpacket.__name__
    base = name[:-1] if name.endswith("_") and name != "copy_" else name
    if base in MATRIX:
        return "matrix"
    if base in CONV:
        return "conv"
    if name in COPY or base in COPY:
        return "copy"
    if base in REDUCTION or torch.Tag.reduction in op.tags:
        return "reduction"
    return "elementwise"


# Whether float32 matrix products compute in TF32: kept by ``torch.backends.openreg.matmul`` (backends.py,
# above this module, which sets it with the flag).
tf32 = False


def dtype_name(dtype: torch.dtype, kind: str) -> str:
    """The model's name for the type a kernel computes in (float32 matrix products are TF32 when
    ``torch.backends.openreg.matmul.allow_tf32`` is on)."""
    name = _DTYPES.get(dtype, "float32")
    if name == "float32" and kind == "matrix" and tf32:
        return "tfloat32"
    return name


def launch_name(op: torch._ops.OpOverload) -> str:
    """The name the global fallback launches ``op`` under (``aten::add.Tensor``)."""
    name = _names.get(op)
    if name is None:
        schema = op._schema
        name = _names[op] = f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name
    return name


# LITERALINCLUDE START: TIMING PRICE OP
def price_op(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> None:
    """The global fallback's hook: the cost of the launch this operator call is about to make."""
    if op.is_view:  # metadata only: no launch to price
        return
    try:
        key = (op, _key(args), _key(kwargs), dtype_name(torch.float32, "matrix"))
        hash(key)
    except TypeError:
        key = None
    cost = _cache.get(key) if key is not None else None
    if cost is None:
        cost = estimate(op, args, kwargs)
        if key is not None:
            if len(_cache) >= _CACHE_SIZE:
                _cache.clear()
            _cache[key] = cost
    openreg.timing.next_cost(launch_name(op), cost, _host_waits(op))


def _host_waits(op: torch._ops.OpOverload) -> bool:
    """Whether a device would make the host wait for this operator: its output shapes depend on the
    data, or it returns something that is not a tensor (``equal``, ``is_nonzero``). Other synchronous
    runs are the fallback's own (its check of a call shape's first call)."""
    if {torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output} & set(op.tags):
        return True
    return not all(str(r.type) in ("Tensor", "Tensor[]", "Optional[Tensor]") for r in op._schema.returns)


def estimate(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Cost:
    """FLOPs (PyTorch's formula for the operator, when it has one), bytes read and written (the
    outputs' metadata from a run on ``meta`` tensors), the class of kernel and its data type."""
    kind = kind_of(op)
    inputs = [t for t in _tensors((args, kwargs)) if t.numel()]
    result = meta_args = meta_kwargs = None
    try:
        meta_args, meta_kwargs = _to_meta(op, args, kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = op(*meta_args, **meta_kwargs)
    except Exception:  # noqa: BLE001 - no meta kernel or data-dependent shapes: priced by its inputs
        meta_args = None
    outputs = _tensors(result)
    nbytes = sum(t.numel() * t.element_size() for t in (*inputs, *outputs))
    reference = next((t for t in (*inputs, *outputs) if t.is_floating_point()), inputs[0] if inputs else None)
    dtype = dtype_name(reference.dtype if reference is not None else torch.float32, kind)
    flops, formula = 0.0, False
    from torch.utils import flop_counter  # imported on first use, not at ``import torch``

    formula_fn = flop_counter.flop_registry.get(op.overloadpacket)
    if formula_fn is not None and meta_args is not None:
        try:
            flops, formula = float(formula_fn(*meta_args, out_val=result, **meta_kwargs)), True
        except Exception:  # noqa: BLE001 - a formula that cannot read these arguments: bytes only
            flops, formula = 0.0, False
    return Cost(kind, flops, float(nbytes), dtype, shape=_matrix_shape(op, args), formula=formula)
# LITERALINCLUDE END: TIMING PRICE OP


def _matrix_shape(op: torch._ops.OpOverload, args: tuple) -> tuple | None:
    """``(M, N, K, batch)`` of a matrix product, for the model's wave quantization."""
    name = op.overloadpacket.__name__
    try:
        if name in ("mm", "_scaled_mm", "_int_mm"):
            a, b = args[0], args[1]
            return (a.shape[0], b.shape[1], a.shape[1], 1)
        if name in ("addmm", "addmm_"):
            a, b = args[1], args[2]
            return (a.shape[0], b.shape[1], a.shape[1], 1)
        if name == "bmm":
            a, b = args[0], args[1]
            return (a.shape[1], b.shape[2], a.shape[2], a.shape[0])
        if name in ("baddbmm", "baddbmm_"):
            a, b = args[1], args[2]
            return (a.shape[1], b.shape[2], a.shape[2], a.shape[0])
    except (AttributeError, IndexError, TypeError):
        pass
    return None


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _key(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape))
    if isinstance(value, (list, tuple)):
        return tuple(_key(v) for v in value)
    if isinstance(value, dict):
        return tuple((k, _key(v)) for k, v in value.items())
    if isinstance(value, torch.Generator):
        return None
    if isinstance(value, _NUMBERS):
        return (type(value), value)
    return value


def _to_meta(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The call's arguments on ``meta``: tensors (and numbers passed for tensors) become meta tensors,
    generators go, a device argument becomes ``meta``."""
    tensor_args = {i for i, a in enumerate(op._schema.arguments) if str(a.type) == "Tensor"}

    def meta(value: Any, tensor: bool = False) -> Any:
        if isinstance(value, torch.Tensor):
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        if tensor and isinstance(value, _NUMBERS):
            return torch.scalar_tensor(value, device="meta")
        if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
            return type(value)(meta(v) for v in value)
        if isinstance(value, torch.Generator):
            return None
        return value

    names = [a.name for a in op._schema.arguments]
    new_args = tuple(meta(v, i in tensor_args) for i, v in enumerate(args))
    new_kwargs = {}
    for k, v in kwargs.items():
        index = names.index(k) if k in names else -1
        new_kwargs[k] = torch.device("meta") if k == "device" and v is not None else meta(v, index in tensor_args)
    return new_args, new_kwargs


# LITERALINCLUDE START: TIMING PRICE COPIES
def price_copy(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool) -> None:
    """``aten::_copy_from``'s hook: host copies cross the host link (pinned or pageable), device copies
    read and write device memory, peer copies cross the interconnect. The names are the launches'."""
    nbytes = float(dst.numel() * dst.element_size())
    if src.get_device() >= 0 and dst.get_device() >= 0:
        if src.device == dst.device:
            openreg.timing.next_cost("copy_d2d", Cost("copy", bytes=2 * nbytes, dtype=dtype_name(dst.dtype, "copy")))
        else:
            openreg.timing.next_cost("copy_peer", Cost("copy", bytes=nbytes, link="peer"))
        return
    host = src if dst.get_device() >= 0 else dst
    pinned = host.is_pinned()
    cost = Cost("copy", bytes=nbytes, link="h2d" if host is src else "d2h", pinned=pinned)
    openreg.timing.next_cost("copy_async" if non_blocking and pinned else "copy", cost)


def price_item(t: torch.Tensor) -> None:
    """``.item()``: a small device-to-host copy (pageable)."""
    openreg.timing.next_cost("item", Cost("copy", bytes=float(t.element_size()), link="d2h", pinned=False))
# LITERALINCLUDE END: TIMING PRICE COPIES


def price_kernel(name: str, tensors: tuple) -> None:
    """A compiled (Inductor) kernel: fused elementwise and reduction work, priced by the bytes of every
    tensor it touches (its FLOPs are not reachable from the generated code); matrix products in a
    compiled graph are extern kernels, priced as operators."""
    nbytes = float(sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)))
    reference = next((t for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
    dtype = dtype_name(reference.dtype, "elementwise") if reference is not None else "float32"
    openreg.timing.next_cost(name, Cost("elementwise", bytes=nbytes, dtype=dtype))


_COLLECTIVE_NAMES = (
    ("allreduce", "all_reduce"), ("all_reduce", "all_reduce"), ("reduce_scatter", "reduce_scatter"),
    ("allgather", "all_gather"), ("all_gather", "all_gather"), ("alltoall", "all_to_all"), ("all_to_all", "all_to_all"),
    ("broadcast", "broadcast"), ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"),
    ("send", "send"), ("recv", "recv"), ("barrier", "barrier"),
)


def price_collective(kernel_name: str, tensors: list, ranks: int) -> None:
    """A collective: the alpha-beta model over the profile's interconnect, for the largest buffer the
    call touches (an all-gather's output, an all-reduce's tensor)."""
    lowered = kernel_name.lower()
    collective = next((c for key, c in _COLLECTIVE_NAMES if key in lowered), "all_reduce")
    nbytes = float(max((t.numel() * t.element_size() for t in tensors), default=0))
    openreg.timing.next_cost(kernel_name, Cost("collective", bytes=nbytes, collective=collective, ranks=ranks))
