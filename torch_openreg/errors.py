"""openreg's driver errors as PyTorch's device errors.

CUDA reports a failed runtime call as ``torch.AcceleratorError`` (and running out of memory as
``torch.OutOfMemoryError``, which the bridge already raises). :func:`install` makes every
``openreg.OpenRegError`` the runtime raises an instance of :class:`AcceleratorError` as well, so
``except torch.AcceleratorError`` catches an invalid device ordinal or a failed kernel on openreg as it
does on CUDA, while the error keeps its driver code (``.code``) and, for a failed kernel, the kernel's
own exception type.
"""

from __future__ import annotations

import torch

import openreg


# LITERALINCLUDE START: ACCELERATOR ERROR
class AcceleratorError(openreg.OpenRegError, torch.AcceleratorError):
    """A failed openreg driver call, seen from PyTorch: also a ``torch.AcceleratorError``."""

    @property
    def error_code(self) -> int:
        """The driver's numeric code (``cudaError_t``-like), as CUDA's error reports its own."""
        return int(self.code)


def install() -> None:
    """Make the runtime raise :class:`AcceleratorError` for every driver error."""
    openreg.errors.set_error_class(AcceleratorError)
# LITERALINCLUDE END: ACCELERATOR ERROR
