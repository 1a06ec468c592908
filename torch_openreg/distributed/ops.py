"""What one collective hands its kernel: the reduce operations, the op record, the host buffers.

The c10d reduce operations arrive as numbers (``ReduceOp.RedOpType``); an :class:`Op` is one collective inside
a launch (its device tensors, its check against the peers, how it is issued on the transport); a
:class:`HostBuffer` is a host view in the form the transport (gloo) takes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from .checks import Signature
    from .work import Work

SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM = range(9)
OP_NAMES = ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "PREMUL_SUM", "UNUSED")
# what the transport reduces (gloo's types); complex tensors travel as real pairs for SUM-like operations
REDUCIBLE = {torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
             torch.float32, torch.float64, torch.complex64, torch.complex128}

Issue = Callable[[list, list], Callable[[], None] | None]  # (host views, handles out) -> finish


class TransportError(RuntimeError):
    """The transport failed a transfer: a peer exited, or it did not arrive within the timeout."""


class Op:
    """One collective inside a launch: the device tensors it touches, how it is checked and issued."""

    __slots__ = ("tensors", "signature", "issue", "check", "verify", "work")

    def __init__(self, tensors: Sequence[torch.Tensor], issue: Issue, signature: Signature | None = None,
                 verify: Callable[[], None] | None = None) -> None:
        self.tensors, self.issue, self.signature = list(tensors), issue, signature
        self.check = None
        self.verify = verify  # point-to-point calls check their header instead
        self.work: Work | None = None  # the Work of the call, set before the launch


class HostBuffer:
    """A host view as the transport takes it: contiguous, complex as real pairs, or as raw bytes.

    A view that is not contiguous (or carries a lazy conjugate/negative bit) is staged through a
    contiguous copy, written back by :meth:`store` for outputs.
    """

    def __init__(self, view: torch.Tensor, *, raw: bool = False, load: bool = True) -> None:
        self.view = view
        direct = view.is_contiguous() and not view.is_conj() and not view.is_neg()
        if direct:
            self.staging = view
        elif load:
            self.staging = view.resolve_conj().resolve_neg().contiguous()
        else:
            self.staging = torch.empty(view.shape, dtype=view.dtype)
        t = self.staging
        if raw:
            t = t.reshape(-1).view(torch.uint8)
        elif t.is_complex():
            t = torch.view_as_real(t)
        self.t = t

    def store(self) -> None:
        if self.staging is not self.view:
            self.view.copy_(self.staging)



def drain(handles: list) -> None:
    """Wait for every transfer issued, ignoring their errors (the first error is the one reported)."""
    for handle in handles:
        try:
            handle.wait()
        except Exception:  # noqa: BLE001 - the first error is the one reported
            pass
