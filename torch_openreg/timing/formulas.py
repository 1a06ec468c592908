"""FLOPs and bytes of the launches PyTorch's FLOP registry has no formula for: fused attention as
openreg dispatches it, the fused inference layers, multi-tensor (``_foreach_``) and fused optimizer
kernels, elementwise and reduction kernels (a count per element), sorts and selections (their radix
passes), gathers (the rows they read, not the whole table) and convolutions' implicit-GEMM shape.

Where PyTorch has the formula (``torch.utils.flop_counter``: ``sdpa_flop_count``,
``sdpa_backward_flop_count``, the matrix products'), these use it.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from openreg.timing import Cost, combined

# LITERALINCLUDE START: TIMING PER ELEMENT
# Floating-point operations per output element of elementwise kernels (1 when not listed): the
# arithmetic of the formula PyTorch's kernel evaluates.
PER_ELEMENT = {
    "addcmul": 2, "addcdiv": 2, "lerp": 2, "gelu": 8, "gelu_backward": 12, "silu": 4, "silu_backward": 6,
    "sigmoid": 4, "tanh": 4, "exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "div": 1, "pow": 1, "erf": 8,
    "mse_loss": 3, "mse_loss_backward": 3, "threshold_backward": 1, "_softmax": 4, "_log_softmax": 4,
    "_safe_softmax": 4, "_softmax_backward_data": 3, "_log_softmax_backward_data": 3, "native_layer_norm": 8,
    "native_layer_norm_backward": 12, "native_batch_norm": 6, "native_batch_norm_backward": 10,
    "native_group_norm": 8, "native_group_norm_backward": 12, "_fused_rms_norm": 6,
    "_thnn_fused_lstm_cell": 20, "_thnn_fused_lstm_cell_backward": 24, "_thnn_fused_gru_cell": 16,
    "_thnn_fused_gru_cell_backward": 20,
    # fused optimizers: the update of one parameter element (moments, bias correction, step)
    "_fused_adam": 16, "_fused_adamw": 18, "_fused_sgd": 4, "_fused_adagrad": 8,
}
# LITERALINCLUDE END: TIMING PER ELEMENT

# Reads only the rows an index selects, from a table that may be far larger.
GATHERS = {"embedding", "index_select", "gather", "take", "index", "embedding_bag", "_embedding_bag",
           "_embedding_bag_forward_only"}
SCATTERS = {"index_put", "index_add", "index_copy", "scatter", "scatter_add", "scatter_reduce", "index_fill",
            "_index_put_impl", "put"}
# Operators whose mutated arguments are written, not read: fills, random fills, and helpers that take
# their outputs as arguments.
WRITE_ONLY = {"zero", "fill", "normal", "uniform", "random", "exponential", "geometric", "cauchy", "log_normal",
              "_cummax_helper", "_cummin_helper"}
SORTS = {"sort", "argsort", "msort"}  # every radix pass reads and writes keys and indices (CUB onesweep)
SELECTS = {"topk", "kthvalue", "median", "nanmedian", "mode"}  # radix select: passes read the input
LIBRARY = {  # the attention dispatcher selects a backend and checks its inputs before it launches
    "_native_multi_head_attention", "_transformer_encoder_layer_fwd", "sdpa_overrideable",
    "sdpa_overrideable_backward",
}


# Normalization backwards run two passes over the gradient and the input on a GPU: the statistics'
# gradients (layer norm: gamma/beta's column sums; batch and group norm: the per-channel sums that dX
# needs), then dX. PyTorch's CUDA kernels: LayerNormBackwardKernelImpl (grad-input and GammaBeta
# kernels), batch_norm_backward_reduce + batch_norm_backward_elemt, GroupNormBackwardKernelImpl.
NORM_BACKWARDS = {"native_layer_norm_backward", "native_batch_norm_backward", "native_group_norm_backward",
                  "_fused_rms_norm_backward"}


def norm_backward(inputs: list, outputs: list, dtype: str) -> Cost:
    """A normalization backward as its two passes: a reduction reading the gradient and the input, then
    the elementwise pass reading them again (and the statistics) and writing the input's gradient."""
    grad, x = inputs[0], inputs[1]
    both = nbytes([grad, x])
    rest = nbytes(inputs[2:]) + nbytes(outputs)
    elements = float(x.numel())
    reduce = Cost("reduction", 4.0 * elements, both, dtype, formula=True)
    apply = Cost("normalization", 8.0 * elements, both + rest, dtype, formula=True)
    return combined((reduce, apply))


