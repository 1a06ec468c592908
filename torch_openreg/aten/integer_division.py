"""``fmod`` and ``remainder`` of integers by a zero divisor, as CUDA computes them.

The CPU's kernels raise ``ZeroDivisionError``; CUDA's kernels divide anyway, and the GPU's integer division by
zero gives a fixed bit pattern (undefined behaviour in C++, so each backend has its own: ROCm returns the
dividend). PyTorch's ``test_binary_ufuncs`` (``test_fmod_remainder_by_zero_integral``) pins CUDA's: all ones
for 8-, 16- and 32-bit integers (255 for ``uint8``, -1 for ``int32``), and for ``int64`` all ones for a
negative dividend and the low 32 bits (4294967295) for the others. A program that runs on CUDA must not fail
on openreg at a later synchronize, where an asynchronous kernel's error would surface; so openreg gives CUDA's
values: the divisor's zeros are replaced by ones for the CPU kernel and the results there filled after it,
three or four more launches for an integer call (floating-point calls go straight to the fallback).

Registered for the overloads every form reaches: ``fmod.Tensor``/``remainder.Tensor`` (a scalar divisor arrives as
a wrapped number, which reaches a Python kernel as a Python number), their ``out=`` overloads (the in-place forms'
structured wrapper writes through them) and ``remainder.Scalar_Tensor`` (a scalar dividend).
"""

from __future__ import annotations

from typing import Any

import torch

from .fallback import fallback

__all__ = ["OVERLOADS", "kernel_for"]

OVERLOADS = ("fmod.Tensor", "fmod.Tensor_out", "remainder.Tensor", "remainder.Tensor_out", "remainder.Scalar_Tensor")


# LITERALINCLUDE START: INTEGER DIVISION BY ZERO
def _pattern(dtype: torch.dtype) -> int:
    """What CUDA's integer division by zero leaves in a ``dtype`` result (int64: for a negative dividend)."""
    if dtype.is_signed:
        return -1
    return (1 << (torch.iinfo(dtype).bits)) - 1


def _as(value: int, dtype: torch.dtype) -> int:
    """``value`` of the computation's dtype as the result's (an in-place or out= result may be narrower: CUDA
    casts, keeping the low bits)."""
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        return value
    bits = torch.iinfo(dtype).bits
    value &= (1 << bits) - 1
    return value - (1 << bits) if dtype.is_signed and value >> (bits - 1) else value


def kernel_for(op: torch._ops.OpOverload) -> Any:
    """The PrivateUse1 kernel of ``op`` (one of :data:`OVERLOADS`)."""

    def kernel(self: torch.Tensor | int, other: torch.Tensor | int, *, out: torch.Tensor | None = None) -> Any:
        given = {} if out is None else {"out": out}
        dtype = torch.result_type(self, other)
        if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
            return fallback(op, self, other, **given)
        device = (other if isinstance(other, torch.Tensor) else self).device
        if not isinstance(other, torch.Tensor) or other.device.type == "cpu":  # a scalar divisor: known on the host
            if other != 0:
                return fallback(op, self, other, **given)
            zero, safe = torch.ones((), dtype=torch.bool, device=device), 1
        else:
            zero = other == 0
            safe = torch.where(zero, torch.ones((), dtype=other.dtype, device=other.device), other)
        # before the call (an in-place call overwrites self); a scalar dividend's sign is known here
        negative = (self < 0 if isinstance(self, torch.Tensor) else torch.tensor(self < 0, device=device)
                    ) if dtype == torch.int64 else None
        result = fallback(op, self, safe, **given)
        if negative is None:
            result.masked_fill_(zero, _as(_pattern(dtype), result.dtype))
        else:
            result.masked_fill_(zero & negative, _as(-1, result.dtype))
            result.masked_fill_(zero & ~negative, _as((1 << 32) - 1, result.dtype))
        return result

    return kernel
# LITERALINCLUDE END: INTEGER DIVISION BY ZERO
