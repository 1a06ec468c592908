"""What each openreg launch costs, for the runtime's timing model: FLOPs from PyTorch's own formulas
(``torch.utils.flop_counter``), bytes from the tensors read and written, the class of kernel.

The runtime launch carries an optional :class:`openreg.timing.Cost`; the launch sites of this package
call the ``price_*`` functions below, only while simulated time is on (``openreg.timing.active``), and
the functions hand the cost to the runtime with ``openreg.timing.next_cost`` for the launch that
follows. An operator's cost is memoized by its arguments' metadata, so a training loop pays one meta
run per call shape.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch

import openreg
from openreg import bounded
from openreg.timing import Cost

from . import formulas

aten = torch.ops.aten

# LITERALINCLUDE START: TIMING KINDS
MATRIX = {"mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_scaled_mm", "_int_mm"}
ATTENTION = {
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward",
    "_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_cudnn_attention_backward", "_flash_attention_backward", "_efficient_attention_backward",
    "_scaled_dot_product_fused_attention_overrideable", "_scaled_dot_product_fused_attention_overrideable_backward",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention_for_cpu_backward",
}
CONV = {
    "convolution", "_convolution", "convolution_backward", "convolution_overrideable",
    "convolution_backward_overrideable", "cudnn_convolution", "_slow_conv2d_forward", "_slow_conv2d_backward",
}
COPY = {"copy_", "clone", "_to_copy", "_copy_from", "_copy_from_and_resize", "contiguous", "_foreach_copy_"}
# Softmaxes and normalizations read their rows more than once (statistics, then the output): their own
# class. Losses and scans read everything and reduce: PyTorch tags the plain reductions.
NORMALIZATION = {
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data", "_safe_softmax",
    "native_layer_norm", "native_layer_norm_backward", "native_batch_norm", "native_batch_norm_backward",
    "_native_batch_norm_legit", "_native_batch_norm_legit_no_training", "native_group_norm",
    "native_group_norm_backward", "_fused_rms_norm", "_fused_rms_norm_backward", "logsumexp",
    "batch_norm_stats", "batch_norm_elemt", "batch_norm_backward_reduce", "batch_norm_backward_elemt",
}
REDUCTION = {
    "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward", "cumsum", "cumprod",
    "logcumsumexp", "_logcumsumexp", "cummax", "cummin", "_cummax_helper", "_cummin_helper", "_foreach_norm",
    "embedding_dense_backward",
}
SORT = {"sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode", "unique", "_unique2",
        "unique_consecutive", "unique_dim"}
# LITERALINCLUDE END: TIMING KINDS

_DTYPES = {
    torch.float64: "float64", torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
    torch.int8: "int8", torch.uint8: "int8",
    **{d: "float8" for d in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)},
}
_NUMBERS = (bool, int, float, complex)
_BY_FORMULA = ("matrix", "conv", "attention", "attention_backward", "copy")  # FLOPs from a formula or none
_CACHE_SIZE = 8192
_cache: dict[tuple, Cost | None] = {}
_names: dict[torch._ops.OpOverload, str] = {}


def kind_of(op: torch._ops.OpOverload) -> str:
    """The kernel class the model prices ``op`` as."""
    name = op.overloadpacket.__name__
    base = name[:-1] if name.endswith("_") and name != "copy_" else name
    if base in MATRIX:
        return "matrix"
    if base in ATTENTION:
        return "attention_backward" if base.endswith("_backward") else "attention"
    if base in CONV:
        return "conv"
    if name in COPY or base in COPY:
        return "copy"
    if base in NORMALIZATION:
        return "normalization"
    if base in SORT:
        return "sort"
    if base in REDUCTION or torch.Tag.reduction in op.tags:
        return "reduction"
    return "elementwise"


# Whether float32 matrix products compute in TF32: kept by ``torch.backends.openreg.matmul`` (backends.py,
# above this module, which sets it with the flag).
tf32 = False


def dtype_name(dtype: torch.dtype, kind: str) -> str:
    """The model's name for the type a kernel computes in (float32 matrix products are TF32 when
    ``torch.backends.openreg.matmul.allow_tf32`` is on; float32 convolutions when
    ``torch.backends.cudnn.allow_tf32`` is, PyTorch's default, as cuDNN runs them)."""
    name = _DTYPES.get(dtype, "float32")
    if name == "float32" and ((kind == "matrix" and tf32) or (kind == "conv" and torch.backends.cudnn.allow_tf32)):
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
    training = autograd_issue((args, kwargs))
    try:
        # the default dtype decides the dtype (and bytes) of results such as int / int (aten.arguments.global_state)
        key = (op, _key(args), _key(kwargs), dtype_name(torch.float32, "matrix"), training, torch.get_default_dtype())
        hash(key)
    except TypeError:
        key = None
    cost = _cache.get(key) if key is not None else None
    if cost is None:
        cost = estimate(op, args, kwargs)
        if training and cost.host == "op":
            cost = dataclasses.replace(cost, host="autograd")
        if key is not None:
            bounded.put(_cache, key, cost, _CACHE_SIZE)
    if cost.scratch and openreg.timing.active:
        note_scratch(next(iter(_tensors((args, kwargs))), None), cost.scratch, "conv_workspace", cost.scratch)
    openreg.timing.next_cost(launch_name(op), cost, _host_waits(op))


