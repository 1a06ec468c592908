"""Where PyTorch 2.13 leaves PrivateUse1 out, and what openreg registers so code written for CUDA works.

Each piece names the PyTorch code it covers and the condition under which it can be dropped.

1. **``nn.Module.to`` keeps Parameters.** ``Module._apply`` moves a parameter in place
   (``param.data = moved``) only when ``torch._has_compatible_shallow_copy_type(param, moved)``; otherwise
   it builds a new ``Parameter``. That operator's only kernel is ``TensorImpl::has_compatible_shallow_copy_type``
   (c10/core/TensorImpl.h), whose list of dense backends is CPU, CUDA, MPS, HIP, XPU, HPU, MTIA: a move
   between the CPU and openreg got new Parameters, so an optimizer built before ``.to()`` trained nothing
   and tied weights came apart. The header says a PrivateUse1 backend should override the operator; this
   module registers it for openreg, answering as PyTorch does with PrivateUse1 counted as a dense backend
   (pytorch/pytorch issue 196975, PR 196978; transformers issue 41708). Drop it once PyTorch's list
   contains ``PrivateUse1Bit``: ``test_module_to.py`` then passes without it.
2. **Fake tensors keep backend metadata.** ``FakeTensorConverter.from_real_tensor``
   (torch/_subclasses/fake_tensor.py) builds a fake tensor from a fresh meta tensor and drops the real
   tensor's ``c10::BackendMeta``, so ``torch.compile`` traced openreg tensors without their metadata.
   Newer PyTorch copies it (``torch._C._copy_backend_meta``, pytorch/pytorch PR 186324); on 2.13 openreg
   wraps the method, for openreg tensors only, and does nothing where PyTorch already has the copy.
"""

from __future__ import annotations

import functools

import torch

from . import _C

# LITERALINCLUDE START: SHALLOW COPY TYPE
_K = torch._C.DispatchKey
# TensorImpl::has_compatible_shallow_copy_type's dense backends, and openreg.
_DENSE_BACKENDS = (_K.CPU, _K.CUDA, _K.MPS, _K.HIP, _K.XPU, _K.HPU, _K.MTIA, _K.PrivateUse1)
_OP = torch.ops.aten._has_compatible_shallow_copy_type.default


def _is_dense(keys: torch._C.DispatchKeySet) -> bool:
    return keys.has(_K.Dense) and any(keys.has(backend) for backend in _DENSE_BACKENDS)


def has_compatible_shallow_copy_type(self: torch.Tensor, from_: torch.Tensor) -> bool:
    """PyTorch's rule with openreg counted as a dense backend: two dense tensors are compatible.

    Anything else (sparse, quantized, nested, meta) gets PyTorch's own answer, from the operator's
    CompositeImplicitAutograd kernel.
    """
    if _is_dense(torch._C._dispatch_keys(self)) and _is_dense(torch._C._dispatch_keys(from_)):
        return True
    return _OP.decompose(self, from_)


# Registered for the autograd key (where the composite kernel answers for every backend: calls
# on tensor subclasses never reach their __torch_dispatch__) and for the backend key (reached
# under inference_mode, which skips autograd keys). Either is reached only when a dense or
# autograd openreg key is the highest of the two tensors' keys.
_lib = torch.library.Library("aten", "IMPL")
for _key in ("AutogradPrivateUse1", "PrivateUse1"):
    _lib.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type, _key)
# LITERALINCLUDE END: SHALLOW COPY TYPE


# LITERALINCLUDE START: FAKE BACKEND META
def _real(t: torch.Tensor) -> torch.Tensor:
    """The tensor under a FunctionalTensor wrapper (the wrapper carries no backend metadata)."""
    if isinstance(t, torch._subclasses.functional_tensor.FunctionalTensor):
        return torch._from_functional_tensor(t.elem)
    return t


def _keep_backend_meta(from_real_tensor):
    @functools.wraps(from_real_tensor)
    def wrapper(self, fake_mode, t, *args, **kwargs):
        fake = from_real_tensor(self, fake_mode, t, *args, **kwargs)
        real = _real(t)
        if type(real) is not torch._subclasses.fake_tensor.FakeTensor and real.device.type == "openreg":
            _C._copy_backend_meta(real, fake)
        return fake

    wrapper.__openreg_wrapped__ = from_real_tensor
    return wrapper


if not hasattr(torch._C, "_copy_backend_meta"):  # newer PyTorch copies the metadata itself
    _converter = torch._subclasses.fake_tensor.FakeTensorConverter
    _converter.from_real_tensor = _keep_backend_meta(_converter.from_real_tensor)
# LITERALINCLUDE END: FAKE BACKEND META
