"""Copies between cpu and openreg and between openreg devices, and ``.item()``.

PyTorch routes every ``copy_`` that involves a PrivateUse1 tensor to
``aten::_copy_from``. Copies are kernels on the current stream; a copy to or
from pageable host memory waits for itself (as ``cudaMemcpy`` does), while a
``non_blocking`` copy with a pinned host side returns at once.
"""

from __future__ import annotations

import ctypes
import threading

import torch

import openreg
from openreg.copy import load_into
from torch_openreg import _C, sync_debug
from torch_openreg.memory import host_allocator, owner
from torch_openreg.timing import costs as timing_costs

from .launch import host_view, launch, run_sync


def _copy_into(dst_view: torch.Tensor, src: torch.Tensor) -> None:
    dst_view.copy_(src)


def _check_shapes(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Refuse, at the call, a ``src`` that does not broadcast to ``dst``'s shape, with the CPU's message.

    A copy queued on a stream would otherwise fail in its kernel and report at the next synchronization,
    where CUDA (and the CPU) check shapes on the host before anything runs. The check is ``copy_``'s own,
    over meta tensors (a few microseconds, paid only when the shapes differ). The overlap checks come first, as
    the TensorIterator of copy_ makes them (compute_mem_overlaps before compute_shape): a copy that fails both
    raises the overlap error, as on the CPU.
    """
    if dst.layout == torch.strided:
        if torch._debug_has_internal_overlap(dst) == 1:  # at::has_internal_overlap says MemOverlap::Yes
            raise RuntimeError(_OVERLAP_ERRORS[0])
        if src.device == dst.device and src.untyped_storage().data_ptr() == dst.untyped_storage().data_ptr():
            _check_partial_overlap(src, dst)
    # TensorBase.size, not ``.shape``: a Tensor subclass may refuse ``.shape`` (nn's UninitializedParameter, which
    # ``LazyConv1d().to("openreg").to(torch.float64)`` copies), as the CPU's C++ copy never asks it
    src_shape, dst_shape = torch._C.TensorBase.size(src), torch._C.TensorBase.size(dst)
    if not src.is_nested and src_shape != dst_shape:
        torch.empty(dst_shape, device="meta").copy_(torch.empty(src_shape, device="meta"))


# CPU's and CUDA's copy_ builds a TensorIterator, which refuses a written-to tensor with internal overlap and
# a source that partly overlaps it (at::assert_no_internal_overlap, at::assert_no_partial_overlap).
_OVERLAP_ERRORS = (
    "unsupported operation: more than one element of the written-to tensor refers to a single memory location. "
    "Please clone() the tensor before performing the operation.",
    "unsupported operation: some elements of the input tensor and the written-to tensor refer to a single memory "
    "location. Please clone() the tensor before performing the operation.",
)


def _dense(t: torch.Tensor) -> bool:
    """``is_non_overlapping_and_dense``: the elements fill one span without gaps, in some order of the dims."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((s, n) for n, s in zip(t.shape, t.stride()) if n != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def _check_partial_overlap(src: torch.Tensor, dst: torch.Tensor) -> None:
    """at::get_overlap_status of two tensors of one storage: Partial raises; Full (the same span with the same
    strides) and TooHard (a tensor with gaps) pass, as they do on the CPU."""
    if not src.numel() or not dst.numel() or not (_dense(src) and _dense(dst)):
        return
    a, b = dst.data_ptr(), src.data_ptr()
    a_end, b_end = a + dst.numel() * dst.element_size(), b + src.numel() * src.element_size()
    if (a, a_end) == (b, b_end) and src.stride() == dst.stride():
        return
    if a < b_end and b < a_end:
        raise RuntimeError(_OVERLAP_ERRORS[1])


# The dtypes of PyTorch's wrapped numbers (a Python number passed where a Tensor goes): what copy_ converts from.
_WRAPPED_NUMBERS = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


# LITERALINCLUDE START: COPY FROM
def copy_from(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``aten::_copy_from``: copy ``src`` into ``dst`` where either side is openreg.

    The kernel gets views of both sides, never the caller's tensors: a CPU side is passed as an
    alias of its storage (``_C._cpu_alias``), which keeps the host buffer alive until the copy has
    run and carries no autograd state (``dst`` may be a tensor autograd already tracks).
    """
    if not isinstance(src, torch.Tensor):  # ``t.copy_(float("inf"))``: a wrapped number reaches Python as a number
        src = torch.tensor(src, dtype=_WRAPPED_NUMBERS[type(src)])
    to_device = dst.get_device() >= 0
    if to_device and src.get_device() >= 0 and _same_data(src, dst):
        return dst  # no kernel (nothing for the timing model to price): what copy_ does on the CPU and CUDA
    if openreg.timing.pricing:  # the timing model prices the copy's launch (torch_openreg/timing)
        timing_costs.price_copy(src, dst, non_blocking)
    if to_device and src.get_device() >= 0:
        _check_shapes(src, dst)
        if src.device == dst.device:
            launch(dst.device.index, _copy_into, host_view(dst), host_view(src), tensors=(dst, src), writes=(dst,),
                   name="copy_d2d")
            return dst
        # Peer copy, ordered both ways as CUDA orders it: it runs on the destination's stream after
        # the source's pending work, and the source's stream waits for it, so that the source's
        # memory is not reused (or written) on its own stream before the copy has read it.
        src_stream = openreg.current_stream(src.device.index)
        dst_stream = openreg.current_stream(dst.device.index)
        ready = openreg.Event()
        ready.record(src_stream)
        dst_stream.wait_event(ready)
        launch(dst.device.index, _copy_into, host_view(dst), host_view(src), tensors=(dst, src), writes=(dst,),
               name="copy_peer")
        done = openreg.Event()
        done.record(dst_stream)
        src_stream.wait_event(done)
        return dst
    host = src if to_device else dst
    if non_blocking and host.is_pinned():
        _check_shapes(src, dst)
        device, tensors, args = _kernel_copy(src, dst, to_device)
        writes = tensors if to_device else ()  # the device side: written from the host, or read to it
        stream, _ = launch(device, _copy_into, *args, tensors=tensors, writes=writes, name="copy_async")
        # The pinned block must not be handed out again before this copy has run.
        host_allocator.record_event(host.untyped_storage().data_ptr(), stream)
    else:
        # A blocking copy, or pageable host memory: the copy waits for itself (as cudaMemcpy does). The sync
        # debug mode reports the blocking ones: CUDA's non_blocking copies are cudaMemcpyAsync, never checked.
        if sync_debug.mode and not non_blocking:
            sync_debug.check(f"a blocking copy {'from' if to_device else 'to'} the host (aten::_copy_from)")
        if not (_engine_htod(src, dst, blocking=not non_blocking) if to_device else _engine_dtoh(src, dst)):
            device, tensors, args = _kernel_copy(src, dst, to_device)
            # To the host the copy is a host read; from the host, with non_blocking, CUDA returns before the
            # copy has run (the data is staged): no host synchronization for the stream sanitizer.
            run_sync(device, _copy_into, *args, tensors=tensors, name="copy", writes=tensors if to_device else (),
                     host_sync=not to_device or not non_blocking)
    return dst


def _same_data(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether ``dst`` and ``src`` are views of the same elements (``x[i].copy_(x[i])``, the write-back of
    ``x[i] += 1``): at::native::copy_ returns at once for such a pair on the devices it handles itself
    (its ``is_same_data``), but hands PrivateUse1's copies to ``_copy_from`` before that check. (TensorBase's
    methods, as in :func:`_check_shapes`: a Tensor subclass may refuse the Tensor ones.)"""
    base = torch._C.TensorBase
    return (src.layout == torch.strided and dst.layout == torch.strided and not src.is_nested
            and base.data_ptr(src) == base.data_ptr(dst) and src.dtype == dst.dtype
            and base.size(src) == base.size(dst) and base.stride(src) == base.stride(dst)
            and src.is_conj() == dst.is_conj() and src.is_neg() == dst.is_neg() and src.device == dst.device)


def _kernel_copy(src: torch.Tensor, dst: torch.Tensor, to_device: bool) -> tuple[int, tuple, tuple]:
    """The device, the openreg tensor and the two views of a copy run as a kernel."""
    if to_device:
        return dst.device.index, (dst,), (host_view(dst), _C._cpu_alias(src))
    return src.device.index, (src,), (_C._cpu_alias(dst), host_view(src))
# LITERALINCLUDE END: COPY FROM


# LITERALINCLUDE START: ENGINE COPIES
_LOAD = openreg.settings.FALLBACK_FAST  # a ready tensor's read as a load is an acceleration: off, the engine reads
ENGINE_MAX = 1 << 20  # larger copies open the pages and copy on the host: ``mprotect`` is cheap next to them


def _extent(t: torch.Tensor) -> int | None:
    """Bytes from ``t``'s first element to its last, for the copy engine; None when it does not apply
    (a layout other than strided, quantized, negative strides, too large)."""
    if openreg.timing.active or t.layout != torch.strided or t.is_quantized:
        return None  # (the timing model prices copies as launches: under simulate() they take that path)
    if t.is_contiguous():  # (most copies: the span is the elements' bytes)
        span = t.numel() * t.element_size()
    elif any(s < 0 for s in t.stride()):
        return None
    else:
        span = (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))) * t.element_size() if t.numel() else 0
    return span if span <= ENGINE_MAX else None


