"""Memoized meta runs: a call shape's output metadata, inferred once. Saves a meta run per call.

A meta run costs 20 us to over 1 ms (many meta kernels are Python registrations: ``torch._meta_registrations``
puts ``torch._refs`` in front of the C++ meta kernels of ``mul``, ``add`` and most pointwise operators), and a
training loop makes the same calls with the same shapes every step. The metadata depends only on the call
shape (``arguments.call_key``), so it is kept under that key. The cached meta tensors are only ever read.

A test file makes few repeated calls: each test brings new shapes. For a pointwise operator
(``torch.Tag.pointwise``) returning fresh tensors whose openreg arguments are all contiguous and of one
shape, the outputs are contiguous tensors of that shape, and their dtypes depend on the arguments' dtypes
and the other arguments, not on the shape: that is kept too, under the call shape without its sizes, and a
new shape of such a call costs no meta run.
"""

from __future__ import annotations

from typing import Any

import torch

from openreg import bounded

from ..arguments import global_state
from ..call import Call
from ..fallback import NO_META, meta_run

# LITERALINCLUDE START: META CACHE
_SIZE = 8192
_cache: dict[tuple, Any] = {}  # (op, call shape) -> output metadata (or fallback.NO_META)
_MISSING = object()


def meta_outputs(call: Call) -> Any:
    """:func:`fallback.meta_run`, memoized by operator and call shape (a call without a key is not)."""
    if call.key is None:
        return meta_run(call)
    key = (call.op, call.key)
    meta = _cache.get(key, _MISSING)
    if meta is _MISSING:
        uniform = _uniform_key(call)
        meta = _from_uniform(uniform) if uniform is not None else None
        if meta is None:
            meta = meta_run(call)
            if uniform is not None:
                _keep_uniform(uniform, meta)
        bounded.put(_cache, key, meta, _SIZE)  # (cleared when full)
    return meta
# LITERALINCLUDE END: META CACHE


# LITERALINCLUDE START: UNIFORM CALLS
def _uniform_key(call: Call) -> tuple | None:
    """``(op, process-wide settings, sizes, the arguments without their sizes)`` for a pointwise call whose
    openreg tensors are contiguous and of one shape (CPU scalars and numbers beside them); None otherwise."""
    traits = call.traits
    if not traits.functional or not _pointwise(call.op):
        return None
    shape, parts = None, []
    for value in (*call.given[0], *call.given[1].values()):
        if isinstance(value, torch.Tensor):
            if value.get_device() < 0:
                if value.dim():
                    return None
                parts.append((-1, value.dtype))
                continue
            if shape is None:
                shape = value.shape
            if value.shape != shape or not value.is_contiguous() or value.is_conj() or value.is_neg():
                return None
            parts.append(value.dtype)
        elif isinstance(value, (list, tuple)):
            return None
        else:
            parts.append((type(value), value))
    if shape is None:
        return None
    return call.op, global_state(), shape, tuple(parts)


def _from_uniform(uniform: tuple) -> Any:
    """The outputs' metadata from another shape's call, or None when none was kept."""
    kept = _uniform.get((uniform[0], uniform[1], len(uniform[2]) > 0, uniform[3]))
    if kept is None:
        return None
    several, dtypes = kept
    outs = tuple(torch.empty(uniform[2], dtype=d, device="meta") for d in dtypes)
    return outs if several else outs[0]


def _keep_uniform(uniform: tuple, meta: Any) -> None:
    """Keep the outputs' dtypes if the meta run gave contiguous outputs of the arguments' shape."""
    outs = meta if isinstance(meta, tuple) else (meta,)
    if meta is NO_META or not all(isinstance(m, torch.Tensor) and m.shape == uniform[2] and m.is_contiguous()
                                  for m in outs):
        return
    bounded.put(_uniform, (uniform[0], uniform[1], len(uniform[2]) > 0, uniform[3]),
                (isinstance(meta, tuple), tuple(m.dtype for m in outs)), _SIZE)


def _pointwise(op: torch._ops.OpOverload) -> bool:
    known = _POINTWISE.get(op)
    if known is None:
        known = _POINTWISE[op] = torch.Tag.pointwise in op.tags
    return known


_uniform: dict[tuple, tuple] = {}  # (op, settings, has dimensions, arguments without sizes) -> (tuple?, dtypes)
_POINTWISE: dict[torch._ops.OpOverload, bool] = {}
# LITERALINCLUDE END: UNIFORM CALLS
