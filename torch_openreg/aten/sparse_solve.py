"""Triangular solves with a block-sparse (BSR) matrix and a unit diagonal, as CUDA computes them.

CUDA solves ``torch.triangular_solve(b, A, unitriangular=True)`` for a BSR ``A`` (cuSPARSE); the CPU's sparse
kernel cannot: it fails converting ``A`` ("conversion from Sparse to SparseBsr without blocksize argument given
is not supported"), and PyTorch's own tests skip the case for the CPU only. openreg runs the CPU's kernels, so
this case is solved here, on the device, over ``A``'s dense form: the same triangular system, its diagonal taken
as ones whatever it stores. An ``A`` without stored blocks gives NaN, as the sparse kernels do; the cloned
coefficient is empty, as for every sparse ``A``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .traits import OpTraits, traits_of

_OPS = ("aten::triangular_solve", "aten::triangular_solve.X")


def applies(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> bool:
    """Whether this call is one the CPU's sparse kernel cannot compute and CUDA's can."""
    if op.name() not in _OPS:
        return False
    traits = traits_of(op)
    return _value(traits, args, kwargs, "A").layout == torch.sparse_bsr and bool(
        _value(traits, args, kwargs, "unitriangular"))


# LITERALINCLUDE START: BSR UNIT TRIANGULAR SOLVE
def solve(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``triangular_solve`` (and its ``out=`` overload) of a BSR ``A`` with a unit diagonal."""
    traits = traits_of(op)
    b, a = _value(traits, args, kwargs, "self"), _value(traits, args, kwargs, "A")
    dense, upper = a.to_dense(), bool(_value(traits, args, kwargs, "upper"))
    if _value(traits, args, kwargs, "transpose"):  # solve A^T x = b (a plain transpose, as triangular_solve's)
        dense, upper = dense.mT, not upper
    solution = torch.linalg.solve_triangular(dense, b, upper=upper, unitriangular=True)
    if a._nnz() == 0:
        solution.fill_(math.nan)
    out, cloned = kwargs.get("X"), kwargs.get("M")
    if out is None:
        return solution, torch.empty(0, dtype=a.dtype, device=a.device)
    if out.shape != solution.shape:
        out.resize_(solution.shape)
    out.copy_(solution)
    cloned.resize_(0)
    return out, cloned
# LITERALINCLUDE END: BSR UNIT TRIANGULAR SOLVE


def _value(traits: OpTraits, args: tuple, kwargs: dict, name: str) -> Any:
    """The argument ``name`` as called, or its schema default."""
    return traits.value(args, kwargs, traits.positions[name])
