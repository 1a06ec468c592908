"""Scaled dot product attention: openreg's backends and its fused ("overrideable") kernel.

For a PrivateUse1 query, ``scaled_dot_product_attention`` asks ``_fused_sdp_choice_stub`` which
backend to use; the bridge's stub forwards to the ``_fused_sdp_choice`` operator, whose openreg
kernel (:func:`fused_sdp_choice`) is the policy: openreg offers two backends, ``OVERRIDEABLE`` (the
fused kernels below, PyTorch's hook for PrivateUse1 devices) and ``MATH`` (PyTorch's composite of
ordinary operators), in that order, as far as ``torch.nn.attention.sdpa_kernel`` enables them. The
CUDA kernels (``FLASH_ATTENTION``, ``EFFICIENT_ATTENTION``, ``CUDNN_ATTENTION``) are not openreg's.

The overrideable kernels are launches over host views. Where the CPU would use its fused flash
kernel (no dropout, 4-D inputs, ...), they call that kernel, so openreg computes exactly what CPU
eager computes, as fast; otherwise they compute PyTorch's math path (its formulas, in CPU
operators). Dropout draws its mask as the CPU's math path does (``bernoulli_`` from the device's
generator, so a seed gives the CPU's mask), and saves the generator state it drew from where CUDA
returns its Philox seed: backward redraws exactly the mask forward applied.
"""

from __future__ import annotations

import math

import torch

from torch_openreg import _C
from torch_openreg.timing import costs as timing_costs

from .launch import host_views, launch

OVERRIDEABLE, MATH = int(torch.nn.attention.SDPBackend.OVERRIDEABLE), int(torch.nn.attention.SDPBackend.MATH)


# LITERALINCLUDE START: SDP CHOICE OP
def fused_sdp_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                     enable_gqa=False) -> int:
    """``aten::_fused_sdp_choice`` (and the stub): OVERRIDEABLE, else MATH, as ``sdpa_kernel`` allows.

    The order is fixed, as the CPU's is (``sdpa_kernel(..., set_priority=True)`` orders CUDA's
    backends). Nested tensors take the math backend: the fused kernel is for strided tensors.
    """
    nested = query.is_nested or key.is_nested or value.is_nested
    if not nested:
        _check_heads(query, key, value, enable_gqa)
    if not nested and torch._C._get_overrideable_sdp_enabled():
        return OVERRIDEABLE
    if torch._C._get_math_sdp_enabled():
        return MATH
    why = "the fused kernel does not take nested tensors, and MATH is disabled" if nested else (
        "neither is enabled")
    raise RuntimeError(
        "No viable backend for scaled_dot_product_attention on openreg: openreg offers SDPBackend.OVERRIDEABLE "
        f"(its fused kernel) and SDPBackend.MATH, and {why} (torch.nn.attention.sdpa_kernel); FLASH_ATTENTION, "
        "EFFICIENT_ATTENTION and CUDNN_ATTENTION are CUDA kernels openreg does not have"
    )


def _check_heads(query, key, value, enable_gqa: bool) -> None:
    """What the math backend would refuse, refused at the choice: the fused kernel sees no
    ``enable_gqa`` and takes key/value with fewer heads (that divide the query's) as grouped."""
    if enable_gqa and min(t.dim() for t in (query, key, value)) >= 3:
        heads = query.size(-3)
        if heads % key.size(-3) or heads % value.size(-3):
            raise RuntimeError("Number of heads in key and value must divide the number of heads in query "
                               f"(enable_gqa=True; query {tuple(query.shape)}, key {tuple(key.shape)}, "
                               f"value {tuple(value.shape)})")
        return
    try:
        torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])
    except RuntimeError:
        raise RuntimeError(
            f"scaled_dot_product_attention: the batch dimensions of query {tuple(query.shape)}, key "
            f"{tuple(key.shape)} and value {tuple(value.shape)} do not broadcast (fewer key/value heads "
            "need enable_gqa=True)") from None
# LITERALINCLUDE END: SDP CHOICE OP


def _groups(q: torch.Tensor, t: torch.Tensor) -> int:
    """Query heads per key/value head: more than 1 for grouped-query attention (heads in dim -3)."""
    if q.dim() < 3 or t.dim() < 3 or t.size(-3) in (1, q.size(-3)):
        return 1
    return q.size(-3) // t.size(-3)


