"""Quantized tensors on openreg: per-tensor and per-channel affine.

A quantized openreg tensor is a ``QTensorImpl`` (dispatch key ``QuantizedPrivateUse1``) over
device memory, made by the C++ factories ``_empty_affine_quantized`` and
``_empty_per_channel_affine_quantized`` (``csrc/examples.cpp``), which also register the metadata
operators (``q_scale``, ``q_per_channel_scales``, ``qscheme``, views, ``empty_like``). A per-channel
tensor's scales and zero points are openreg tensors, as on CUDA. The kernels here compute on a plain
integer tensor over the same storage: a host view of a quantized tensor would lose its quantizer,
while one of its integer representation is an ordinary CPU tensor. Inside the kernel a CPU quantized
tensor is rebuilt from it and the CPU's own quantizer does the arithmetic, so the integers and the
dequantized values are exactly the CPU's.
"""

from __future__ import annotations

import torch

from .launch import host_view, host_views, launch

_INT = {torch.qint8: torch.int8, torch.quint8: torch.uint8, torch.qint32: torch.int32}
_QINT = {v: k for k, v in _INT.items()}
_PER_CHANNEL = (torch.per_channel_affine, torch.per_channel_affine_float_qparams)


# LITERALINCLUDE START: QUANTIZED KERNELS
def _ints(q: torch.Tensor) -> torch.Tensor:
    """A plain integer openreg tensor over a quantized tensor's bytes (same sizes, strides, offset)."""
    t = torch.empty(0, dtype=_INT[q.dtype], device=q.device)
    return t.set_(q.untyped_storage(), q.storage_offset(), q.size(), q.stride())


def _qparams(q: torch.Tensor) -> tuple:
    """A quantized tensor's quantizer as kernel arguments: ``(scale, zero_point)`` or
    ``(scales, zero_points, axis)`` (openreg tensors: pass them through :func:`_host_qparams`)."""
    if q.qscheme() in _PER_CHANNEL:
        return q.q_per_channel_scales(), q.q_per_channel_zero_points(), q.q_per_channel_axis()
    return q.q_scale(), q.q_zero_point()


def _host_qparams(qparams: tuple) -> tuple:
    return (*host_views(*qparams[:2]), qparams[2]) if len(qparams) == 3 else qparams


def _device_qparams(qparams: tuple) -> list:
    return [t for t in qparams if isinstance(t, torch.Tensor)]


def _cpu_quantized(ints: torch.Tensor, qparams: tuple) -> torch.Tensor:
    """Inside a kernel: a CPU quantized tensor with these integers and this quantizer (host arguments)."""
    if len(qparams) == 3:
        return torch._make_per_channel_quantized_tensor(ints, *qparams)
    return torch._make_per_tensor_quantized_tensor(ints, *qparams)


