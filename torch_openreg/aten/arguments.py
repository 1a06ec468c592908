"""A call's arguments as the fallback handles them: its device, its call shape, and their forms for the
meta run and for the CPU kernel (host views of device memory).

The mechanism (``fallback.py``) takes each of these steps in turn; ``traits.py`` says what the operator's
schema tells about the arguments.
"""

from __future__ import annotations

import bisect
from typing import Any

import torch

import openreg
from torch_openreg import _C

from .launch import host_view
from .traits import ABSOLUTE, CPU_INDICES_OK, NUMBER_CLASS, NUMBER_TYPE, NUMBER_VALUE, RELATIVE, OpTraits

NUMBERS = (bool, int, float, complex)


# LITERALINCLUDE START: DEVICE CHECK
def device_of(traits: OpTraits, tensors: list[torch.Tensor], kwargs: dict) -> torch.device:
    """The one openreg device of the call; mixed devices are the user's error, reported like CUDA's.

    ``get_device()`` is the cheap test (openreg is this process's only accelerator): it is -1 for
    CPU and meta tensors and the index for openreg ones.
    """
    index = -1
    for name in traits.out_args:  # an out= tensor is written by the kernel: a CPU one is never a scalar operand
        for t in tensors_of((kwargs.get(name),), {}):
            if t.get_device() < 0:
                raise RuntimeError(f"Expected all tensors to be on the same device, but the out= tensor '{name}' "
                                   f"of {traits.name} is on {t.device} while its inputs are on openreg")
    for t in tensors:
        i = t.get_device()
        if i >= 0:
            if index < 0:
                index = i
            elif i != index:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but found at least two devices, "
                    f"openreg:{index} and openreg:{i}! (in {traits.name})"
                )
        elif not (t.is_cpu and (t.dim() == 0 or traits.name in CPU_INDICES_OK)):
            raise RuntimeError(
                f"Expected all tensors to be on the same device, but found at least two devices, "
                f"{'openreg' if index < 0 else f'openreg:{index}'} and {t.device}! "
                f"(in {traits.name}; only 0-dim CPU tensors mix with openreg)"
            )
    if index >= 0:
        return _DEVICES[index]
    requested = kwargs.get("device")
    if requested is None:
        raise RuntimeError(f"{traits.name}: no openreg tensor or device in the call")
    device = torch.device(requested)
    return torch.device("openreg", torch.openreg.current_device()) if device.index is None else device


_DEVICES = [torch.device("openreg", i) for i in range(openreg.device_count())]
# LITERALINCLUDE END: DEVICE CHECK


# LITERALINCLUDE START: CALL KEY
def call_key(args: tuple, kwargs: dict, numbers: int = NUMBER_VALUE, placed: int = ABSOLUTE) -> tuple | None:
    """The call shape: everything output metadata and the CPU kernel's checks depend on: the process-wide
    settings that change an operator's result (:func:`global_state`) and the arguments' key
    (:func:`arguments_key`). Every cache of the fallback is keyed by it. None when the call cannot be keyed."""
    key = arguments_key(args, kwargs, numbers, placed)
    return None if key is None else (global_state(), key)


def global_state() -> tuple:
    """The process-wide settings an operator's outputs depend on besides its arguments: the default dtype
    (``int_tensor / 2``, ``int_tensor * 2.5`` and factories of Python floats take it), and deterministic
    mode (which makes some kernels raise or choose other algorithms). A cache keyed without them would
    serve a float64 result after ``torch.set_default_dtype(torch.float32)``. Thread-local state (grad mode,
    autocast, dispatch keys) is resolved above the fallback; values such as matmul precision flags are read
    by the CPU kernel each time it runs, so no cache holds them."""
    return (_default_dtype(), _deterministic())


_default_dtype = torch.get_default_dtype
_deterministic = torch._C._get_deterministic_algorithms