def _read(src: torch.Tensor, name: str = "copy") -> torch.Tensor | None:
    """A host tensor with ``src``'s values read by the copy engine after the stream's earlier work (lazy
    conjugate/negative bits kept); None when the engine does not apply."""
    nbytes = _extent(src)
    if nbytes is None or src.numel() == 0:
        return None
    data = openreg.memcpy_dtoh(src.data_ptr(), nbytes, openreg.current_stream(src.device.index), name, about=src)
    if data is None:
        return None
    host = torch.frombuffer(data, dtype=src.dtype).as_strided(src.shape, src.stride())
    if src.is_conj():
        host = host.conj()
    return torch._neg_view(host) if src.is_neg() else host


def _same_bytes(src: torch.Tensor, dst: torch.Tensor) -> int:
    """The byte count when ``dst`` takes ``src``'s bytes as they are and the copy engine applies: one
    contiguous block each, of the same dtype and shape, without lazy conjugate or negative bits, neither
    quantized, at most ``ENGINE_MAX`` bytes (``.cpu()`` of a contiguous tensor, ``.item()``); else 0.
    Every synchronous read asks this first: the checks are ordered to fail early and cost few calls (dtypes
    and layouts are singletons; only a complex tensor can carry the conjugate bit, and one dtype is quantized
    for both sides or neither)."""
    dtype = src.dtype
    if (dtype is not dst.dtype or _timing.active or dtype in _QUANTIZED or src.layout is not _STRIDED
            or not src.is_contiguous() or not dst.is_contiguous() or src.shape != dst.shape
            or src.is_neg() or dst.is_neg() or (dtype.is_complex and (src.is_conj() or dst.is_conj()))):
        return 0
    nbytes = src.numel() * src.element_size()
    return nbytes if nbytes <= ENGINE_MAX else 0