def _expand_heads(q: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """Key or value with each head repeated for its query group, as the math backend does for GQA."""
    groups = _groups(q, t)
    return t.repeat_interleave(groups, dim=-3) if groups > 1 else t


def _fold_heads(grad: torch.Tensor, t: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """The gradient of :func:`_expand_heads`: each group's gradients summed back onto its head."""
    groups = _groups(q, t)
    return grad.unflatten(-3, (-1, groups)).sum(-3) if groups > 1 else grad


def _scores(q, k, bias, is_causal, scale):
    """Attention scores before softmax, formed as PyTorch's math path forms them."""
    factor = scale if scale is not None else 1 / math.sqrt(q.size(-1))
    root = math.sqrt(abs(factor))
    s = (q * (-root if factor < 0 else root)) @ (k.transpose(-2, -1) * root)
    if is_causal:
        L, S = q.size(-2), k.size(-2)
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if bias is not None:
        s = s.masked_fill(~bias, float("-inf")) if bias.dtype == torch.bool else s + bias
    return s


def _softmax(scores):
    """The math path's softmax: a row with every position masked out gives zeros, not NaN."""
    return torch.ops.aten._safe_softmax.default(scores, -1)


def _dropout_scale(like: torch.Tensor, p: float, gen: torch.Generator) -> torch.Tensor:
    """The math path's dropout factors (0 or 1/(1-p)), drawn as ``F.dropout`` draws on the CPU."""
    return torch.empty_like(like).bernoulli_(1 - p, generator=gen).div_(1 - p)


# LITERALINCLUDE START: SDPA FLASH
def _cpu_uses_flash(query, key, value, attn_bias, dropout_p) -> bool:
    """Whether CPU eager would run this attention with its flash kernel, whatever ``sdpa_kernel`` enables
    (PyTorch's own checks, ``csrc/examples.cpp``; a mask that needs a gradient rules it out, as on the CPU)."""
    if dropout_p > 0 or (attn_bias is not None and attn_bias.requires_grad):
        return False
    grouped = _groups(query, key) > 1 or _groups(query, value) > 1
    return torch.ops.openreg._cpu_flash_applies(*host_views(query, key, value, attn_bias), dropout_p, grouped)


_STATE_BYTES = torch.Generator().get_state().numel()
_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


def _flash_forward_kernel(out, lse, q, k, v, bias, is_causal, scale) -> None:
    o, logsumexp = _FLASH(q, k, v, 0.0, is_causal, attn_mask=bias, scale=scale)
    out.copy_(o)
    lse.copy_(logsumexp)


def _flash_backward_kernel(grads, grad_out, q, k, v, bias, out, lse, is_causal, scale) -> None:
    for view, g in zip(grads, _FLASH_BACKWARD(grad_out, q, k, v, out, lse, 0.0, is_causal, attn_mask=bias,
                                              scale=scale)):
        view.copy_(g)
# LITERALINCLUDE END: SDPA FLASH


# LITERALINCLUDE START: SDPA FORWARD
def attention_forward(query, key, value, attn_bias=None, dropout_p=0.0, is_causal=False, return_debug_mask=False,
                      scale=None):
    """``aten::_scaled_dot_product_fused_attention_overrideable`` for openreg tensors."""
    L, S, Ev = query.size(-2), key.size(-2), value.size(-1)
    kv_batch = [[*t.shape[:-3], query.size(-3)] if _groups(query, t) > 1 else t.shape[:-2] for t in (key, value)]
    batch = torch.broadcast_shapes(query.shape[:-2], *kv_batch)  # 3-D or 4-D, broadcast, heads grouped
    dev = query.device
    # With dropout, the kernel saves the generator state it draws from (5056 bytes: a CPU generator's)
    # on the stream, in order with the other random kernels; backward redraws the mask from it.
    gen = _C._cpu_generator(_C._default_generator(dev.index)) if dropout_p > 0 else None
    state = torch.empty(_STATE_BYTES if dropout_p > 0 else 0, dtype=torch.uint8)
    out = _like_query_layout(query, (*batch, L, Ev))
    # PyTorch's meta kernel gives 3-D inputs a (1, H, L) logsumexp: compiled graphs check it
    lse = torch.empty(*((1,) if query.dim() == 3 else ()), *batch, L, dtype=torch.float32, device=dev)
    tensors = [t for t in (out, lse, query, key, value, attn_bias) if t is not None]
    # the timing model: PyTorch's attention FLOP formula (torch_openreg/timing), while it prices launches
    price = {"cost": timing_costs.price_attention, "cost_args": ("sdpa_overrideable", query, key, value, tensors)}
    # (host views only as the launch's arguments: a frame an error passes through must not hold them)
    if _cpu_uses_flash(query, key, value, attn_bias, dropout_p):
        launch(dev.index, _flash_forward_kernel, *host_views(out, lse, query, key, value, attn_bias), is_causal,
               scale, tensors=tensors, writes=(out, lse), name="sdpa_overrideable", **price)
    else:
        launch(dev.index, _forward_kernel, *host_views(out, lse, query, key, value, attn_bias), dropout_p,
               is_causal, scale, state.data, gen, tensors=tensors, writes=(out, lse), name="sdpa_overrideable",
               **price)
    # (``.data``: the kernel's write must not bump the version autograd saved the state at)
    offset_t = torch.tensor(0, dtype=torch.int64)
    debug = torch.empty(0, dtype=query.dtype, device=dev)
    return out, lse, None, None, L, S, state, offset_t, debug


def _like_query_layout(query: torch.Tensor, shape: tuple) -> torch.Tensor:
    """The output laid out as PyTorch's meta kernel lays it out (``alloc_with_matching_layout``): in the
    query's dimension order. Compiled graphs assert the strides their fake tensors had."""
    if tuple(query.shape) == tuple(shape):
        return torch.empty_like(query)
    if query.dim() != 4:
        return torch.empty(shape, dtype=query.dtype, device=query.device)
    order = sorted(range(4), key=lambda i: query.stride(i), reverse=True)
    strides, step = [0] * 4, 1
    for i in reversed(order):
        strides[i], step = step, step * shape[i]
    return torch.empty_strided(shape, strides, dtype=query.dtype, device=query.device)


def _wide(*tensors):
    """float16/bfloat16 inputs are computed in float32, as the CPU's attention kernels accumulate."""
    return [t.float() if t is not None and t.dtype in (torch.float16, torch.bfloat16) else t for t in tensors]


def _forward_kernel(out, lse, q, k, v, bias, dropout_p, is_causal, scale, state, gen):
    q, k, v, bias = _wide(q, k, v, bias)
    k, v = _expand_heads(q, k), _expand_heads(q, v)
    scores = _scores(q, k, bias, is_causal, scale)
    p = _softmax(scores)
    if dropout_p > 0:
        state.copy_(gen.get_state())
        p = p * _dropout_scale(p, dropout_p, gen)
    if p.dtype == out.dtype:
        torch.matmul(p, v, out=out)
    else:
        out.copy_(torch.matmul(p, v))
    lse.copy_(torch.logsumexp(scores.float(), dim=-1))


# LITERALINCLUDE END: SDPA FORWARD


# LITERALINCLUDE START: SDPA BACKWARD
def attention_backward(grad_out, query, key, value, attn_bias, grad_input_mask, out, logsumexp, cum_seq_q,
                       cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, scale=None):
    """The backward: the math path's gradients over host views, in one launch."""
    want_bias = attn_bias is not None and attn_bias.is_floating_point() and grad_input_mask[3]
    if grad_out is None:  # an output gradient autograd left undefined (gradcheck's): the inputs' gradients are zero
        return (*(torch.zeros_like(t) for t in (query, key, value)),
                torch.zeros_like(attn_bias) if want_bias else torch.empty(0, device=query.device))
    grads = [torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)]
    grads.append(torch.empty_like(attn_bias) if want_bias else torch.empty(0, device=query.device))
    inputs = (grad_out, query, key, value, attn_bias)
    # the timing model: PyTorch's attention FLOP formula (torch_openreg/timing), while it prices launches
    price = {"cost": timing_costs.price_attention,
             "cost_args": ("sdpa_overrideable_backward", query, key, value,
                           [*grads, *(t for t in (*inputs, out, logsumexp) if t is not None)], True)}
    # The CPU's flash backward reads the logsumexp in the inputs' accumulation type, float64 for float64 inputs;
    # openreg keeps it in float32, as PyTorch's meta kernel says: float64 takes the math path's gradients.
    flash = not want_bias and query.dtype != torch.float64
    if flash and _cpu_uses_flash(query, key, value, attn_bias, dropout_p):
        launch(query.device.index, _flash_backward_kernel, host_views(*grads[:3]),
               *host_views(*inputs, out, logsumexp), is_causal, scale,
               tensors=[*grads, *(t for t in (*inputs, out, logsumexp) if t is not None)],
               writes=[g for g in grads[:3] if g is not None], name="sdpa_overrideable_backward", **price)
        return tuple(grads)
    launch(query.device.index, _backward_kernel, host_views(*grads),
           *host_views(*inputs), dropout_p, is_causal, scale,
           philox_seed, want_bias, tensors=[*grads, *(t for t in inputs if t is not None)],
           writes=[g for g in grads if g is not None], name="sdpa_overrideable_backward", **price)
    return tuple(grads)


def _backward_kernel(grads, grad_out, q, k, v, bias, dropout_p, is_causal, scale, state, want_bias):
    """The math path's gradients, written out (no autograd: a kernel may run on any thread,
    including one that is inside a dispatch below autograd)."""
    factor = scale if scale is not None else 1 / math.sqrt(q.size(-1))
    grad_out, q, k0, v0, bias = _wide(grad_out, q, k, v, bias)
    k, v = _expand_heads(q, k0), _expand_heads(q, v0)
    p = _softmax(_scores(q, k, bias, is_causal, scale))
    dropped = p
    if dropout_p > 0:
        gen = torch.Generator()
        gen.set_state(state)
        keep = _dropout_scale(p, dropout_p, gen)
        dropped = p * keep
    grad_v = dropped.transpose(-2, -1) @ grad_out
    grad_dropped = grad_out @ v.transpose(-2, -1)
    grad_p = grad_dropped * keep if dropout_p > 0 else grad_dropped
    grad_s = p * (grad_p - (grad_p * p).sum(-1, keepdim=True))
    computed = [grad_s @ k * factor, _fold_heads(grad_s.transpose(-2, -1) @ q * factor, k0, q),
                _fold_heads(grad_v, v0, q)]
    if want_bias:
        computed.append(grad_s)
    for view, g in zip(grads, computed):
        view.copy_(g.sum_to_size(view.shape))


# LITERALINCLUDE END: SDPA BACKWARD