EMBEDDING_BACKWARDS = {"embedding_dense_backward", "embedding_backward"}


def embedding_backward(inputs: list, outputs: list, dtype: str) -> Cost:
    """``embedding_dense_backward`` as PyTorch's CUDA kernel runs it: a radix sort of the indices (with
    their positions) over the bits the vocabulary needs, then a segmented sum of the gradient's rows into
    the table's gradient, which is written whole (zeros where no index points)."""
    grad = next((t for t in inputs if t.is_floating_point()), None)
    indices = next((t for t in inputs if not t.is_floating_point()), None)
    table = outputs[0] if outputs else None
    if grad is None or indices is None or table is None:
        return Cost("reduction", 0.0, nbytes(inputs) + nbytes(outputs), dtype, formula=True)
    bits = max(1, math.ceil(math.log2(max(table.shape[0], 2))))
    passes = math.ceil(bits / 8)
    pairs = float(indices.numel() * (indices.element_size() + 8))  # key and position, read and written
    sort = Cost("sort", 0.0, passes * 2 * pairs, dtype, formula=True)
    reduce = Cost("reduction", float(grad.numel()), nbytes([grad]) + pairs + nbytes([table]), dtype, formula=True)
    return combined((sort, reduce))


# PyTorch's multi_tensor_apply (ATen/native/cuda/MultiTensorApply.cuh), which _foreach_ and fused optimizer
# kernels use: one block of 512 threads per chunk of 65536 elements, each thread loading 4 elements of each
# list per round (so 32 rounds per chunk, each waiting for memory), at most 320 blocks and
# depth_to_max_tensors[depth - 1] tensors per launch.
CHUNK, BLOCK_THREADS, ILP, MAX_BLOCKS = 65536, 512, 4, 320
FUSED_OPTIMIZERS = {"_fused_adam", "_fused_adamw", "_fused_sgd", "_fused_adagrad"}
MAX_TENSORS = (110, 64, 48, 36, 30)


def multi_tensor(cost: Cost, lists: list) -> Cost:
    """``cost`` (a whole multi-tensor call) as the launches multi_tensor_apply makes: each with its chunks'
    share of the bytes and FLOPs, and its grid (blocks, rounds per block, blocks resident per unit), so
    a short list of small tensors pays the memory latency its few blocks cannot hide."""
    first = [t for t in lists[0] if isinstance(t, torch.Tensor)]
    depth = min(max(len(lists), 1), len(MAX_TENSORS))
    chunks = [max(1, math.ceil(t.numel() / CHUNK)) for t in first if t.numel()]
    if not chunks:
        return cost
    launches, blocks, tensors = [], 0, 0
    for n in chunks:  # fill a launch until its blocks or tensors run out, as multi_tensor_apply does
        blocks, tensors = blocks + n, tensors + 1
        while blocks >= MAX_BLOCKS:
            launches.append(MAX_BLOCKS)
            blocks -= MAX_BLOCKS
        if tensors == MAX_TENSORS[depth - 1] and blocks:
            launches.append(blocks)
            blocks, tensors = 0, 0
    if blocks:
        launches.append(blocks)
    total = sum(launches)
    # a block's rounds: its chunk's elements over what its threads load per round (32 for a full chunk)
    rounds = max(math.ceil(min(t.numel(), CHUNK) / (BLOCK_THREADS * ILP)) for t in first if t.numel())
    resident = 2048 // BLOCK_THREADS  # threads per SM on NVIDIA GPUs since Volta
    parts = tuple(Cost(cost.kind, cost.flops * b / total, cost.bytes * b / total, cost.dtype, formula=cost.formula,
                       tensors=cost.tensors, grid=(b, rounds, resident)) for b in launches)
    if len(parts) == 1:
        return dataclasses.replace(cost, grid=parts[0].grid)
    return dataclasses.replace(cost, parts=parts)


def nbytes(tensors) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor)))


def per_element(name: str) -> int:
    base = name[len("_foreach_"):] if name.startswith("_foreach_") else name
    return PER_ELEMENT.get(base.rstrip("_") if base not in PER_ELEMENT else base, 1)


def radix_passes(t: torch.Tensor) -> int:
    """Passes of an 8-bit-digit radix sort or select over ``t``'s keys (CUB's onesweep, PyTorch's topk)."""
    return max(t.element_size(), 1)