_timing = openreg.timing
_STRIDED = torch.strided
_QUANTIZED = frozenset({torch.quint8, torch.qint8, torch.qint32, torch.quint4x2, torch.quint2x4})


def _engine_dtoh(src: torch.Tensor, dst: torch.Tensor, name: str = "copy") -> bool:
    """A small device-to-host copy through the copy engine: no kernel, no page opened to the host. Where
    ``dst`` takes the bytes as they are, the engine reads straight into it, and once the stream is done and
    nothing watches transfers (:func:`openreg.wait_to_load`), the read is the caller's load, as ``.item()``'s."""
    nbytes = _same_bytes(src, dst)
    if nbytes:
        stream = openreg.current_stream(src.get_device())
        if _LOAD and openreg.wait_to_load(stream):
            load_into(dst.data_ptr(), src.data_ptr(), nbytes)
            return True
        return openreg.memcpy_dtoh_into(dst.data_ptr(), src.data_ptr(), nbytes, stream, name, about=src)
    host = _read(src, name)
    if host is None:
        return False
    _C._cpu_alias(dst).copy_(host)
    return True


def _engine_htod(src: torch.Tensor, dst: torch.Tensor, blocking: bool = True) -> bool:
    """A small host-to-device copy into a contiguous ``dst`` through the copy engine, after the stream's
    earlier work (a queued kernel may still read ``dst``); ``blocking=False`` (``non_blocking=True`` from
    pageable memory): the program does not wait for it, which the stream sanitizer is told."""
    if not dst.is_contiguous() or dst.is_conj() or dst.is_neg() or _extent(dst) is None or not dst.numel():
        return False
    staged = torch.empty(dst.shape, dtype=dst.dtype)
    staged.copy_(_C._cpu_alias(src))  # copy_'s own conversions and broadcasting, on the host
    return openreg.memcpy_htod(dst.data_ptr(), staged.view(-1).view(torch.uint8).numpy(),
                               openreg.current_stream(dst.device.index), "copy", about=dst, blocking=blocking)
