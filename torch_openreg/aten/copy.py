"""Copies between cpu and openreg and between openreg devices, and ``.item()``.

PyTorch routes every ``copy_`` that involves a PrivateUse1 tensor to
``aten::_copy_from``. Copies are kernels on the current stream; a copy to or
from pageable host memory waits for itself (as ``cudaMemcpy`` does), while a
``non_blocking`` copy with a pinned host side returns at once.
"""

from __future__ import annotations

import torch

import openreg
from torch_openreg import _C
from torch_openreg.device import sync_debug
from torch_openreg.memory import host_allocator, owner

from .launch import host_view, launch, run_sync


def _copy_into(dst_view: torch.Tensor, src: torch.Tensor) -> None:
    dst_view.copy_(src)


# LITERALINCLUDE START: COPY FROM
def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``aten::_copy_from``: copy ``src`` into ``dst`` where either side is openreg.

    The kernel gets views of both sides, never the caller's tensors: a CPU side is passed as an
    alias of its storage (``_C._cpu_alias``), which keeps the host buffer alive until the copy has
    run and carries no autograd state (``dst`` may be a tensor autograd already tracks).
    """
    if src.get_device() >= 0 and dst.get_device() >= 0:
        if src.device == dst.device:
            launch(dst.device.index, _copy_into, host_view(dst), host_view(src), tensors=(dst, src), name="copy_d2d")
            return dst
        # Peer copy, ordered both ways as CUDA orders it: it runs on the destination's stream after
        # the source's pending work, and the source's stream waits for it, so that the source's
        # memory is not reused (or written) on its own stream before the copy has read it.
        src_stream = openreg.current_stream(src.device.index)
        dst_stream = openreg.current_stream(dst.device.index)
        ready = openreg.Event()
        ready.record(src_stream)
        dst_stream.wait_event(ready)
        launch(dst.device.index, _copy_into, host_view(dst), host_view(src), tensors=(dst, src), name="copy_peer")
        done = openreg.Event()
        done.record(dst_stream)
        src_stream.wait_event(done)
        return dst
    if dst.get_device() >= 0:  # host to device
        device, tensors, args, host = dst.device.index, (dst,), (host_view(dst), _C._cpu_alias(src)), src
    else:  # device to host
        device, tensors, args, host = src.device.index, (src,), (_C._cpu_alias(dst), host_view(src)), dst
    if non_blocking and host.is_pinned():
        stream, _ = launch(device, _copy_into, *args, tensors=tensors, name="copy_async")
        # The pinned block must not be handed out again before this copy has run.
        host_allocator.record_event(host.untyped_storage().data_ptr(), stream)
    else:
        # Pageable host memory: the copy waits for itself (as cudaMemcpy from pageable memory does).
        if sync_debug.mode:
            sync_debug.check(f"copy {'to' if host is dst else 'from'} pageable host memory (aten::_copy_from)")
        run_sync(device, _copy_into, *args, tensors=tensors, name="copy")
    return dst
# LITERALINCLUDE END: COPY FROM


def copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """``aten::_copy_from_and_resize``: resize ``dst`` to ``src``'s shape, then copy."""
    dst.resize_(src.shape)
    return copy_from(src, dst)


def record_stream(t: torch.Tensor, stream: torch.Stream) -> None:
    """``Tensor.record_stream``: the caching allocator keeps ``t``'s block until ``stream``'s work is done."""
    ptr = t.untyped_storage().data_ptr()
    if ptr:
        owner(ptr).record_stream(ptr, openreg.get_stream(stream.device_index, stream.stream_id))


# LITERALINCLUDE START: LOCAL SCALAR DENSE
def local_scalar_dense(t: torch.Tensor) -> int | float | bool | complex:
    """``aten::_local_scalar_dense`` (``.item()``): waits for the current stream, reads one value."""
    if sync_debug.mode:
        sync_debug.check("aten::_local_scalar_dense (.item())")
    return run_sync(t.device.index, lambda v: v.item(), host_view(t), tensors=(t,), name="item")
# LITERALINCLUDE END: LOCAL SCALAR DENSE
