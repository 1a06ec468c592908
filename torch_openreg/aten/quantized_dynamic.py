"""Dynamic quantization (``torch.ao.quantization.quantize_dynamic``) of models on openreg.

A dynamically quantized ``Linear`` or ``LSTM`` keeps its weights *packed*: an opaque
``LinearPackedParamsBase`` object (a C++ TorchBind class) made by ``quantized::linear_prepack``
and read by ``quantized::linear_dynamic``, ``torch.quantized_lstm`` and friends. PyTorch's only
packings are its CPU engines' (FBGEMM, oneDNN, QNNPACK, chosen by
``torch.backends.quantized.engine``), and the class's pickling re-packs a weight with them directly,
bypassing the dispatcher. So openreg's prepack kernels pack, with the CPU engine, a host copy of the
(openreg) weight: the packed weight lives in host memory, as any engine's packing would. The
activations stay on the device: each dynamic operator is one launch that runs the CPU operator
over host views of its input and output, so results are exactly the CPU engine's.
"""

from __future__ import annotations

import functools
import weakref

import torch

from torch_openreg import sync_debug

from .launch import host_view, launch, run_sync

_quantized = torch.ops.quantized
_shapes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # packed weight -> (in, out) features


# LITERALINCLUDE START: DYNAMIC QUANTIZATION
def _host(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.cpu() if t is not None else None


def linear_prepack(weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``quantized::linear_prepack`` (QuantizedPrivateUse1): the CPU engine's packing of the weight."""
    return _quantized.linear_prepack(_host(weight), _host(bias))


def linear_prepack_fp16(weight: torch.Tensor, bias: torch.Tensor | None = None):
    """``quantized::linear_prepack_fp16`` (PrivateUse1), for ``quantize_dynamic(..., dtype=torch.float16)``."""
    return _quantized.linear_prepack_fp16(_host(weight), _host(bias))


def make_cell_params_dynamic(w_ih, w_hh, bias_ih, bias_hh, reduce_range: bool = False):
    """``quantized::make_quantized_cell_params_dynamic`` (PrivateUse1: the biases are openreg tensors):
    an LSTM/GRU layer's packed weights and biases, all on the host with the packed weights."""
    return _quantized.make_quantized_cell_params_dynamic(w_ih, w_hh, _host(bias_ih), _host(bias_hh), reduce_range)


def _features(packed, unpack) -> tuple[int, int]:
    try:
        return _shapes[packed]
    except (KeyError, TypeError):
        pass
    weight = unpack(packed)[0]
    shape = (weight.size(1), weight.size(0))
    try:
        _shapes[packed] = shape
    except TypeError:
        pass
    return shape


def _dynamic_linear(name: str, op, unpack, with_range: bool):
    """The PrivateUse1 kernel of one dynamic linear operator: shape checks at the call, one launch."""

    def kernel(x: torch.Tensor, packed, reduce_range: bool = False) -> torch.Tensor:
        if x.dtype != torch.float32:
            raise RuntimeError(f"{name}: expected a float32 input, got {x.dtype}")
        in_features, out_features = _features(packed, unpack)
        if x.dim() == 0 or x.size(-1) != in_features:
            raise RuntimeError(f"{name}: input of shape {tuple(x.shape)} does not match the packed weight's "
                               f"{in_features} input features")
        out = torch.empty(*x.shape[:-1], out_features, device=x.device)
        args = (packed, reduce_range) if with_range else (packed,)
        launch(x.device.index, _run_into, host_view(out), op, host_view(x), *args, tensors=(out, x), writes=(out,),
               name=name)
        return out

    return kernel


def _run_into(out: torch.Tensor, op, *args) -> None:
    out.copy_(op(*args))


DYNAMIC_LINEAR = {
    "linear_dynamic": _dynamic_linear("quantized::linear_dynamic", _quantized.linear_dynamic,
                                      _quantized.linear_unpack, True),
    "linear_relu_dynamic": _dynamic_linear("quantized::linear_relu_dynamic", _quantized.linear_relu_dynamic,
                                           _quantized.linear_unpack, True),
    "linear_dynamic_fp16": _dynamic_linear("quantized::linear_dynamic_fp16", _quantized.linear_dynamic_fp16,
                                           _quantized.linear_unpack_fp16, False),
    "linear_relu_dynamic_fp16": _dynamic_linear("quantized::linear_relu_dynamic_fp16",
                                                _quantized.linear_relu_dynamic_fp16, _quantized.linear_unpack_fp16,
                                                False),
}


def _on_host(value):
    """An argument for the CPU operator: openreg tensors (alone or in lists) as host views."""
    if isinstance(value, torch.Tensor):
        return host_view(value) if value.device.type != "cpu" else value
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return [_on_host(v) for v in value]
    return value


def recurrent(op, name: str):
    """``aten::quantized_lstm``/``quantized_gru`` (PrivateUse1): the CPU operator over host views of the
    input and states, with the host-side packed layers; synchronous, its outputs copied to the device
    (their shapes are the CPU kernel's to decide, as on the fallback's synchronous path)."""

    def kernel(*args, **kwargs):
        tensors = [t for a in args for t in (a if isinstance(a, (list, tuple)) else [a])
                   if isinstance(t, torch.Tensor) and t.device.type != "cpu"]
        if len({t.device for t in tensors}) != 1:
            raise RuntimeError(f"{name}: input and states must be on one openreg device, got "
                               f"{sorted({str(t.device) for t in tensors})}")
        device = tensors[0].device
        with sync_debug.reported(None):  # the simulator's own wait: CUDA's kernel would not
            results = run_sync(device.index, functools.partial(op, **kwargs), *(_on_host(a) for a in args),
                               tensors=tensors, writes=(), name=name, host_sync=False)
            return tuple(r.to(device) for r in results)

    return kernel


# LITERALINCLUDE END: DYNAMIC QUANTIZATION
