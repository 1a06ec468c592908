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

_NAMES = ("self", "A", "upper", "transpose", "unitriangular")
_DEFAULTS = (None, None, True, False, False)


def applies(name: str, args: tuple, kwargs: dict) -> bool:
    """Whether this call is one the CPU's sparse kernel cannot compute and CUDA's can."""
    if name not in ("aten::triangular_solve", "aten::triangular_solve.X"):
        return False
    values = _arguments(args, kwargs)
    return values["A"].layout == torch.sparse_bsr and bool(values["unitriangular"])


# LITERALINCLUDE START: BSR UNIT TRIANGULAR SOLVE
def solve(args: tuple, kwargs: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``triangular_solve`` (and its ``out=`` overload) of a BSR ``A`` with a unit diagonal."""
    values = _arguments(args, kwargs)
    b, a = values["self"], values["A"]
    dense, upper = a.to_dense(), bool(values["upper"])
    if values["transpose"]:  # solve A^T x = b (a plain transpose, as triangular_solve's)
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


def _arguments(args: tuple, kwargs: dict) -> dict[str, Any]:
    values = dict(zip(_NAMES, _DEFAULTS))
    values.update(zip(_NAMES, args))
    values.update((k, v) for k, v in kwargs.items() if k in values)
    return values
