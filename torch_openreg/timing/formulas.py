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
GATHERS = {"embedding", "index_select", "gather", "take", "index", "embedding_bag", "_embedding_bag"}
SCATTERS = {"index_put", "index_add", "index_copy", "scatter", "scatter_add", "scatter_reduce", "index_fill",
            "_index_put_impl", "put"}
SORTS = {"sort", "argsort", "msort"}  # every radix pass reads and writes keys and indices
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


def traffic(base: str, inputs: list, outputs: list, mutated: list) -> float:
    """Bytes a kernel moves: what it reads plus what it writes (a mutated argument both), except that
    gathers read only the rows they return, scatters touch only the rows they write, and radix sorts
    and selections pass over their keys several times."""
    if base in GATHERS and outputs:
        small = [t for t in inputs if not t.is_floating_point()]  # the indices
        return 2 * nbytes(outputs) + nbytes(small)
    if base in SCATTERS and inputs:
        target, rest = inputs[0], inputs[1:]
        return nbytes(rest) + 2 * min(nbytes([target]), nbytes(rest))
    if base in SORTS and inputs:
        return radix_passes(inputs[0]) * (nbytes(inputs) + nbytes(outputs))
    if base in SELECTS and inputs:  # the digit passes, then one more to gather the selected values
        return (radix_passes(inputs[0]) + 1) * nbytes(inputs[:1]) + nbytes(outputs)
    return nbytes(inputs) + nbytes(outputs) + nbytes(mutated)


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