def _empty_quantized(shape, qparams: tuple, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if len(qparams) == 3:
        scales, zero_points, axis = qparams
        return torch._empty_per_channel_affine_quantized(shape, scales=scales, zero_points=zero_points, axis=axis,
                                                         dtype=dtype, device=device)
    return torch._empty_affine_quantized(shape, scale=qparams[0], zero_point=qparams[1], dtype=dtype, device=device)


def _check_input(name: str, x: torch.Tensor, dtype: torch.dtype) -> None:
    if not x.is_floating_point():
        raise RuntimeError(f"{name}: expected a floating point input, got {x.dtype}")
    if dtype not in _INT:
        raise RuntimeError(f"{name}: unsupported dtype {dtype} on openreg (qint8, quint8, qint32)")


def quantize_per_tensor(x: torch.Tensor, scale: float, zero_point: int, dtype: torch.dtype) -> torch.Tensor:
    """``aten::quantize_per_tensor`` (PrivateUse1): a quantized openreg tensor, filled by a launch."""
    _check_input("quantize_per_tensor", x, dtype)
    q = torch._empty_affine_quantized(x.shape, scale=scale, zero_point=zero_point, dtype=dtype, device=x.device)
    ints = _ints(q)
    launch(x.device.index, _quantize, host_view(ints), host_view(x), (scale, zero_point), dtype,
           tensors=(ints, x), writes=(ints,), name="quantize_per_tensor")
    return q


def quantize_per_tensor_tensor_qparams(x, scale, zero_point, dtype):
    """``aten::quantize_per_tensor.tensor_qparams``: scale and zero point given as (1-element) tensors."""
    return quantize_per_tensor(x, float(scale.item()), int(zero_point.item()), dtype)


def quantize_per_channel(x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor, axis: int,
                         dtype: torch.dtype) -> torch.Tensor:
    """``aten::quantize_per_channel`` (PrivateUse1). Shapes are checked at the call; the zero points'
    range is checked by the CPU quantizer in the kernel (reported at the next synchronization, as
    CUDA's kernel reports it)."""
    _check_input("quantize_per_channel", x, dtype)
    for t in (scales, zero_points):
        if t.device.type not in ("cpu", x.device.type) or (t.device.type == x.device.type and t.device != x.device):
            raise RuntimeError(f"quantize_per_channel: scales and zero_points must be on {x.device} or the CPU, "
                               f"got {t.device}")
    if not 0 <= axis < x.dim():
        raise RuntimeError(f"quantize_per_channel: channel axis {axis} out of range for a {x.dim()}-D input")
    if scales.dim() != 1 or zero_points.dim() != 1 or scales.numel() != x.size(axis) \
            or zero_points.numel() != x.size(axis):
        raise RuntimeError(f"quantize_per_channel: expected 1-D scales and zero_points of length {x.size(axis)} "
                           f"(input size along axis {axis}), got {tuple(scales.shape)} and {tuple(zero_points.shape)}")
    q = torch._empty_per_channel_affine_quantized(x.shape, scales=scales, zero_points=zero_points, axis=axis,
                                                  dtype=dtype, device=x.device)
    qparams = _qparams(q)  # on the device now, converted as the CPU's quantizer converts them
    ints = _ints(q)
    launch(x.device.index, _quantize, host_view(ints), host_view(x), _host_qparams(qparams), dtype,
           tensors=(ints, x, *_device_qparams(qparams)), writes=(ints,), name="quantize_per_channel")
    return q


def _quantize(ints, x, qparams, dtype):
    if len(qparams) == 3:
        ints.copy_(torch.quantize_per_channel(x, *qparams, dtype).int_repr())
    else:
        ints.copy_(torch.quantize_per_tensor(x, *qparams, dtype).int_repr())


def dequantize(q: torch.Tensor) -> torch.Tensor:
    """``aten::dequantize.self`` (QuantizedPrivateUse1): back to float32 on the device."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    ints, qparams = _ints(q), _qparams(q)
    launch(q.device.index, _dequantize, host_view(out), host_view(ints), _host_qparams(qparams),
           tensors=(out, ints, *_device_qparams(qparams)), writes=(out,), name="dequantize")
    return out


def dequantize_tensors(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """``aten::dequantize.tensors`` (QuantizedPrivateUse1): one launch per tensor."""
    return [dequantize(q) for q in tensors]


def _dequantize(out, ints, qparams):
    out.copy_(_cpu_quantized(ints, qparams).dequantize())


def int_repr(q: torch.Tensor) -> torch.Tensor:
    """``aten::int_repr`` (QuantizedPrivateUse1): the integers, as a new plain openreg tensor."""
    return _ints(q).clone()


def clone(q: torch.Tensor, *, memory_format=None) -> torch.Tensor:
    """``aten::clone`` (QuantizedPrivateUse1): a copy with the same quantizer, laid out as the CPU's
    quantized clone lays it out (contiguous unless asked; "preserve" means the suggested format)."""
    if memory_format == torch.preserve_format:
        memory_format = q.suggest_memory_format()
    out = torch.empty_like(q, memory_format=memory_format or torch.contiguous_format)
    _ints(out).copy_(_ints(q))  # a device-to-device copy: a launch on the current stream
    return out


def flip(q: torch.Tensor, dims) -> torch.Tensor:
    """``aten::flip`` (QuantizedPrivateUse1): the integers reversed along ``dims``, same quantizer.

    Per-tensor only, as on the CPU (whose flip refuses per-channel tensors with this message).
    """
    if q.qscheme() in _PER_CHANNEL:
        raise RuntimeError("Setting strides is possible only on uniformly quantized tensor")
    out = _empty_quantized(q.shape, _qparams(q), q.dtype, q.device)
    _ints(out).copy_(_ints(q).flip(dims))  # flip checks dims (repeated, out of range) as the CPU's does
    return out


def to_copy(q: torch.Tensor, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None) -> torch.Tensor:
    """``aten::_to_copy`` (QuantizedPrivateUse1): to the CPU (``q.cpu()``, printing) or another openreg device."""
    if dtype is not None and dtype != q.dtype:
        raise RuntimeError(f"a quantized tensor converts to {dtype} through dequantize(), not to()/type()")
    target = torch.device(device) if device is not None else q.device
    ints = _ints(q).to(target)
    qparams = _qparams(q)
    if target.type == "cpu":
        return _cpu_quantized(ints, tuple(t.cpu() if isinstance(t, torch.Tensor) else t for t in qparams))
    out = _empty_quantized(q.shape, qparams, q.dtype, target)
    _ints(out).copy_(ints)
    return out


def _qint_of(name: str, ints: torch.Tensor) -> torch.dtype:
    if ints.dtype not in _QINT:
        raise RuntimeError(f"{name}: expected int8, uint8 or int32 values, got {ints.dtype}")
    return _QINT[ints.dtype]


def make_per_tensor_quantized_tensor(ints: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """``aten::_make_per_tensor_quantized_tensor`` (PrivateUse1): integers and a quantizer, a new tensor."""
    dtype = _qint_of("_make_per_tensor_quantized_tensor", ints)
    q = torch._empty_affine_quantized(ints.shape, scale=scale, zero_point=zero_point, dtype=dtype, device=ints.device)
    _ints(q).copy_(ints)
    return q


def make_per_channel_quantized_tensor(ints: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                                      axis: int) -> torch.Tensor:
    """``aten::_make_per_channel_quantized_tensor`` (PrivateUse1)."""
    dtype = _qint_of("_make_per_channel_quantized_tensor", ints)
    q = _empty_quantized(ints.shape, (scales, zero_points, axis), dtype, ints.device)
    _ints(q).copy_(ints)
    return q
# LITERALINCLUDE END: QUANTIZED KERNELS