def arguments_key(args: tuple, kwargs: dict, numbers: int = NUMBER_VALUE, placed: int = ABSOLUTE) -> tuple | None:
    """The arguments' part of the call shape, one flat tuple.

    An openreg tensor is ``(device index, dtype, conj | neg << 1, place, storage bytes, *sizes, *strides)``,
    where ``place`` and the bytes follow ``placed`` (above): 0 and 0 when UNPLACED; the storage offset when
    ABSOLUTE; when RELATIVE, ``(storage number, offset - that storage's first offset)``, the storages numbered
    in order of appearance. A CPU tensor is ``(-1, dtype, *sizes, *strides)``; a number ``(type, value)``
    (2, 2.0 and True are equal but promote differently), ``type`` alone for NUMBER_TYPE, and for NUMBER_CLASS
    ``(type, *number_class(value))`` when it is an int or a float (traits.py's NUMBER KEYS); a list
    the tuple of its items' keys; a keyword argument ``(name, key)``; anything else itself. None when
    the call cannot be keyed: an argument cannot be hashed, or a CPU boolean mask (the meta run reads
    it: its count of True values is the output's length). ``csrc/call_args.cpp`` computes the same key.
    """
    storages = {} if placed == RELATIVE else None
    try:
        key = (*(_key(a, numbers, placed, storages) for a in args),
               *((k, _key(v, numbers, placed, storages)) for k, v in kwargs.items()))
        hash(key)
    except TypeError:
        return None
    return key


def _key(value: Any, numbers: int, placed: int, storages: dict | None) -> Any:
    if isinstance(value, torch.Tensor):
        index = value.get_device()
        if index >= 0:
            if not placed:
                where = (0, 0)
            elif storages is None:
                where = (value.storage_offset(), value.untyped_storage().nbytes())
            else:
                storage = value.untyped_storage()
                number, first = storages.setdefault(storage.data_ptr(), (len(storages), value.storage_offset()))
                where = ((number, value.storage_offset() - first), storage.nbytes())
            return (index, value.dtype, value.is_conj() | value.is_neg() << 1, *where, *value.shape, *value.stride())
        if value.dim() and value.dtype in (torch.bool, torch.uint8):
            raise TypeError("a CPU mask: its values shape the outputs")
        return (-1, value.dtype, *value.shape, *value.stride())
    if isinstance(value, (list, tuple)):
        return tuple(_key(v, numbers, placed, storages) for v in value)
    if isinstance(value, NUMBERS):
        if numbers == NUMBER_TYPE:
            return type(value)
        if numbers == NUMBER_CLASS and type(value) in (int, float):
            return (type(value), *number_class(value))
        return (type(value), value)
    return None if isinstance(value, torch.Generator) else value


# Every dtype's largest value (as a double), in order: bool 1, int8 127 (and -128), uint8, float8_e4m3fn,
# int16, float8_e5m2, float16, uint16, int32, uint32, int64, bfloat16, float32. A Scalar converted to a dtype
# overflows past its limit (c10::checked_convert), so two numbers between the same limits pass or fail alike.
NUMBER_LIMITS = (0.0, 1.0, 127.0, 128.0, 255.0, 448.0, 32767.0, 32768.0, 57344.0, 65504.0, 65535.0,
                 2147483647.0, 2147483648.0, 4294967295.0, 9223372036854775807.0, 3.3895313892515355e38,
                 3.4028234663852886e38)


def number_class(value: int | float) -> tuple[int, int]:
    """(sign, class) of an int or float: NaN (0, -1); an infinity (sign, -2); else the first of
    :data:`NUMBER_LIMITS` at or above its magnitude (an int beyond doubles: past the last limit).
    ``csrc/call_args.cpp`` computes the same pair."""
    try:
        x = float(value)
    except OverflowError:
        return (1 if value > 0 else -1, len(NUMBER_LIMITS))
    if x != x:
        return (0, -1)
    sign = (x > 0) - (x < 0)
    if x in (_INF, -_INF):
        return (sign, -2)
    return (sign, bisect.bisect_left(NUMBER_LIMITS, abs(x)))


_INF = float("inf")
# LITERALINCLUDE END: CALL KEY


