"""Sharing openreg tensors between processes (``torch.multiprocessing``).

PyTorch pickles a tensor sent through a ``torch.multiprocessing`` queue as its
storage plus metadata. For openreg storages this module's reducer exports the
device allocation (the device's shared-memory object, passed as a duplicated
file descriptor, with the allocation's place in it and the storage's offset in
that); the receiving process maps the allocation and rebuilds the storage over it. Both processes then see the
same device memory, like CUDA IPC. As with CUDA, the sender must keep the
tensor alive while the receiver uses it, and a received tensor cannot be
shared onward.
"""

from __future__ import annotations

from multiprocessing.reduction import DupFd, ForkingPickler

import torch
import torch.multiprocessing  # noqa: F401  (installs PyTorch's reducers, which we wrap)

import openreg
from torch_openreg import _C


# LITERALINCLUDE START: IPC REDUCE
def _export(untyped: torch.UntypedStorage) -> tuple:
    """Reduce args for an openreg storage: the device's shared-memory object, the allocation's size and place
    in it, and the storage's place in the allocation."""
    device = untyped.device.index
    if untyped.nbytes() == 0:
        return (None, device, 0, 0, 0, 0)
    openreg.stream.drain(device)  # the receiver sees what was queued before the send (CUDA's IPC event)
    try:
        handle = openreg.ipc_export(untyped.data_ptr())
    except openreg.OpenRegError as error:
        raise RuntimeError(
            "Cannot share an openreg tensor that was received from another process: only the process "
            f"that allocated it can share it ({error.message})"
        ) from None
    return (DupFd(handle.fd), device, handle.mapped, handle.offset, untyped.nbytes(), handle.file_offset)


def rebuild_storage(fd, device: int, mapped: int, offset: int, nbytes: int, file_offset: int = 0
                    ) -> torch.UntypedStorage:
    """Map the sender's allocation here and wrap the storage's bytes (no copy)."""
    if fd is None:
        return torch.UntypedStorage(0, device=torch.device("openreg", device))
    base = openreg.ipc_open(fd.detach(), device, mapped, file_offset)
    return _C._ipc_tensor(base + offset, nbytes, device, base).untyped_storage()
# LITERALINCLUDE END: IPC REDUCE


def rebuild_typed_storage(args: tuple, dtype: torch.dtype) -> torch.storage.TypedStorage:
    return torch.storage.TypedStorage(wrap_storage=rebuild_storage(*args), dtype=dtype, _internal=True)


def _wrap(reducer):
    def reduce(storage):
        untyped = storage if isinstance(storage, torch.UntypedStorage) else storage._untyped_storage
        if untyped.device.type != "openreg":
            return reducer(storage)
        if isinstance(storage, torch.UntypedStorage):
            return (rebuild_storage, _export(untyped))
        return (rebuild_typed_storage, (_export(untyped), storage.dtype))

    reduce.__wrapped__ = reducer
    return reduce


def install() -> None:
    """Wrap PyTorch's storage reducers so that openreg storages are shared through the runtime."""
    for cls, reducer in list(ForkingPickler._extra_reducers.items()):
        if isinstance(cls, type) and issubclass(cls, (torch.UntypedStorage, torch.storage.TypedStorage)):
            if not hasattr(reducer, "__wrapped__"):
                ForkingPickler.register(cls, _wrap(reducer))
