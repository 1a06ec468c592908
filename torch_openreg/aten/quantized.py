"""Per-tensor affine quantization on openreg.

A quantized openreg tensor is a ``QTensorImpl`` (dispatch key ``QuantizedPrivateUse1``) over
device memory, made by the C++ factory ``_empty_affine_quantized`` (``csrc/examples.cpp``), which
also registers the metadata operators (``q_scale``, ``q_zero_point``, ``qscheme``, views). The
kernels here compute on a plain integer tensor over the same storage: a host view of a quantized
tensor would lose its quantizer, while one of its integer representation is an ordinary CPU tensor.
"""

from __future__ import annotations

import torch

from .launch import host_view, launch

_INT = {torch.qint8: torch.int8, torch.quint8: torch.uint8, torch.qint32: torch.int32}


# LITERALINCLUDE START: QUANTIZED KERNELS
def _ints(q: torch.Tensor) -> torch.Tensor:
    """A plain integer openreg tensor over a quantized tensor's bytes (same sizes, strides, offset)."""
    t = torch.empty(0, dtype=_INT[q.dtype], device=q.device)
    return t.set_(q.untyped_storage(), q.storage_offset(), q.size(), q.stride())


def quantize_per_tensor(x: torch.Tensor, scale: float, zero_point: int, dtype: torch.dtype) -> torch.Tensor:
    """``aten::quantize_per_tensor`` (PrivateUse1): a quantized openreg tensor, filled by a launch."""
    if not x.is_floating_point():
        raise RuntimeError(f"quantize_per_tensor: expected a floating point input, got {x.dtype}")
    if dtype not in _INT:
        raise RuntimeError(f"quantize_per_tensor: unsupported dtype {dtype} on openreg")
    q = torch._empty_affine_quantized(x.shape, scale=scale, zero_point=zero_point, dtype=dtype, device=x.device)
    ints = _ints(q)
    launch(x.device.index, _quantize, host_view(ints), host_view(x), scale, zero_point, dtype,
           tensors=(ints, x), name="quantize_per_tensor")
    return q


def quantize_per_tensor_tensor_qparams(x, scale, zero_point, dtype):
    """``aten::quantize_per_tensor.tensor_qparams``: scale and zero point given as (1-element) tensors."""
    return quantize_per_tensor(x, float(scale.item()), int(zero_point.item()), dtype)


def _quantize(ints, x, scale, zero_point, dtype):
    ints.copy_(torch.quantize_per_tensor(x, scale, zero_point, dtype).int_repr())


def dequantize(q: torch.Tensor) -> torch.Tensor:
    """``aten::dequantize.self`` (QuantizedPrivateUse1): back to float32 on the device."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    ints = _ints(q)
    launch(q.device.index, _dequantize, host_view(out), host_view(ints), q.q_scale(), q.q_zero_point(),
           tensors=(out, ints), name="dequantize")
    return out


def _dequantize(out, ints, scale, zero_point):
    out.copy_(torch._make_per_tensor_quantized_tensor(ints, scale, zero_point).dequantize())


def int_repr(q: torch.Tensor) -> torch.Tensor:
    """``aten::int_repr`` (QuantizedPrivateUse1): the integers, as a new plain openreg tensor."""
    return _ints(q).clone()


def clone(q: torch.Tensor, *, memory_format=None) -> torch.Tensor:
    """``aten::clone`` (QuantizedPrivateUse1): a contiguous copy with the same quantizer."""
    out = torch._empty_affine_quantized(q.shape, scale=q.q_scale(), zero_point=q.q_zero_point(), dtype=q.dtype,
                                        device=q.device)
    _ints(out).copy_(_ints(q))  # a device-to-device copy: a launch on the current stream
    return out


def to_copy(q: torch.Tensor, *, dtype=None, layout=None, device=None, pin_memory=None, non_blocking=False,
            memory_format=None) -> torch.Tensor:
    """``aten::_to_copy`` (QuantizedPrivateUse1): to the CPU (``q.cpu()``, printing) or another openreg device."""
    target = torch.device(device) if device is not None else q.device
    ints = _ints(q).to(target)
    if target.type == "cpu":
        return torch._make_per_tensor_quantized_tensor(ints, q.q_scale(), q.q_zero_point())
    out = torch._empty_affine_quantized(q.shape, scale=q.q_scale(), zero_point=q.q_zero_point(), dtype=q.dtype,
                                        device=target)
    _ints(out).copy_(ints)
    return out
# LITERALINCLUDE END: QUANTIZED KERNELS
