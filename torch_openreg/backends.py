"""``torch.backends.openreg``: the flags that change how openreg computes (``torch.backends.cuda``'s role).

openreg's kernels are the CPU's, so most of ``torch.backends.cuda``/``cudnn`` has nothing to act on
here (there is no cuBLAS or cuDNN to configure). One flag changes results and is worth having: TF32
matrix multiplication, which CUDA code turns on with ``torch.backends.cuda.matmul.allow_tf32 = True``
and which makes float32 matmuls round their operands to TF32 (10 mantissa bits, round to nearest
even) and accumulate in float32, as tensor cores do.

``torch.backends.openreg.matmul.fp32_precision = "tf32"`` (or ``allow_tf32 = True``) gives openreg the
same numerics: while it is on, ``mm``, ``bmm``, ``addmm`` and ``baddbmm`` (so ``matmul``, ``linear``
and their gradients) round their float32 matrix operands to TF32 before the CPU kernel runs. The
kernels are registered only while the flag is on, so the default path costs nothing. Unlike CUDA's flag
it does not follow ``torch.set_float32_matmul_precision``: following it would need a check on every
matrix multiplication, on the backend's hottest path.
"""

from __future__ import annotations

import functools
import sys
import warnings

import torch

from .aten.fallback import fallback
from .timing import costs

# LITERALINCLUDE START: TF32
# operator -> positions of its matrix operands (addmm's and baddbmm's first argument is the addend)
TF32_OPERANDS = {"mm": (0, 1), "bmm": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2)}


def round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """``t`` (float32) with its mantissa rounded to TF32's 10 bits, to nearest even; a new tensor."""
    bits = t.contiguous().view(torch.int32)
    half_ulp_even = 0x0FFF + ((bits >> 13) & 1)
    finite = (bits & 0x7F800000) != 0x7F800000  # infinities and NaNs are kept as they are
    rounded = torch.where(finite, (bits + half_ulp_even) & ~0x1FFF, bits)
    return rounded.view(torch.float32)


def _tf32_kernel(op: torch._ops.OpOverload, operands: tuple, *args, **kwargs):
    args = list(args)
    for i in operands:
        if args[i].dtype == torch.float32:
            args[i] = round_to_tf32(args[i])
    return fallback(op, *args, **kwargs)


class _Matmul:
    """``torch.backends.openreg.matmul``: ``fp32_precision`` ("ieee" or "tf32") and ``allow_tf32``."""

    _lib: torch.library.Library | None = None

    @property
    def fp32_precision(self) -> str:
        return "ieee" if self._lib is None else "tf32"

    @fp32_precision.setter
    def fp32_precision(self, value: str) -> None:
        if value not in ("ieee", "tf32"):
            raise ValueError(f"torch.backends.openreg.matmul.fp32_precision must be 'ieee' or 'tf32', got {value!r}")
        if value == "tf32" and self._lib is None:
            lib = torch.library.Library("aten", "IMPL")
            with warnings.catch_warnings():  # it overrides the fallback's registration until the flag goes off
                warnings.simplefilter("ignore")
                for name, operands in TF32_OPERANDS.items():
                    op = getattr(torch.ops.aten, name).default
                    lib.impl(name, functools.partial(_tf32_kernel, op, operands), "PrivateUse1")
            type(self)._lib = lib
        elif value == "ieee" and self._lib is not None:
            self._lib._destroy()  # the previous kernels (the fallback's) are current again
            type(self)._lib = None
        costs.tf32 = self._lib is not None  # the timing model prices float32 matrix products as TF32 ones

    @property
    def allow_tf32(self) -> bool:
        return self.fp32_precision == "tf32"

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        self.fp32_precision = "tf32" if value else "ieee"
# LITERALINCLUDE END: TF32


matmul = _Matmul()


def is_built() -> bool:
    """Whether PyTorch has the openreg backend (it is loaded)."""
    return True


def is_available() -> bool:
    """Whether an openreg device exists."""
    return torch.openreg.is_available()


sys.modules["torch.backends.openreg"] = sys.modules[__name__]
torch.backends.openreg = sys.modules[__name__]