def tensors_of(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Every tensor among the arguments, alone or in lists."""
    found = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def map_tensors(value: Any, fn) -> Any:
    """Apply ``fn`` to every tensor in an argument (tensors and lists of tensors)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
        return type(value)(fn(v) if isinstance(v, torch.Tensor) else v for v in value)
    return value


# LITERALINCLUDE START: WRAP NUMBERS
_WIDE = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


def wrap_numbers(traits: OpTraits, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Turn Python numbers passed for ``Tensor`` arguments back into 0-dim CPU tensors.

    ``t % 2`` reaches the fallback as ``remainder.Tensor_out(t, 2)``: PyTorch hands a boxed kernel
    a wrapped-number tensor as a plain number, and most operators refuse a number when called
    again. The tensor is made as PyTorch makes it, so promotion and the kernels' arithmetic are unchanged.
    """
    numbers = [i for i in traits.tensor_args if isinstance(traits.value(args, kwargs, i), NUMBERS)]
    if not numbers:
        return args, kwargs
    ref = next(iter(tensors_of(args, kwargs)), None)
    args, kwargs = list(args), dict(kwargs)
    for i in numbers:
        value = traits.value(args, kwargs, i)
        # At full width and marked as PyTorch marks a number's tensor (at::native::wrapped_scalar_tensor): type
        # promotion treats it as a number (a float16 tensor divided by 1e5 stays float16) and kernels read it in
        # their computation type (float for bfloat16: x * 0.7071), never rounded to the tensor's dtype first
        # (1e5 in float16 is infinity). Meta tensors cannot carry the mark (PyTorch's bindings turn a marked
        # tensor back into a number, on the CPU only): its meta stand-in takes the dtype the number promotes to
        # where a full-width 0-dim tensor would promote otherwise (an integer tensor times 2.5 is float32).
        wrapped = wrapped_number(value)
        if ref is not None:
            want = torch.result_type(ref, value)
            if torch.result_type(ref, torch.tensor(value, dtype=wrapped.dtype)) != want:
                wrapped._openreg_meta_dtype = want
        if i < len(args):
            args[i] = wrapped
        else:
            kwargs[traits.arguments[i].name] = wrapped
    return tuple(args), kwargs


def wrapped_number(value: bool | int | float | complex, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A Python number as the 0-dim CPU tensor PyTorch makes of it: full width (or ``dtype``), marked wrapped."""
    if dtype is None:
        dtype = next(wide for kind, wide in _WIDE.items() if isinstance(value, kind))  # bool before int
    return _C._mark_wrapped_number(torch.tensor(value, dtype=dtype))
# LITERALINCLUDE END: WRAP NUMBERS


# LITERALINCLUDE START: SWAP ARGUMENTS
def arguments_for(traits: OpTraits, args: tuple, kwargs: dict, device: torch.device, tensor_fn, target: str) -> tuple:
    """Arguments for a run on ``target`` ('meta' or 'cpu'): tensors mapped by ``tensor_fn``, a ``device``
    argument replaced, generators replaced by the openreg device generator's CPU state (random ops draw
    from the device's generator, never the CPU's default one) or, on meta, by None."""
    args = [map_tensors(a, tensor_fn) for a in args]
    kwargs = {k: map_tensors(v, tensor_fn) for k, v in kwargs.items()}
    if kwargs.get("device") is not None:
        kwargs["device"] = torch.device(target)
    for name in traits.generators:
        index = traits.positions[name]
        gen = None
        if target == "cpu":
            given = traits.value(args, kwargs, index)
            gen = _C._cpu_generator(given if given is not None else _C._default_generator(device.index))
        if index < len(args):
            args[index] = gen
        else:
            kwargs[name] = gen
    return tuple(args), kwargs


def host_view_or_self(t: torch.Tensor) -> torch.Tensor:
    """For a kernel run now: the host view of an openreg tensor; a CPU tensor as it is."""
    return host_view(t) if t.get_device() >= 0 else t


def host_view_or_snapshot(t: torch.Tensor) -> torch.Tensor:
    """For a queued kernel: CPU scalars and indices are read now, as CUDA copies them at the call (a wrapped
    number is the call's own: kept, with its mark)."""
    return host_view(t) if t.get_device() >= 0 else t if _C._is_wrapped_number(t) else t.clone()


def read_view_or_self(t: torch.Tensor) -> torch.Tensor:
    """:func:`host_view_or_self` for an operator that writes no argument (copy-on-write storages stay shared)."""
    return host_view(t, False) if t.get_device() >= 0 else t


def read_view_or_snapshot(t: torch.Tensor) -> torch.Tensor:
    """:func:`host_view_or_snapshot` for an operator that writes no argument."""
    return host_view(t, False) if t.get_device() >= 0 else t if _C._is_wrapped_number(t) else t.clone()


def to_meta(t: torch.Tensor) -> torch.Tensor:
    """A meta tensor with an openreg tensor's sizes, strides, offset and storage size."""
    if t.get_device() < 0:
        # A 0-dim CPU tensor is a scalar operand: on meta it promotes the same way, and meta kernels
        # refuse to mix it with meta outputs (mul.out(cpu_scalar, x, out=y) would fail and run now).
        if t.dim() == 0:
            return torch.empty((), dtype=getattr(t, "_openreg_meta_dtype", t.dtype), device="meta")
        return t
    numel = t.untyped_storage().nbytes() // t.element_size()
    return torch.empty(numel, dtype=t.dtype, device="meta").as_strided(t.size(), t.stride(), t.storage_offset())
# LITERALINCLUDE END: SWAP ARGUMENTS
