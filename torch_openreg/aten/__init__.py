"""Operator registrations for the openreg device (``torch.library``, Python).

The C++ bridge registers the minimal factory and metadata operators; this
package registers the copies, ``.item()`` and the global fallback that runs any
other ATen operator's CPU kernel over device memory.
"""

import functools

import torch

from . import copy, fallback

# LITERALINCLUDE START: REGISTER PYTHON KERNELS
_aten = torch.library.Library("aten", "IMPL")
_aten.impl("_copy_from", copy.copy_from, "PrivateUse1")
_aten.impl("_copy_from_and_resize", copy.copy_from_and_resize, "PrivateUse1")
_aten.impl("_local_scalar_dense", copy.local_scalar_dense, "PrivateUse1")
_aten.impl("record_stream", copy.record_stream, "PrivateUse1")
_aten.impl("convolution_overrideable", fallback.convolution_overrideable, "PrivateUse1")
_aten.impl("convolution_backward_overrideable", fallback.convolution_backward_overrideable, "PrivateUse1")

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

_global = torch.library.Library("_", "IMPL")
_global.fallback(fallback.fallback, "PrivateUse1")
# LITERALINCLUDE END: REGISTER PYTHON KERNELS
