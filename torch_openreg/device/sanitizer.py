"""``torch.openreg.sanitizer``: the runtime's stream sanitizer (``openreg.sanitizer``) for PyTorch programs.

``enable()``, ``disable()``, ``is_enabled()`` and ``sanitizing(on=True)`` (a context manager) switch it,
as ``OPENREG_STREAM_SANITIZER=1`` does for a whole process. A launch that races with another stream
raises ``torch.AcceleratorError`` with the driver code ``STREAM_RACE`` (``err.code``), its details in
``err.race``. The checking is the runtime's; this module gives its reports what only PyTorch knows:
the shape and dtype of the tensor a racing kernel touches, and which stack frames are library code.
"""

from __future__ import annotations

import functools
import os
import types
from typing import Any

import torch

import openreg
from openreg.sanitizer import Race, disable, enable, is_enabled, sanitizing

__all__ = ["Race", "disable", "enable", "is_enabled", "sanitizing"]

_MAX_OBJECTS = 2000  # a description looks at no more than this many objects of a kernel


# LITERALINCLUDE START: SANITIZER DESCRIBE
def describe(fn: Any, args: tuple, start: int, end: int) -> str | None:
    """The tensor a kernel ``fn(*args)`` holds in device bytes ``[start, end)``: the kernels of torch_openreg
    hold host views (CPU tensors over the device bytes) or openreg tensors, in slots, tuples, lists, dicts,
    partials and closures. Called by the runtime only when it reports a race."""
    found: list[torch.Tensor] = []
    view = openreg.view_address(start)  # host views are over the device's view of the same bytes
    ranges = ((start, end), (view, view + end - start))
    seen: set[int] = set()
    todo: list[Any] = [fn, args]
    while todo and len(seen) < _MAX_OBJECTS:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if any(_within(obj, lo, hi) for lo, hi in ranges):
                found.append(obj)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo.extend(obj)
        elif isinstance(obj, dict):
            todo.extend(obj.values())
        elif isinstance(obj, functools.partial):
            todo.extend((obj.func, obj.args, obj.keywords))
        elif isinstance(obj, types.FunctionType):
            todo.extend(cell.cell_contents for cell in obj.__closure__ or () if _filled(cell))
        else:
            slots = [s for cls in type(obj).__mro__ for s in getattr(cls, "__slots__", ())]
            todo.extend(getattr(obj, s, None) for s in slots)
    if not found:
        return None
    t = min(found, key=lambda t: (t.untyped_storage().data_ptr() not in (start, view), -t.numel()))  # storage's own
    dtype = str(t.dtype).removeprefix("torch.")
    text = f"a {dtype} tensor of shape {tuple(t.shape)}"
    storage = t.untyped_storage().nbytes()
    if t.storage_offset() or t.numel() * t.element_size() < storage:
        text += f" (a view into a storage of {storage} bytes)"
    return text
# LITERALINCLUDE END: SANITIZER DESCRIBE


def _within(t: torch.Tensor, start: int, end: int) -> bool:
    if t.layout != torch.strided or t.is_meta:
        return False
    try:
        base = t.untyped_storage().data_ptr()
    except RuntimeError:  # a tensor without storage (functional wrappers)
        return False
    return bool(base) and base < end and start < base + t.untyped_storage().nbytes()  # its storage overlaps


def _filled(cell: types.CellType) -> bool:
    try:
        return cell.cell_contents is not cell  # (a cell never holds itself: this reads it, or raises)
    except ValueError:  # an empty cell
        return False


# Frames in these directories are library code, left out of the stacks a report shows.
openreg.sanitizer.set_client(describe, library=(os.path.dirname(os.path.dirname(__file__)),
                                                os.path.dirname(torch.__file__)))