# LITERALINCLUDE START: TIMING TRAFFIC
def traffic(base: str, inputs: list, outputs: list, mutated: list, args: tuple = ()) -> float:
    """Bytes a kernel moves: what it reads plus what it writes (a mutated argument both), except that
    gathers read only the rows they return (a bag of embeddings: the rows its indices name), scatters
    touch only the elements they write (:func:`scattered`), and radix sorts and selections pass over
    their keys several times."""
    if base in GATHERS and outputs:
        small = [t for t in inputs if not t.is_floating_point()]  # the indices
        if base in ("embedding_bag", "_embedding_bag", "_embedding_bag_forward_only") and small:
            table = inputs[0]
            row = table.element_size() * (table.numel() // max(table.shape[0], 1) if table.dim() else 1)
            return float(small[0].numel() * row) + nbytes(outputs[:1]) + nbytes(small) + nbytes(outputs[1:])
        return 2 * nbytes(outputs) + nbytes(small)
    if base in SCATTERS and inputs:
        target = args[0] if args and isinstance(args[0], torch.Tensor) else inputs[0]
        elements = scattered(base, args, target)
        moved = nbytes([t for t in inputs if t is not target]) + 2.0 * elements * target.element_size()
        if not any(_same(t, target) for t in mutated):  # out of place: the target is copied to the output first
            moved += nbytes([target]) + nbytes(outputs[:1] or mutated[:1])
        return moved
    if base in ("nll_loss_forward", "nll_loss2d_forward") and len(args) > 1 and isinstance(args[1], torch.Tensor):
        # a gather: the targets, and one log-probability per target (not the whole input)
        target, scores = args[1], args[0]
        rest = [t for t in inputs if t is not scores and t is not target]
        return nbytes([target]) + target.numel() * scores.element_size() + nbytes(rest) + nbytes(outputs)
    if base in ("nll_loss_backward", "nll_loss2d_backward") and len(args) > 1:
        # the input's gradient zero-filled, then one element per target written: the input is not read
        return nbytes([t for t in inputs if t is not args[1]]) + nbytes(outputs)
    if base in SORTS and inputs:  # each pass reads and writes keys and their indices; a histogram pass first
        keys = inputs[0]
        pairs = nbytes([keys]) + keys.numel() * 8.0  # int64 indices travel with the keys
        return radix_passes(keys) * 2 * pairs + nbytes([keys])
    if base in SELECTS and inputs:  # the digit passes, then one more to gather the selected values
        return (radix_passes(inputs[0]) + 1) * nbytes(inputs[:1]) + nbytes(outputs)
    return nbytes(inputs) + nbytes(outputs) + nbytes(mutated)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are the same elements (an in-place call's ``out=self`` may be another object)."""
    if a is b:
        return True
    try:
        return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.device == b.device
    except RuntimeError:  # a tensor without storage (sparse, functional wrappers): not the same
        return False


def scattered(base: str, args: tuple, target: torch.Tensor) -> int:
    """Elements of ``target`` a scatter writes: one per index (``scatter``, ``put``), the source's
    elements (``index_add``, ``index_copy``), one slice per index (``index_fill``), or the indexed
    positions times the trailing slice (``index_put``: broadcast indices; a mask, all it covers)."""
    def tensor(i: int):
        value = args[i] if i < len(args) else None
        return value if isinstance(value, torch.Tensor) else None

    try:
        index = tensor(1 if base == "put" else 2)
        if base in ("scatter", "scatter_add", "scatter_reduce", "put") and index is not None:
            return index.numel()
        if base in ("index_add", "index_copy") and tensor(3) is not None:
            return tensor(3).numel()
        if base == "index_fill" and tensor(2) is not None:
            dim = int(args[1]) % max(target.dim(), 1)
            return tensor(2).numel() * (target.numel() // max(target.shape[dim], 1) if target.dim() else 1)
        if base in ("index_put", "_index_put_impl") and isinstance(args[1], (list, tuple)):
            indices = list(args[1])
            covered = sum(t.dim() if isinstance(t, torch.Tensor) and t.dtype == torch.bool else 1 for t in indices)
            count = max((t.numel() for t in indices if isinstance(t, torch.Tensor)), default=1)
            return count * math.prod(target.shape[covered:])
    except (IndexError, TypeError, ValueError):
        pass
    return target.numel()
# LITERALINCLUDE END: TIMING TRAFFIC


# LITERALINCLUDE START: TIMING ATTENTION
def attention(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, tensors, backward: bool,
              dtype: str) -> Cost:
    """Fused attention (openreg's ``sdpa_overrideable`` and its backward): PyTorch's own formulas,
    ``sdpa_flop_count`` / ``sdpa_backward_flop_count``, over the (batch, heads, length, dim) shapes
    with grouped key/value heads expanded; bytes are the tensors the kernel reads and writes once."""
    from torch.utils import flop_counter

    def four(t: torch.Tensor, heads: int | None = None) -> tuple:
        shape = (1,) * (4 - t.dim()) + tuple(t.shape[-4:])
        batch = math.prod(t.shape[:-3]) if t.dim() > 4 else shape[0]
        return (batch, heads or shape[1], shape[2], shape[3])

    qs = four(q)
    ks, vs = four(k, qs[1]), four(v, qs[1])
    if backward:
        flops = flop_counter.sdpa_backward_flop_count(qs[:3] + (vs[3],), qs, ks, vs)
    else:
        flops = flop_counter.sdpa_flop_count(qs, ks, vs)
    # (batch x heads, queries, keys, head_dim): the scores the softmax exponentiates (backward: again)
    shape = (qs[0] * qs[1], qs[2], ks[2], qs[3])
    return Cost("attention_backward" if backward else "attention", float(flops), nbytes(tensors), dtype,
                shape=shape, formula=True, host="library")
# LITERALINCLUDE END: TIMING ATTENTION


def _mm(m: int, n: int, k: int, dtype: str, size: int) -> Cost:
    return Cost("matrix", 2.0 * m * n * k, float((m * k + k * n + m * n) * size), dtype, shape=(m, n, k, 1),
                formula=True, host="library")


# LITERALINCLUDE START: TIMING FUSED LAYERS
def fused_layer(base: str, args: tuple, dtype: str) -> Cost | None:
    """The fused inference paths as the stages their CUDA kernels run: ``_native_multi_head_attention``
    (input projections, attention, output projection) and ``_transformer_encoder_layer_fwd`` (that,
    then residual adds and layer norms, the feed-forward products and activation)."""
    if base == "_native_multi_head_attention":
        query, key, value, embed, heads = args[:5]
        b, length, e = query.shape if query.dim() == 3 else (1, *query.shape)
        s = key.shape[-2]
        ffn = None
    elif base == "_transformer_encoder_layer_fwd":
        src, embed, heads = args[:3]
        b, length, e = src.shape if src.dim() == 3 else (1, *src.shape)
        s = length
        ffn = args[14]  # ffn_weight_1: (feed-forward, embed)
    else:
        return None
    size = (args[0]).element_size()
    tokens, memory = b * length, b * s
    head_dim = e // max(int(heads), 1)
    qs, ks = (b, int(heads), length, head_dim), (b, int(heads), s, head_dim)
    from torch.utils import flop_counter

    parts = [_mm(tokens, e, e, dtype, size), _mm(memory, 2 * e, e, dtype, size),
             Cost("attention", float(flop_counter.sdpa_flop_count(qs, ks, ks)),
                  float((2 * tokens * e + 2 * memory * e) * size), dtype, shape=(b * int(heads), length, s, head_dim),
                  formula=True, host="library"),
             _mm(tokens, e, e, dtype, size)]
    if ffn is not None:
        f = ffn.shape[0]
        act = float(tokens * f)
        norm = Cost("normalization", 8.0 * tokens * e, float(3 * tokens * e * size), dtype, formula=True)
        activation = Cost("elementwise", 8 * act, 2 * act * size, dtype, formula=True)
        parts += [norm, _mm(tokens, f, e, dtype, size), activation, _mm(tokens, e, f, dtype, size), norm]
    return combined(tuple(parts))
# LITERALINCLUDE END: TIMING FUSED LAYERS


# LITERALINCLUDE START: TIMING COMPILED
# Inductor names a fused kernel after the operators it fused (``cpp_fused_gelu_gelu_backward_sum_0``,
# ``triton_red_fused_native_layer_norm_1``; ``red``/``per``: a reduction): its class and its FLOPs per element.
_NORMALIZING = ("native_layer_norm", "layer_norm", "native_batch_norm", "batch_norm", "native_group_norm",
                "group_norm", "rms_norm", "_softmax", "softmax", "_log_softmax", "log_softmax", "var_mean",
                "logsumexp")
_REDUCING = ("sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "var", "std",
             "linalg_vector_norm", "any", "all", "nll_loss_forward", "nll_loss_backward", "cumsum", "cumprod")
_ELEMENTWISE = ("clamp_min", "clamp_max", "threshold_backward", "maximum", "minimum", "where", "relu", "native_dropout",
                "mse_loss_backward", "sigmoid_backward", "tanh_backward", "gelu_backward", "silu_backward")
_WORDS = {w.lstrip("_") for w in (*PER_ELEMENT, *_NORMALIZING, *_REDUCING, *_ELEMENTWISE)}


def fused_operators(name: str) -> list[str]:
    """The operators an Inductor kernel's name lists, longest names first (``gelu_backward`` is one)."""
    body = name.split("fused_", 1)[1] if "fused_" in name else name
    tokens = [t for t in body.split("_") if t and not t.isdigit()]
    ops, i = [], 0
    while i < len(tokens):
        j = next((j for j in range(len(tokens), i, -1) if "_".join(tokens[i:j]) in _WORDS), i + 1)
        ops.append("_".join(tokens[i:j]))
        i = j
    return ops


def compiled(name: str, tensors, dtype: str) -> Cost:
    """A compiled (Inductor) kernel: the bytes of every tensor it touches, its class from the operators
    its name lists (a normalization or softmax reads its rows more than once; a reduction), and
    ``PER_ELEMENT`` operations per element of its largest tensor for each operator it fused."""
    ops = fused_operators(name)
    kind = "normalization" if any(op in _NORMALIZING or "_" + op in _NORMALIZING for op in ops) else \
        "reduction" if name.startswith(("triton_red", "triton_per")) or any(op in _REDUCING for op in ops) else \
        "elementwise"
    elements = max((t.numel() for t in tensors if isinstance(t, torch.Tensor)), default=0)
    flops = float(sum(per_element(op) for op in ops) * elements) if ops else float(elements)
    return Cost(kind, flops, nbytes(tensors), dtype, formula=True)
# LITERALINCLUDE END: TIMING COMPILED


# LITERALINCLUDE START: TIMING CONV BACKWARD
def conv_backward(cost: Cost, args: tuple, outputs: list) -> Cost:
    """``convolution_backward`` as CUDA runs it: cuDNN's data-gradient and weight-gradient kernels, each
    its own implicit matrix product with the forward's FLOPs (PyTorch's formula counts both), then the
    bias gradient, a reduction of the output's gradient (``at::sum`` inside the operator), as the
    output mask asks for them."""
    try:
        grad, x, w = args[0], args[1], args[2]
        mask = list(args[10]) if len(args) > 10 else [True, True, True]
        groups = args[9] if len(args) > 9 and isinstance(args[9], int) else 1
        results = iter(outputs)
        made = {i: next(results, None) for i in range(3) if mask[i]}
        g = max(groups, 1)
        window, pixels_in, pixels_out = math.prod(w.shape[2:]), math.prod(x.shape[2:]), math.prod(grad.shape[2:])
        shapes = {0: (x.shape[0] * pixels_in, x.shape[1] // g, grad.shape[1] // g * window, g),
                  1: (grad.shape[1] // g, w.shape[1] * window, x.shape[0] * pixels_out, g)}
        reads = {0: [grad, w], 1: [grad, x]}
    except (AttributeError, IndexError, TypeError, ValueError):
        return cost
    products = [i for i in (0, 1) if mask[i]]
    parts = [Cost("conv", cost.flops / len(products), nbytes([*reads[i], made[i]]), cost.dtype, shape=shapes[i],
                  formula=cost.formula) for i in products]
    if len(mask) > 2 and mask[2] and made.get(2) is not None:
        parts.append(Cost("reduction", float(grad.numel()), nbytes([grad, made[2]]), cost.dtype, formula=True))
    if not parts:
        return cost
    one = parts[0] if len(parts) == 1 else combined(tuple(parts))
    return dataclasses.replace(one, host=cost.host, scratch=cost.scratch)
# LITERALINCLUDE END: TIMING CONV BACKWARD


def conv_shape(args: tuple, out: torch.Tensor | None) -> tuple | None:
    """``(M, N, K, 1)`` of a convolution's implicit matrix product (output pixels x output channels x
    input channels times the kernel window), for the wave quantization."""
    try:
        x, w = args[0], args[1]
        if out is None or w.dim() < 3 or x.dim() != w.dim():
            return None
        groups = args[8] if len(args) > 8 and isinstance(args[8], int) else 1
        pixels = out.shape[0] * math.prod(out.shape[2:])
        return (pixels, w.shape[0] // max(groups, 1), math.prod(w.shape[1:]), max(groups, 1))
    except (AttributeError, IndexError, TypeError):
        return None
