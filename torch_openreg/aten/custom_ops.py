"""Custom operators in the ``openreg`` namespace, and a ``torch.autograd.Function``.

``openreg::scaled_mul`` is defined with ``torch.library.custom_op`` (schema inferred from the type
hints) plus ``register_fake`` and ``register_autograd``. ``openreg::softclip`` is defined the
lower-level way, with ``torch.library.Library``: a schema string, then one kernel per dispatch key
(PrivateUse1, CPU, Meta, AutogradPrivateUse1). ``openreg::count_nonfinite`` is not differentiable:
its AutogradPrivateUse1 entry is a fallthrough.
"""

from __future__ import annotations

import torch

from .launch import host_view, launch


# LITERALINCLUDE START: CUSTOM OP
@torch.library.custom_op("openreg::scaled_mul", mutates_args=(), device_types="openreg")
def scaled_mul(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    """``alpha * x * y`` for same-shaped tensors (the openreg kernel: a launch over host views)."""
    torch._check(x.shape == y.shape, lambda: "scaled_mul: x and y must have the same shape")  # at the call
    out = torch.empty_like(x)
    launch(x.device.index, _scaled_mul_kernel, host_view(out), host_view(x), host_view(y), alpha,
           tensors=(out, x, y), writes=(out,), name="openreg::scaled_mul")
    return out


def _scaled_mul_kernel(out, x, y, alpha):
    torch.mul(x, y, out=out)
    out.mul_(alpha)


@scaled_mul.register_kernel("cpu")
def _(x, y, alpha):
    return alpha * x * y


@scaled_mul.register_fake
def _(x, y, alpha):
    torch._check(x.shape == y.shape, lambda: "scaled_mul: x and y must have the same shape")
    return torch.empty_like(x)


def _setup_context(ctx, inputs, output):
    x, y, alpha = inputs
    ctx.save_for_backward(x, y)
    ctx.alpha = alpha


def _backward(ctx, grad):
    x, y = ctx.saved_tensors
    return scaled_mul(grad, y, ctx.alpha), scaled_mul(grad, x, ctx.alpha), None


scaled_mul.register_autograd(_backward, setup_context=_setup_context)
# LITERALINCLUDE END: CUSTOM OP


# LITERALINCLUDE START: LIBRARY DEF
lib = torch.library.Library("openreg", "FRAGMENT")  # custom_op above already created the namespace
lib.define("softclip(Tensor x, float limit) -> Tensor")
lib.define("count_nonfinite(Tensor x) -> Tensor")


def softclip_openreg(x: torch.Tensor, limit: float) -> torch.Tensor:
    """``limit * tanh(x / limit)`` on the device."""
    out = torch.empty_like(x)
    launch(x.device.index, _softclip_kernel, host_view(out), host_view(x), limit, tensors=(out, x), writes=(out,),
           name="openreg::softclip")
    return out


def _softclip_kernel(out, x, limit):
    torch.div(x, limit, out=out)
    out.tanh_().mul_(limit)


def softclip_cpu(x, limit):
    return limit * torch.tanh(x / limit)


def softclip_meta(x, limit):
    return torch.empty_like(x)


class _SoftClip(torch.autograd.Function):
    """The autograd kernel: record the backward, then redispatch below autograd."""

    @staticmethod
    def forward(ctx, x, limit):
        with torch._C._AutoDispatchBelowAutograd():
            out = torch.ops.openreg.softclip(x, limit)
        ctx.save_for_backward(out)
        ctx.limit = limit
        return out

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return grad * (1 - (out / ctx.limit) ** 2), None


def softclip_autograd(x, limit):
    return _SoftClip.apply(x, limit)


lib.impl("softclip", softclip_openreg, "PrivateUse1")
lib.impl("softclip", softclip_cpu, "CPU")
lib.impl("softclip", softclip_meta, "Meta")
lib.impl("softclip", softclip_autograd, "AutogradPrivateUse1")
lib.impl("softclip", softclip_autograd, "AutogradCPU")
# LITERALINCLUDE END: LIBRARY DEF


# LITERALINCLUDE START: FALLTHROUGH
def count_nonfinite_openreg(x: torch.Tensor) -> torch.Tensor:
    """Number of NaN/inf elements, as a 0-dim int64 device tensor (not differentiable)."""
    out = torch.empty((), dtype=torch.int64, device=x.device)
    launch(x.device.index, lambda o, v: o.fill_((~torch.isfinite(v)).sum()), host_view(out), host_view(x),
           tensors=(out, x), writes=(out,), name="openreg::count_nonfinite")
    return out


lib.impl("count_nonfinite", count_nonfinite_openreg, "PrivateUse1")
lib.impl("count_nonfinite", lambda x: torch.empty((), dtype=torch.int64, device="meta"), "Meta")
# Nothing to differentiate: skip the autograd key instead of PyTorch's "autograd not implemented"
# kernel, which would warn (or fail in backward) for inputs that require grad.
lib.impl("count_nonfinite", torch.library.fallthrough_kernel, "AutogradPrivateUse1")
# LITERALINCLUDE END: FALLTHROUGH


# LITERALINCLUDE START: AUTOGRAD FUNCTION
class ScaleInPlace(torch.autograd.Function):
    """Multiplies its input in place and returns it: ``mark_dirty`` tells autograd so."""

    @staticmethod
    def forward(ctx, x, alpha):
        x.mul_(alpha)  # a launch on the stream, like any openreg operator
        ctx.mark_dirty(x)
        ctx.alpha = alpha
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.alpha, None


class SplitHalves(torch.autograd.Function):
    """Returns views of its input (its two halves) and a non-differentiable mask of the first."""

    @staticmethod
    def forward(ctx, x):
        n = x.shape[0] // 2
        first, second = x[:n], x[n:]
        positive = first > 0
        ctx.mark_non_differentiable(positive)
        ctx.shape, ctx.n = x.shape, n
        return first, second, positive

    @staticmethod
    def backward(ctx, grad_first, grad_second, _grad_positive):
        grad = grad_first.new_zeros(ctx.shape)
        grad[: ctx.n] = grad_first
        grad[ctx.n :] = grad_second
        return grad
# LITERALINCLUDE END: AUTOGRAD FUNCTION
