"""Operator registrations for the openreg device (``torch.library``, Python).

The C++ bridge registers the minimal factory and metadata operators; this
package registers the copies, ``.item()`` and the global fallback that runs any
other ATen operator's CPU kernel over device memory.
"""

import functools

import torch

import openreg
from openreg.settings import CPP_LAUNCH
from torch_openreg import _C

from . import (  # noqa: F401  (custom_ops registers on import)
    complex_half,
    copy,
    custom_ops,
    examples,
    fallback,
    integer_division,
    nested,
    quantized,
    quantized_dynamic,
    random,
    rms_norm,
    rnn,
    routes,
    sdpa,
    sparse,
    view_backward,
)

# LITERALINCLUDE START: REGISTER PYTHON KERNELS
_aten = torch.library.Library("aten", "IMPL")
if CPP_LAUNCH:  # from the bridge (csrc/copies.cpp): a copy onto the same elements returns there, the rest reach Python
    _C._register_copies(copy.copy_from, copy.local_scalar_dense)
else:
    _aten.impl("_copy_from", copy.copy_from, "PrivateUse1")
    _aten.impl("_local_scalar_dense", copy.local_scalar_dense, "PrivateUse1")
_aten.impl("_copy_from_and_resize", copy.copy_from_and_resize, "PrivateUse1")
_aten.impl("record_stream", copy.record_stream, "PrivateUse1")
_aten.impl("native_dropout", random.native_dropout, "PrivateUse1")
_aten.impl("convolution_overrideable", routes.convolution_overrideable, "PrivateUse1")
_aten.impl("convolution_backward_overrideable", routes.convolution_backward_overrideable, "PrivateUse1")

# The conjugate/negative-bit fallbacks resolve a lazily conjugated input by cloning it, and a
# clone copies through _copy_from again: endless recursion. copy_from applies the bits itself.
for _key in ("Conjugate", "Negative"):
    _aten.impl("_copy_from", torch.library.fallthrough_kernel, _key)
    _aten.impl("_copy_from_and_resize", torch.library.fallthrough_kernel, _key)

# PyTorch computes these on devices without their own kernel by a composite decomposition
# (CompositeExplicitAutograd), which rounds differently from the CPU's fused kernel: give openreg the
# CPU kernel, through the fallback, like any other operator.
for _name in ("native_layer_norm", "native_group_norm", "addr"):
    _aten.impl(_name, functools.partial(fallback.fallback, getattr(torch.ops.aten, _name).default), "PrivateUse1")

# mode's out= overload is a composite that refuses devices other than CPU, CUDA and XPU before it
# dispatches: openreg runs the CPU's out= kernel through the fallback, like any other operator.
_aten.impl("mode.values", functools.partial(fallback.fallback, torch.ops.aten.mode.values), "PrivateUse1")

# The CPU computes relu as clamp_min(x, 0); relu's out= kernel, which the fallback would pick, is a
# slower generic loop (docs/performance.md, "The CPU's own kernel choice"). Route relu the way the CPU does.
_aten.impl("relu", lambda x: fallback.fallback(torch.ops.aten.clamp_min.default, x, 0), "PrivateUse1")
_aten.impl("relu_", lambda x: fallback.fallback(torch.ops.aten.clamp_min_.default, x, 0), "PrivateUse1")

# Integer fmod/remainder by zero: CUDA's values, not the CPU's ZeroDivisionError (integer_division.py); pow with a
# ComplexHalf result, which CUDA computes and the CPU lacks (complex_half.py)
for _module in (integer_division, complex_half):
    for _name in _module.OVERLOADS:
        _packet, _overload = _name.split(".")
        _aten.impl(_name, _module.kernel_for(getattr(getattr(torch.ops.aten, _packet), _overload)), "PrivateUse1")

_global = torch.library.Library("_", "IMPL")
_global.fallback(fallback.fallback, "PrivateUse1")
# LITERALINCLUDE END: REGISTER PYTHON KERNELS

# LITERALINCLUDE START: FALLBACK SWITCH
if openreg.settings.FALLBACK_FAST:  # OPENREG_FALLBACK_FAST=0 leaves the plain mechanism (see fast/)
    from . import fast

    fast.install()
# LITERALINCLUDE END: FALLBACK SWITCH

# LITERALINCLUDE START: REGISTER EXAMPLES
_aten.impl("silu", examples.silu, "PrivateUse1")  # a hand-written Python kernel
_aten.impl("addcmul", examples.boxed(torch.ops.aten.addcmul.default), "PrivateUse1")  # per-operator fallback
# LITERALINCLUDE END: REGISTER EXAMPLES

