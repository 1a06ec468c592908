"""Where a meta kernel describes other outputs than the CPU kernel gives, by a rule: the meta run corrected.

PyTorch's meta kernels follow CUDA. For the operators listed in ``traits.CPU_STATISTICS`` and
``traits.CPU_LAYOUT`` the CPU kernel shapes some outputs its own way; the fallback allocates the
outputs the CPU kernel will produce, so those operators stay queued.
"""

from __future__ import annotations

from typing import Any

import torch

from .call import Call
from .traits import UNBATCHED_3D


def correct(call: Call, meta: Any) -> Any:
    """The meta run's outputs as the CPU kernel gives them."""
    traits = call.traits
    if traits.cpu_statistics:
        return cpu_statistics(call, meta)
    if traits.cpu_layout:
        return cpu_layout(call.args, meta)
    if traits.layout_of is not None:
        return input_layout(call, meta)
    if traits.cpu_result_type:
        return result_type(call, meta)
    return meta


def result_type(call: Call, meta: Any) -> Any:
    """The output in ``torch.result_type`` of the two operands, as the CPU kernel promotes them."""
    dtype = torch.result_type(call.value(0), call.value(1))
    if not isinstance(meta, torch.Tensor) or meta.dtype == dtype:
        return meta
    return torch.empty_strided(meta.shape, meta.stride(), dtype=dtype, device="meta")


# LITERALINCLUDE START: CPU STATISTICS
_REDUCED = (torch.bfloat16, torch.float16)


def cpu_statistics(call: Call, meta: tuple) -> tuple:
    """The outputs of a CPU batch or layer norm: the meta kernel describes CUDA's statistics.

    The CPU kernels keep statistics in the parameters' type: float32 only for a reduced-precision
    input with float32 weights or running statistics (a "mixed" call), else the input's dtype; and a
    batch norm that is not training returns empty statistics.
    """
    x, *params = [v for a in (*call.args, *call.kwargs.values()) for v in (a if isinstance(a, (list, tuple)) else (a,))
                  if isinstance(v, torch.Tensor)]
    mixed = x.dtype in _REDUCED and any(p.dtype == torch.float32 for p in params)
    dtype = torch.float32 if mixed else x.dtype
    training = call.named("training") if "training" in call.traits.positions else True
    stats = [torch.empty(m.shape if training else (0,), dtype=dtype, device="meta") for m in meta[1:3]]
    return (meta[0], *stats, *meta[3:])


def cpu_layout(args: tuple, meta: torch.Tensor) -> torch.Tensor:
    """A convolution's output in the memory format the CPU would give it: PyTorch's own choice of
    convolution backend and of its memory format, asked for CPU stand-ins of the input and weight
    (allocated, never touched; once per call shape with the accelerations on, as the meta run is memoized)."""
    input, weight, _, *rest = args
    stand_ins = [torch.empty_strided(t.shape, t.stride(), dtype=t.dtype) for t in (input, weight)]
    try:
        backend = torch._C._select_conv_backend(*stand_ins, None, *rest)
        layout = torch._C._conv_determine_backend_memory_format(*stand_ins, backend)
    except RuntimeError:  # arguments the CPU's selection refuses: the meta kernel's layout stands
        return meta
    # a fresh tensor's strides, as the CPU kernel allocates its output: ``meta.contiguous(layout)`` would keep
    # the meta strides where both formats fit (size-1 dimensions), and kernels downstream choose by strides
    return torch.empty(meta.shape, dtype=meta.dtype, device="meta", memory_format=layout)


def input_layout(call: Call, meta: Any) -> Any:
    """The first output in the memory format the CPU kernel gives it: that of its input (``traits.layout_of``),
    as ``suggest_memory_format`` says, where the meta kernel allocates a contiguous one."""
    source = call.value(call.traits.layout_of)
    first = meta[0] if isinstance(meta, tuple) else meta
    if not isinstance(first, torch.Tensor) or not isinstance(source, torch.Tensor) or source.dim() != first.dim():
        return meta
    if source.dim() == 4 and call.traits.name in UNBATCHED_3D:  # one volume: channels_last_3d of a batch of one
        if not source.unsqueeze(0).is_contiguous(memory_format=torch.channels_last_3d) or source.is_contiguous():
            return meta
        outputs = meta if isinstance(meta, tuple) else (meta,)
        laid = tuple(torch.empty((1, *m.shape), dtype=m.dtype, device="meta", memory_format=torch.channels_last_3d)
                     .squeeze(0) if isinstance(m, torch.Tensor) and m.shape == first.shape else m for m in outputs)
        return laid if isinstance(meta, tuple) else laid[0]
    # ``suggest_memory_format`` (C++ only): channels-last where the strides are, contiguous where both fit
    layout = next((f for f, n in ((torch.channels_last, 4), (torch.channels_last_3d, 5)) if source.dim() == n
                   and source.is_contiguous(memory_format=f) and not source.is_contiguous()), None)
    if layout is None:
        return meta
    fresh = torch.empty(first.shape, dtype=first.dtype, device="meta", memory_format=layout)
    return (fresh, *meta[1:]) if isinstance(meta, tuple) else fresh
# LITERALINCLUDE END: CPU STATISTICS
