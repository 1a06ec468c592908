"""``nn.RMSNorm`` as CUDA runs it. ``rms_norm`` calls ``aten::_fused_rms_norm``, which has CUDA, MPS and
XPU kernels and a composite for every other device; autograd's backward of it calls
``_fused_rms_norm_backward`` (CUDA and XPU kernels only). Without kernels of its own, openreg would run
the composite's six operators forward and their autograd's fifteen backward, where a CUDA device runs one
kernel each way: the timing model prices what openreg launches, so an RMSNorm step came out about 8x a
GPU's (issue 32's operator audit). These run one launch each way. The forward is the CPU's composite
over host views (its results exactly); the backward is the gradient of ``x * rstd * weight``, computed
in float32 as the composite's autograd computes it.
"""

from __future__ import annotations

import torch

from torch_openreg.timing import costs as timing_costs

from .launch import host_views, launch

_FORWARD = torch.ops.aten._fused_rms_norm.default


def _metas(input: torch.Tensor, normalized_shape, weight, eps) -> tuple:
    """The outputs' shapes, dtypes and strides, from the composite run on ``meta`` tensors."""
    def meta(t):
        return None if t is None else torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")

    return _FORWARD(meta(input), normalized_shape, meta(weight), eps)


def fused_rms_norm(input: torch.Tensor, normalized_shape, weight=None, eps=None):
    """``aten::_fused_rms_norm`` for openreg tensors: ``(output, rstd)``, one launch."""
    out_meta, rstd_meta = _metas(input, normalized_shape, weight, eps)
    out, rstd = (torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=input.device)
                 for m in (out_meta, rstd_meta))
    tensors = [t for t in (out, rstd, input, weight) if t is not None]
    # priced (only while the timing model prices launches) as one normalization, as CUDA's kernel
    launch(input.device.index, _forward_kernel, *host_views(out, rstd, input, weight), list(normalized_shape), eps,
           tensors=tensors, writes=(out, rstd), name=timing_costs.launch_name(_FORWARD),
           cost=timing_costs.price_op, cost_args=(_FORWARD, (input, normalized_shape, weight, eps), {}))
    return out, rstd


def _forward_kernel(out, rstd, x, w, normalized_shape, eps) -> None:
    o, r = _FORWARD(x, normalized_shape, w, eps)
    out.copy_(o)
    rstd.copy_(r)


def fused_rms_norm_backward(grad_out: torch.Tensor, input: torch.Tensor, normalized_shape, rstd: torch.Tensor,
                            weight, output_mask):
    """``aten::_fused_rms_norm_backward``: ``(grad_input, grad_weight)``, one launch (an output the mask
    does not ask for is an empty tensor, as openreg's attention backward returns one)."""
    want_input, want_weight = bool(output_mask[0]), bool(output_mask[1]) and weight is not None
    grad_input = torch.empty_like(input) if want_input else torch.empty(0, device=input.device)
    grad_weight = torch.empty_like(weight) if want_weight else torch.empty(0, device=input.device)
    reads = [t for t in (grad_out, input, rstd, weight) if t is not None]
    written = [t for t, wanted in ((grad_input, want_input), (grad_weight, want_weight)) if wanted]
    name = "aten::_fused_rms_norm_backward"
    # priced as two passes, as the normalization backwards (torch_openreg/timing)
    launch(input.device.index, _backward_kernel, *host_views(grad_input, grad_weight, grad_out, input, rstd, weight),
           len(normalized_shape), want_input, want_weight, tensors=[*written, *reads], writes=written, name=name,
           cost=timing_costs.price_norm_backward, cost_args=(name, reads, written))
    return grad_input, grad_weight


def _backward_kernel(grad_input, grad_weight, grad, x, rstd, w, dims: int, want_input: bool,
                     want_weight: bool) -> None:
    """y = x * rstd * w with rstd = (mean(x^2) + eps)^-1/2 over the last ``dims`` dimensions:
    dx = rstd * (g*w - x_hat * mean(g*w * x_hat)), dw = sum of g * x_hat over the leading dimensions."""
    g, x_hat = grad.float(), x.float() * rstd.float()
    normalized = tuple(range(x.dim() - dims, x.dim()))
    scaled = g * w.float() if w is not None else g
    if want_input:
        grad_input.copy_(rstd.float() * (scaled - x_hat * (scaled * x_hat).mean(normalized, keepdim=True)))
    if want_weight:
        leading = tuple(range(x.dim() - dims))
        grad_weight.copy_((g * x_hat).sum(leading) if leading else g * x_hat)