# LITERALINCLUDE END: ENGINE COPIES


def copy_from_and_resize(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """``aten::_copy_from_and_resize``: resize ``dst`` to ``src``'s shape, then copy."""
    dst.resize_(src.shape)
    return copy_from(src, dst)


def record_stream(t: torch.Tensor, stream: torch.Stream) -> None:
    """``Tensor.record_stream``: the caching allocator keeps ``t``'s block until ``stream``'s work is done."""
    if stream.device.type != "openreg":  # as CUDA refuses a stream that is not CUDA's
        raise RuntimeError(f"record_stream: expected an openreg stream for a tensor on {t.device}, got a stream "
                           f"on {stream.device}")
    ptr = t.untyped_storage().data_ptr()
    if ptr:
        owner(ptr).record_stream(ptr, openreg.get_stream(stream.device_index, stream.stream_id))


class _Scalars(threading.local):
    """This thread's 0-dim host tensors that ``.item()`` reads into, one per dtype: a ``torch.empty`` costs
    more than the rest of the read (~2.8 µs here), and ``.item()`` takes the value out at once. A buffer is
    taken out while it is read into (a read nested in this one, by a kernel the synchronize runs, makes
    its own) and put back after."""

    def __init__(self) -> None:
        self.free: dict[torch.dtype, torch.Tensor] = {}


_scalars = _Scalars()


def _read_scalar(t: torch.Tensor) -> int | float | bool | complex | None:
    """``t``'s one value, read by the copy engine straight into a host scalar; None when the engine does
    not apply. (Lazy conjugate or negative bits, a quantized tensor, and a tensor of more than one element,
    whose ``.item()`` raises, take :func:`_read`.)"""
    if (openreg.timing.active or t.numel() != 1 or t.layout != torch.strided or t.is_conj() or t.is_neg()
            or t.is_quantized):
        host = _read(t, "item")  # (None under the timing model, which prices the read as a launch)
        return None if host is None else host.item()
    free = _scalars.free
    host = free.pop(t.dtype, None)
    if host is None:
        host = torch.empty((), dtype=t.dtype)  # (.item() reads one value whatever the shape)
    stream = openreg.current_stream(t.get_device())
    openreg.memcpy_dtoh_into(host.data_ptr(), t.data_ptr(), t.element_size(), stream, "item", about=t)
    value = host.item()
    free[host.dtype] = host
    return value


# LITERALINCLUDE START: LOCAL SCALAR DENSE
def local_scalar_dense(t: torch.Tensor) -> int | float | bool | complex:
    """``aten::_local_scalar_dense`` (``.item()``): waits for the current stream, reads one value (through
    the copy engine where it applies, else as a kernel run here)."""
    if sync_debug.mode:
        sync_debug.check("aten::_local_scalar_dense (.item())")
    if _timing.pricing:
        timing_costs.price_item(t)
    elif (_LOAD and t.numel() == 1 and not (t.is_neg() or t.is_conj() or t.is_quantized)
          and openreg.wait_to_load(openreg.current_stream(t.get_device()))):
        # the stream is done: the copy engine's read is this load, of a plain C type straight from the device's
        # view (the other dtypes through the bridge's host view)
        load = _LOADS.get(t.dtype)
        if load is not None:
            return load(openreg.view_address(t.data_ptr())).value
        return _C._host_view(t).item()
    value = _read_scalar(t)
    if value is not None:
        return value
    return run_sync(t.device.index, lambda v: v.item(), host_view(t), tensors=(t,), writes=(), name="item")


# The dtypes whose value ctypes reads as ``.item()`` gives it (a Python float from float32 is exact).
_LOADS = {dtype: ctype.from_address for dtype, ctype in (
    (torch.float32, ctypes.c_float), (torch.float64, ctypes.c_double), (torch.int64, ctypes.c_int64),
    (torch.int32, ctypes.c_int32), (torch.int16, ctypes.c_int16), (torch.int8, ctypes.c_int8),
    (torch.uint8, ctypes.c_uint8), (torch.bool, ctypes.c_bool))}
# LITERALINCLUDE END: LOCAL SCALAR DENSE