# LITERALINCLUDE START: REGISTER QUANTIZED PYTHON
_aten.impl("quantize_per_tensor", quantized.quantize_per_tensor, "PrivateUse1")
_aten.impl("quantize_per_tensor.tensor_qparams", quantized.quantize_per_tensor_tensor_qparams, "PrivateUse1")
_aten.impl("quantize_per_channel", quantized.quantize_per_channel, "PrivateUse1")
_aten.impl("_make_per_tensor_quantized_tensor", quantized.make_per_tensor_quantized_tensor, "PrivateUse1")
_aten.impl("_make_per_channel_quantized_tensor", quantized.make_per_channel_quantized_tensor, "PrivateUse1")
_aten.impl("dequantize.self", quantized.dequantize, "QuantizedPrivateUse1")
_aten.impl("dequantize.tensors", quantized.dequantize_tensors, "QuantizedPrivateUse1")
_aten.impl("clone", quantized.clone, "QuantizedPrivateUse1")
_aten.impl("int_repr", quantized.int_repr, "QuantizedPrivateUse1")
_aten.impl("flip", quantized.flip, "QuantizedPrivateUse1")
_aten.impl("_to_copy", quantized.to_copy, "QuantizedPrivateUse1")

_quantized = torch.library.Library("quantized", "IMPL")
_quantized.impl("linear_prepack", quantized_dynamic.linear_prepack, "QuantizedPrivateUse1")
_quantized.impl("linear_prepack_fp16", quantized_dynamic.linear_prepack_fp16, "PrivateUse1")
_quantized.impl("make_quantized_cell_params_dynamic", quantized_dynamic.make_cell_params_dynamic, "PrivateUse1")
for _name, _kernel in quantized_dynamic.DYNAMIC_LINEAR.items():
    _quantized.impl(_name, _kernel, "PrivateUse1")
for _packet in ("quantized_lstm", "quantized_gru"):
    for _overload in ("input", "data"):
        _op = getattr(getattr(torch.ops.aten, _packet), _overload)
        _aten.impl(f"{_packet}.{_overload}", quantized_dynamic.recurrent(_op, f"aten::{_packet}.{_overload}"),
                   "PrivateUse1")
# LITERALINCLUDE END: REGISTER QUANTIZED PYTHON

# LITERALINCLUDE START: REGISTER SDPA AND RNN
_aten.impl("_fused_sdp_choice", sdpa.fused_sdp_choice, "PrivateUse1")
_aten.impl("_fused_sdp_choice", sdpa.fused_sdp_choice, "NestedTensorPrivateUse1")
_aten.impl("_scaled_dot_product_fused_attention_overrideable", sdpa.attention_forward, "PrivateUse1")
_aten.impl("_scaled_dot_product_fused_attention_overrideable_backward", sdpa.attention_backward, "PrivateUse1")
_aten.impl("_thnn_fused_lstm_cell", rnn.lstm_cell, "PrivateUse1")
_aten.impl("_thnn_fused_lstm_cell_backward_impl", rnn.lstm_cell_backward, "PrivateUse1")
_aten.impl("_thnn_fused_gru_cell", rnn.gru_cell, "PrivateUse1")
_aten.impl("_thnn_fused_gru_cell_backward", rnn.gru_cell_backward, "PrivateUse1")
_aten.impl("_fused_rms_norm", rms_norm.fused_rms_norm, "PrivateUse1")  # CUDA's fused RMSNorm (issue 32)
_aten.impl("_fused_rms_norm_backward", rms_norm.fused_rms_norm_backward, "PrivateUse1")
# LITERALINCLUDE END: REGISTER SDPA AND RNN

# LITERALINCLUDE START: REGISTER NESTED
_global.fallback(nested.nested_fallback, "NestedTensorPrivateUse1")
nested.register(_aten)
_aten.impl("_nested_from_padded", nested.nested_from_padded, "PrivateUse1")
_aten.impl("_nested_view_from_buffer", nested.nested_view_from_buffer, "PrivateUse1")
_aten.impl("_nested_view_from_buffer_copy", nested.nested_view_from_buffer_copy, "PrivateUse1")
sparse.register(_global, _aten)
# LITERALINCLUDE END: REGISTER NESTED

_aten.impl("select_backward", view_backward.select_backward, "PrivateUse1")
_aten.impl("slice_backward", view_backward.slice_backward, "PrivateUse1")

# Last, so that every operator with a kernel of its own above keeps it.
routes.register_structured(_aten)
routes.register_foreach(_aten)
