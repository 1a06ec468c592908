"""Scaled dot product attention through the "overrideable" fused backend.

For a PrivateUse1 query, ``scaled_dot_product_attention`` asks ``_fused_sdp_choice_stub`` which
backend to use; the bridge answers ``overrideable`` (``csrc/examples.cpp``), so PyTorch calls
``aten::_scaled_dot_product_fused_attention_overrideable`` and, in backward, its ``_backward``.
Both kernels here are launches over host views. Where the CPU would use its fused flash kernel
(``_fused_sdp_choice`` asked with host views of the inputs: no dropout, 4-D inputs, ...), they call
that kernel, so openreg computes exactly what the CPU computes, as fast; otherwise they compute
PyTorch's math path (its formulas, in CPU operators). Dropout draws a
seed from the device's generator at the call; forward and backward rebuild the same keep-mask
from it, so backward sees exactly the dropout forward applied.
"""

from __future__ import annotations

import math

import torch

from torch_openreg import _C

from .launch import host_views, launch


def _keep_mask(seed: int, shape, p: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=gen) >= p


def _scores(q, k, bias, is_causal, scale):
    """Attention scores before softmax, as the math path forms them."""
    s = (q @ k.transpose(-2, -1)) * (scale if scale is not None else 1 / math.sqrt(q.size(-1)))
    if is_causal:
        L, S = q.size(-2), k.size(-2)
        s = s.masked_fill(~torch.ones(L, S, dtype=torch.bool).tril(), float("-inf"))
    if bias is not None:
        s = s.masked_fill(~bias, float("-inf")) if bias.dtype == torch.bool else s + bias
    return s


# LITERALINCLUDE START: SDP CHOICE OP
def fused_sdp_choice(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None,
                     enable_gqa=False) -> int:
    """``aten::_fused_sdp_choice``: the same answer as the bridge's stub (``SDPBackend`` values)."""
    return 0 if enable_gqa else 4  # math, overrideable
# LITERALINCLUDE END: SDP CHOICE OP


def _softmax(scores):
    """The math path's softmax: a row with every position masked out gives zeros, not NaN."""
    return torch.ops.aten._safe_softmax.default(scores, -1)


# LITERALINCLUDE START: SDPA FLASH
def _cpu_uses_flash(query, key, value, attn_bias, dropout_p, is_causal, scale) -> bool:
    """Whether CPU eager would run this attention with its flash kernel (asked of PyTorch's own choice)."""
    if dropout_p > 0:
        return False  # the math path's dropout mask is the one both directions rebuild from the seed
    views = host_views(query, key, value, attn_bias)  # metadata only
    return torch.ops.aten._fused_sdp_choice.default(*views, 0.0, is_causal, scale=scale) == 1  # SDPBackend.flash


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
    batch = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2], value.shape[:-2])  # 3-D or 4-D, broadcast
    dev = query.device
    # The dropout seed is drawn by the kernel, on the stream, in order with the other random kernels
    # (the generator drains queued work before the host touches it); the backward kernel reads it there.
    seed_t = torch.zeros((), dtype=torch.int64)  # CPU scalars, as CUDA's philox seed/offset may be
    gen = _C._cpu_generator(_C._default_generator(dev.index)) if dropout_p > 0 else None
    out = _like_query_layout(query, (*batch, L, Ev))
    # PyTorch's meta kernel gives 3-D inputs a (1, H, L) logsumexp: compiled graphs check it
    lse = torch.empty(*((1,) if query.dim() == 3 else ()), *batch, L, dtype=torch.float32, device=dev)
    tensors = [t for t in (out, lse, query, key, value, attn_bias) if t is not None]
    views = host_views(out, lse, query, key, value, attn_bias)
    if _cpu_uses_flash(query, key, value, attn_bias, dropout_p, is_causal, scale):
        launch(dev.index, _flash_forward_kernel, *views, is_causal, scale, tensors=tensors, name="sdpa_overrideable")
    else:
        launch(dev.index, _forward_kernel, *views, dropout_p, is_causal, scale, seed_t.data, gen, tensors=tensors,
               name="sdpa_overrideable")
    # (``.data``: the kernel's write must not bump the version autograd saved seed_t at)
    offset_t = torch.tensor(0, dtype=torch.int64)
    debug = torch.empty(0, dtype=query.dtype, device=dev)
    return out, lse, None, None, L, S, seed_t, offset_t, debug


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
    """float16/bfloat16 inputs are computed in float32, as the CPU's fused attention accumulates."""
    return [t.float() if t is not None and t.dtype in (torch.float16, torch.bfloat16) else t for t in tensors]


def _forward_kernel(out, lse, q, k, v, bias, dropout_p, is_causal, scale, seed_t, gen):
    q, k, v, bias = _wide(q, k, v, bias)
    scores = _scores(q, k, bias, is_causal, scale)
    p = _softmax(scores)
    if dropout_p > 0:
        seed_t.fill_(int(torch.randint(0, 2**62, (), generator=gen)))
        p = p * _keep_mask(int(seed_t), p.shape, dropout_p) / (1 - dropout_p)
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
    grads = [torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)]
    want_bias = attn_bias is not None and attn_bias.is_floating_point() and grad_input_mask[3]
    grads.append(torch.empty_like(attn_bias) if want_bias else torch.empty(0, device=query.device))
    inputs = (grad_out, query, key, value, attn_bias)
    if not want_bias and _cpu_uses_flash(query, key, value, attn_bias, dropout_p, is_causal, scale):
        launch(query.device.index, _flash_backward_kernel, host_views(*grads[:3]),
               *host_views(*inputs, out, logsumexp), is_causal, scale,
               tensors=[*grads, *(t for t in (*inputs, out, logsumexp) if t is not None)],
               name="sdpa_overrideable_backward")
        return tuple(grads)
    launch(query.device.index, _backward_kernel, host_views(*grads),
           *host_views(*inputs), dropout_p, is_causal, scale,
           philox_seed, want_bias, tensors=[*grads, *(t for t in inputs if t is not None)],
           name="sdpa_overrideable_backward")
    return tuple(grads)


def _backward_kernel(grads, grad_out, q, k, v, bias, dropout_p, is_causal, scale, seed_t, want_bias):
    """The math path's gradients, written out (no autograd: a kernel may run on any thread,
    including one that is inside a dispatch below autograd)."""
    scale = scale if scale is not None else 1 / math.sqrt(q.size(-1))
    grad_out, q, k, v, bias = _wide(grad_out, q, k, v, bias)
    p = _softmax(_scores(q, k, bias, is_causal, scale))
    dropped = p
    if dropout_p > 0:
        keep = _keep_mask(int(seed_t), p.shape, dropout_p)
        dropped = p * keep / (1 - dropout_p)
    grad_v = dropped.transpose(-2, -1) @ grad_out
    grad_dropped = grad_out @ v.transpose(-2, -1)
    grad_p = grad_dropped * keep / (1 - dropout_p) if dropout_p > 0 else grad_dropped
    grad_s = p * (grad_p - (grad_p * p).sum(-1, keepdim=True))
    computed = [grad_s @ k * scale, grad_s.transpose(-2, -1) @ q * scale, grad_v]
    if want_bias:
        computed.append(grad_s)
    for view, g in zip(grads, computed):
        view.copy_(g.sum_to_size(view.shape))


# LITERALINCLUDE END: SDPA BACKWARD
