"""Operators routed to the global fallback by per-operator registrations (``torch.library``).

The boxed fallback (``Library("_", "IMPL").fallback``) receives every operator without a kernel of its
own. These registrations send some operators to the same function more directly: the convolution's
overrideable entry points (PyTorch's only way in for a backend without its own convolution), the
functional forms of structured operators (skipping PyTorch's wrapper and the boxed call), and the
``_foreach_*`` operators (one launch for a whole list instead of one per tensor).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from .fallback import fallback


# LITERALINCLUDE START: OVERRIDEABLE
def convolution_overrideable(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups):
    """PyTorch sends convolutions of non-CPU/CUDA backends here; compute them as ``aten::convolution``."""
    conv = torch.ops.aten.convolution.default
    return fallback(conv, input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)


def convolution_backward_overrideable(
    grad_output, input, weight, stride, padding, dilation, transposed, output_padding, groups, output_mask
):
    """The backward of :func:`convolution_overrideable`, as ``aten::convolution_backward``."""
    bias_sizes = [weight.size(1) * groups if transposed else weight.size(0)]
    return fallback(
        torch.ops.aten.convolution_backward.default, grad_output, input, weight, bias_sizes, stride, padding,
        dilation, transposed, output_padding, groups, output_mask,
    )
# LITERALINCLUDE END: OVERRIDEABLE


def _aten_op(packet: str, overload: str) -> torch._ops.OpOverload:
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _route_directly(lib: torch.library.Library, wanted: Callable[[str, str, str], bool]) -> int:
    """Register the fallback as the PrivateUse1 kernel of every ``aten`` overload without one that
    ``wanted(name, packet, overload)`` accepts; returns the count."""
    count = 0
    for name in torch._C._dispatch_get_all_op_names():
        if not name.startswith("aten::") or torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
            continue
        packet, _, overload = name[len("aten::"):].partition(".")
        if wanted(name, packet, overload):
            lib.impl(name[len("aten::"):], functools.partial(fallback, _aten_op(packet, overload)), "PrivateUse1")
            count += 1
    return count


# LITERALINCLUDE START: DIRECT STRUCTURED
def register_structured(lib: torch.library.Library) -> int:
    """Send structured operators' functional forms straight to the fallback.

    Without a PrivateUse1 kernel, ``add.Tensor`` resolves to PyTorch's
    CompositeExplicitAutogradNonFunctional wrapper, which allocates an empty output, resizes it and
    calls ``add.out`` through the boxed fallback. Registering the fallback as the per-operator kernel
    of each such form skips the wrapper (and the boxed call, ~9 us, for a per-operator one, ~1.4 us);
    the fallback then allocates the output itself from the inferred metadata. Returns the count.
    In-place forms keep the wrapper (its out= meta run checks self-overlap at the call), and so does
    ``new_empty_strided`` (its wrapper puts the result on the ``device`` asked for).
    """
    return _route_directly(lib, lambda name, packet, overload: (
        torch._C._dispatch_has_kernel_for_dispatch_key(name, "CompositeExplicitAutogradNonFunctional")
        and not packet.endswith("_")
        and not any(a.name == "device" for a in _aten_op(packet, overload)._schema.arguments)
    ))
# LITERALINCLUDE END: DIRECT STRUCTURED


# LITERALINCLUDE START: DIRECT FOREACH
FOREACH_KEEP_LOOP = {"_foreach_copy", "_foreach_copy_"}  # their lists may mix CPU and openreg tensors


def register_foreach(lib: torch.library.Library) -> int:
    """Send ``_foreach_*`` operators straight to the fallback: one launch for the whole list.

    Without a PrivateUse1 kernel they resolve to PyTorch's CompositeExplicitAutograd loop, which
    calls the single-tensor operator once per tensor: an Adam step over 24 parameters was some 150
    launches. The fallback runs the CPU's ``_foreach_*`` kernel over host views of every tensor in
    the lists in one kernel instead. Returns the count.
    """
    return _route_directly(
        lib, lambda name, packet, overload: packet.startswith("_foreach_") and packet not in FOREACH_KEEP_LOOP
    )
# LITERALINCLUDE END: DIRECT FOREACH
