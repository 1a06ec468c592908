"""``pow`` with a ``ComplexHalf`` result, computed as CUDA computes it: in ``complex64``, rounded to ``ComplexHalf``.

The CPU has no ``ComplexHalf`` kernel for ``pow`` ("not implemented for 'ComplexHalf'"); CUDA's pow kernels
take it and compute in ``complex<float>`` (``at::opmath_type``), and PyTorch's ``test_binary_ufuncs``
(``test_complex_scalar_pow_tensor``, ``test_pow`` with a complex base and a ``float16`` exponent) expect a result
on every device but the CPU. openreg runs the CPU's ``complex64`` kernel on the arguments widened to 32-bit
floats and rounds the result, which is CUDA's arithmetic; every other dtype goes straight to the fallback.

Registered for ``pow``'s functional and ``out=`` overloads (the in-place forms' structured wrappers write
through the ``out=`` ones).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .fallback import fallback
from .outputs import RESIZE_WARNING

__all__ = ["OVERLOADS", "kernel_for"]

OVERLOADS = ("pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar",
             "pow.Tensor_Tensor_out", "pow.Tensor_Scalar_out", "pow.Scalar_out")

_WIDER = {torch.complex32: torch.complex64, torch.float16: torch.float32, torch.bfloat16: torch.float32}


# LITERALINCLUDE START: COMPLEX HALF POW
def _name(dtype: torch.dtype) -> str:
    """c10's name of ``dtype`` (``Long``, ``ComplexFloat``), as PyTorch's errors say it."""
    return torch.empty(0, dtype=dtype).type().removeprefix("torch.").removesuffix("Tensor")


def _widen(value: Any) -> Any:
    return value.to(_WIDER[value.dtype]) if isinstance(value, torch.Tensor) and value.dtype in _WIDER else value


def kernel_for(op: torch._ops.OpOverload) -> Any:
    """The PrivateUse1 kernel of ``op`` (one of :data:`OVERLOADS`)."""
    functional = getattr(torch.ops.aten.pow, op._overloadname.removesuffix("_out"))

    def kernel(self: Any, exponent: Any, *, out: torch.Tensor | None = None) -> Any:
        if torch.result_type(self, exponent) != torch.complex32:
            return fallback(op, self, exponent) if out is None else fallback(op, self, exponent, out=out)
        result = fallback(functional, _widen(self), _widen(exponent)).to(torch.complex32)
        if out is None:
            return result
        if not torch.can_cast(result.dtype, out.dtype):  # as TensorIterator checks an out= argument
            raise RuntimeError(f"result type ComplexHalf can't be cast to the desired output type {_name(out.dtype)}")
        if out.shape != result.shape:
            if out.numel():
                warnings.warn(RESIZE_WARNING.format(list(out.shape), list(result.shape)), UserWarning, stacklevel=2)
            out.resize_(result.shape)
        return out.copy_(result)

    return kernel
# LITERALINCLUDE END: COMPLEX HALF POW