def autograd_issue(values: Any) -> bool:
    """Whether autograd takes part in issuing this call: the autograd engine runs it (backward), or it
    is recorded for backward (grad mode on, an input that requires grad). Its host cost is the profile's
    ``host_us["autograd"]``."""
    if torch._C._current_graph_task_id() != -1:
        return True
    return torch.is_grad_enabled() and any(t.requires_grad for t in _tensors(values))


def _host_waits(op: torch._ops.OpOverload) -> bool:
    """Whether a device would make the host wait for this operator: its output shapes depend on the
    data, or it returns something that is not a tensor (``equal``, ``is_nonzero``). Other synchronous
    runs are the fallback's own (its check of a call shape's first call)."""
    if {torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output} & set(op.tags):
        return True
    return not all(str(r.type) in ("Tensor", "Tensor[]", "Optional[Tensor]") for r in op._schema.returns)


def estimate(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> Cost:
    """FLOPs (PyTorch's formula for the operator, when it has one, else :mod:`.formulas`), bytes read
    and written (the outputs' metadata from a run on ``meta`` tensors; a mutated argument is read and
    written), the class of kernel and its data type."""
    kind = kind_of(op)
    name = op.overloadpacket.__name__
    base = name[:-1] if name.endswith("_") else name
    inputs = [t for t in _tensors((args, kwargs)) if t.numel()]
    result = meta_args = meta_kwargs = None
    try:
        meta_args, meta_kwargs = _to_meta(op, args, kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = op(*meta_args, **meta_kwargs)
    except Exception:  # noqa: BLE001 - no meta kernel or data-dependent shapes: priced by its inputs
        meta_args = None
    mutated, written_only = _mutated(op, args, kwargs)
    if base in formulas.FUSED_OPTIMIZERS and kwargs.get("grad_scale") is None and len(args) > 1:
        # the schema marks the gradients written for the grad scaler's unscale; without one they are only read
        grads = _tensors(args[1])
        mutated = [t for t in mutated if not any(t is g for g in grads)]
    if base in formulas.WRITE_ONLY:  # fills and random fills write their tensor without reading it
        written_only = mutated
    inputs = [t for t in inputs if not any(t is w for w in written_only)]  # an ``out=`` tensor is only written
    aliased = any(r.alias_info is not None for r in op._schema.returns)  # returns what it wrote: counted there
    if aliased and not mutated and meta_args is not None:  # an empty ``out=`` the kernel resizes: the result's size
        mutated = written_only = [t for t in _tensors(result) if t.numel()]
    outputs = [] if aliased or meta_args is None else _tensors(result)
    if meta_args is None and not aliased and not mutated and inputs:  # no meta kernel: a result like its input
        outputs = inputs[:1]
    nbytes = formulas.traffic(base, inputs, outputs, mutated, args)
    reference = next((t for t in (*inputs, *outputs) if t.is_floating_point()), inputs[0] if inputs else None)
    dtype = dtype_name(reference.dtype if reference is not None else torch.float32, kind)
    fused = formulas.fused_layer(base, args, dtype) if base in ("_native_multi_head_attention",
                                                                 "_transformer_encoder_layer_fwd") else None
    if fused is not None:
        return dataclasses.replace(fused, bytes=max(fused.bytes, nbytes), host="library")
    if base in formulas.NORM_BACKWARDS and len(inputs) >= 2 and outputs:
        return formulas.norm_backward(inputs, outputs, dtype)
    if base in formulas.EMBEDDING_BACKWARDS and outputs:
        return formulas.embedding_backward(inputs, outputs, dtype)
    flops, formula = 0.0, False
    from torch.utils import flop_counter  # imported on first use, not at ``import torch``

    formula_fn = flop_counter.flop_registry.get(op.overloadpacket)
    if formula_fn is not None and meta_args is not None:
        try:
            flops, formula = float(formula_fn(*meta_args, out_val=result, **meta_kwargs)), True
        except Exception:  # noqa: BLE001 - a formula that cannot read these arguments: counted below
            flops, formula = 0.0, False
    if not formula and kind not in _BY_FORMULA and (outputs or mutated or inputs):
        # elementwise, reductions, normalizations, sorts: PER_ELEMENT operations per element written
        # (or read, for a reduction to a few values)
        written = sum(t.numel() for t in (*outputs, *mutated)) or sum(t.numel() for t in inputs)
        count = max(written, sum(t.numel() for t in inputs)) if kind in ("reduction", "normalization") else written
        flops, formula = float(formulas.per_element(base) * count), True
    shape, scratch = _matrix_shape(op, args), 0.0
    if kind == "conv":
        first = outputs[0] if outputs else None
        shape = formulas.conv_shape(args, first) if "backward" not in name else \
            formulas.conv_shape((args[1], args[2], *args[3:9], args[9] if len(args) > 9 else 1), args[0])
        scratch = formulas.nbytes(outputs[:1])
    lists = [a for a in args if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor)]
    tensors = len(lists[0]) if name.startswith(("_foreach_", "_fused_")) and lists else 0
    host = "library" if base in formulas.LIBRARY else "op"
    cost = Cost(kind, flops, float(nbytes), dtype, shape=shape, formula=formula, host=host, tensors=tensors,
                scratch=scratch)
    if kind == "conv" and base in ("convolution_backward", "convolution_backward_overrideable") and meta_args:
        return formulas.conv_backward(cost, args, outputs)
    return formulas.multi_tensor(cost, lists) if tensors else cost
# LITERALINCLUDE END: TIMING PRICE OP


def _mutated(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[list, list]:
    """The arguments ``op`` writes (its schema's ``Tensor(a!)`` ones), and those of them it only writes
    (``out=`` arguments, keyword-only)."""
    out, written_only = [], []
    for i, argument in enumerate(op._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[i] if i < len(args) else kwargs.get(argument.name)
        tensors = [t for t in _tensors(value) if t.numel()]
        out.extend(tensors)
        if argument.kwarg_only:
            written_only.extend(tensors)
    return out, written_only


# LITERALINCLUDE START: TIMING SCRATCH
scratch_points: list[tuple[int, int, float, str]] = []  # (device, allocated at the launch, basis, scratch kind)


def note_scratch(like: torch.Tensor | None, basis: float, kind: str, pending: float = 0.0) -> None:
    """A launch whose GPU library allocates scratch the backend does not (the profile's
    ``scratch[kind]`` x ``basis`` bytes: a convolution's cuDNN workspace, x its output; the attention
    backward's float32 accumulators, x the query as float32), with ``pending`` bytes of its outputs still
    to be allocated: what the device would hold at that moment, for the report's memory peak
    (``simulate`` clears the list)."""
    if like is None or like.device.type != "openreg" or len(scratch_points) > 100_000:
        return
    device = like.device.index
    scratch_points.append((device, torch.openreg.memory_allocated(device) + int(pending), basis, kind))


def scratch_peak(device: int, profile) -> int:
    return int(max((at + profile.scratch[kind] * basis for d, at, basis, kind in scratch_points if d == device),
                   default=0))
# LITERALINCLUDE END: TIMING SCRATCH


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
        if src.device == dst.device:  # read the source, write the destination (a cast changes the size)
            moved = nbytes + float(src.numel() * src.element_size()) if src.numel() == dst.numel() else 2 * nbytes
            host = "autograd" if autograd_issue(src) else "op"
            openreg.timing.next_cost("copy_d2d", Cost("copy", bytes=moved, dtype=dtype_name(dst.dtype, "copy"),
                                                      host=host))
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
    """A compiled (Inductor) kernel: fused elementwise, reduction and normalization work, priced by the
    bytes of every tensor it touches, its class and FLOPs from the operators its name lists
    (:func:`.formulas.compiled`). Matrix products, convolutions and attention run as extern kernels in a
    compiled openreg graph, priced as operators with PyTorch's formulas."""
    reference = next((t for t in tensors if isinstance(t, torch.Tensor) and t.is_floating_point()), None)
    dtype = dtype_name(reference.dtype, "elementwise") if reference is not None else "float32"
    openreg.timing.next_cost(name, formulas.compiled(name, tensors, dtype))


# LITERALINCLUDE START: TIMING PRICE LAUNCH
def price_attention(name: str, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, tensors,
                    backward: bool = False) -> None:
    """openreg's fused attention launch (``sdpa_overrideable``, forward or backward): PyTorch's SDPA
    FLOP formulas (:func:`.formulas.attention`)."""
    dtype = dtype_name(query.dtype, "attention")
    cost = formulas.attention(name, query, key, value, tensors, backward, dtype)
    if backward:
        cost = dataclasses.replace(cost, scratch=float(query.numel() * 4))
        if openreg.timing.active:
            note_scratch(query, cost.scratch, "attention_backward")
    openreg.timing.next_cost(name, cost)


def price_norm_backward(name: str, reads: list, written: list) -> None:
    """openreg's kernel of a normalization backward that has no meta kernel (``_fused_rms_norm_backward``):
    its two passes (:func:`.formulas.norm_backward`) over the gradient and the input it reads."""
    reference = next((t for t in reads if t.is_floating_point()), reads[0])
    cost = formulas.norm_backward(reads, written, dtype_name(reference.dtype, "normalization"))
    host = "autograd" if autograd_issue(reads) else "op"
    openreg.timing.next_cost(name, dataclasses.replace(cost, host=host))


def price_launch(name: str, tensors, writes) -> None:
    """Any other named launch of the backend's kernels (fused RNN cells, view backwards, custom and
    quantized kernels), unless its site priced it: elementwise over the tensors it reads and writes,
    ``PER_ELEMENT`` operations per element written."""
    if openreg.timing.pending(name):
        return
    tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
    written = [t for t in (writes if writes is not None else tensors) if isinstance(t, torch.Tensor)]
    reference = next((t for t in tensors if t.is_floating_point()), None)
    dtype = dtype_name(reference.dtype, "elementwise") if reference is not None else "float32"
    base = name.split("::")[-1].split(".")[0]
    flops = float(formulas.per_element(base) * sum(t.numel() for t in written))
    openreg.timing.next_cost(name, Cost("elementwise", flops, formulas.nbytes(tensors), dtype, formula=True))
# LITERALINCLUDE END: TIMING PRICE LAUNCH


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
