"""Legacy typed tensor and storage classes: ``torch.openreg.FloatTensor``, ``torch.openreg.FloatStorage``, ...

PyTorch generates ``torch.cuda.FloatTensor`` & co. in C++ for the CPU and CUDA only, but the type strings of
a renamed PrivateUse1 backend already work (``t.type()`` is ``"torch.openreg.FloatTensor"``). The classes
here make the names behave as CUDA's do: calling one is the legacy constructor on the current openreg
device, ``isinstance`` checks device and dtype, and ``t.type(torch.openreg.DoubleTensor)`` converts
(PyTorch reads the class's C-level name, which is the full type string). The storage classes are
PyTorch's own ``_LegacyStorage``, which finds the device from the class's module (``torch.openreg``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._utils import classproperty
from torch.storage import _LegacyStorage, _warn_typed_storage_removal

from .state import _index, _lazy_init

# LITERALINCLUDE START: LEGACY TENSOR TYPES
_TENSOR_DTYPES = {
    "DoubleTensor": torch.float64, "FloatTensor": torch.float32, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "LongTensor": torch.int64, "IntTensor": torch.int32,
    "ShortTensor": torch.int16, "CharTensor": torch.int8, "ByteTensor": torch.uint8, "BoolTensor": torch.bool,
}


class _LegacyTensorType(type):
    """The metaclass of ``torch.openreg.FloatTensor`` & co. (``torch.tensortype`` for CUDA's)."""

    dtype: torch.dtype
    layout = torch.strided
    is_cuda = False
    is_sparse = False

    def __instancecheck__(cls, obj: Any) -> bool:
        return (isinstance(obj, torch.Tensor) and obj.device.type == "openreg" and obj.dtype == cls.dtype
                and obj.layout == torch.strided and not obj.is_quantized)

    def __call__(cls, *args: Any, device: Any = None) -> torch.Tensor:
        """The legacy constructor: sizes (uninitialized), a sequence (its values), a storage or nothing."""
        _lazy_init()
        prototype = torch.empty(0, dtype=cls.dtype, device=torch.device("openreg", _index(device)))
        return prototype.new(*args)


def _tensor_type(name: str, dtype: torch.dtype) -> type:
    # The class's C-level name (tp_name) is the full type string: Tensor.type(cls) converts by it.
    cls = _LegacyTensorType(f"torch.openreg.{name}", (), {"dtype": dtype, "__doc__": f"openreg {dtype} tensors."})
    cls.__qualname__, cls.__module__ = name, "torch.openreg"
    return cls
# LITERALINCLUDE END: LEGACY TENSOR TYPES


TENSOR_TYPES = {name: _tensor_type(name, dtype) for name, dtype in _TENSOR_DTYPES.items()}

_STORAGE_DTYPES = {
    "ByteStorage": torch.uint8, "DoubleStorage": torch.float64, "FloatStorage": torch.float32,
    "HalfStorage": torch.float16, "LongStorage": torch.int64, "IntStorage": torch.int32,
    "ShortStorage": torch.int16, "CharStorage": torch.int8, "BoolStorage": torch.bool,
    "BFloat16Storage": torch.bfloat16, "ComplexDoubleStorage": torch.complex128,
    "ComplexFloatStorage": torch.complex64,
}


class _OpenRegLegacyStorage(_LegacyStorage):
    """Typed storages on openreg (deprecated in PyTorch, as CUDA's are); shared-memory forms are CPU-only."""

    @classmethod
    def from_buffer(cls, *args: Any, **kwargs: Any) -> Any:
        _warn_typed_storage_removal()
        raise RuntimeError("from_buffer: Not available for openreg storage")

    @classmethod
    def _new_with_weak_ptr(cls, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("_new_with_weak_ptr: Not available for openreg storage")

    @classmethod
    def _new_shared_filename(cls, manager: Any, obj: Any, size: int, *, device: Any = None, dtype: Any = None) -> Any:
        raise RuntimeError("_new_shared_filename: Not available for openreg storage")


def _storage_type(name: str, dtype: torch.dtype) -> type:
    def _dtype(cls: type) -> torch.dtype:
        return dtype

    def public_dtype(cls: type) -> torch.dtype:
        _warn_typed_storage_removal()
        return dtype

    namespace = {"_dtype": classproperty(_dtype), "dtype": classproperty(public_dtype), "__module__": "torch.openreg"}
    return type(name, (_OpenRegLegacyStorage,), namespace)


STORAGE_TYPES = {name: _storage_type(name, dtype) for name, dtype in _STORAGE_DTYPES.items()}
