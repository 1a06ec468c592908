"""The outputs of an operator the fallback runs: allocated, viewed or fitted from the meta run's metadata, and
the CPU kernel's results copied into them (checked first).

``fallback.py`` decides how a call runs; this module holds what every way of running it does with the
outputs (the mechanism's kernels, the call plans and the accelerations in ``fast/`` share it).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch

from .arguments import map_tensors
from .traits import Kind


# LITERALINCLUDE START: OUTPUTS
def outputs(call: Any) -> list:
    """Allocate fresh outputs, build views, and resize in-place and out= arguments to what the meta run says."""
    metas = [call.meta] if len(call.traits.returns) == 1 else list(call.meta or ())
    device = call.device
    outs = []
    for ret, m in zip(call.traits.returns, metas):
        if ret.kind is Kind.FRESH:
            outs.append(map_tensors(m, lambda t: torch.empty_strided(t.shape, t.stride(), dtype=t.dtype,
                                                                     device=device)))
        elif ret.kind is Kind.VIEW:
            base = call.value(ret.arg)
            outs.append(map_tensors(m, lambda t, base=base: device_view(base, t, t.storage_offset(), device,
                                                                        base.is_conj(), base.is_neg())))
        else:
            real = call.value(ret.arg)
            warn = any(call.traits.positions[n] == ret.arg for n in call.traits.out_args)
            for r, mm in ((real, m),) if isinstance(real, torch.Tensor) else zip(real, m):
                fit_to(r, mm, warn)
            outs.append(real)
    return outs


def device_view(base: torch.Tensor, like: torch.Tensor, offset: int, device: torch.device, conj: bool,
                neg: bool) -> torch.Tensor:
    """A view of openreg ``base``'s storage with ``like``'s dtype, sizes and strides at ``offset``, and the lazy
    conjugate/negative bits ``conj``/``neg``: the one builder of the views an operator returns (from the meta
    run's metadata, or from a view the CPU kernel returned of a host view)."""
    view = torch.empty(0, dtype=like.dtype, device=device).set_(base.untyped_storage(), offset, like.size(),
                                                               like.stride())
    if conj and view.is_complex():  # a view of a lazily conjugated/negated tensor is one too
        view = view.conj()
    return torch._neg_view(view) if neg else view


RESIZE_WARNING = (
    "An output with one or more elements was resized since it had shape {}, which does not match the required "
    "output shape {}. This behavior is deprecated, and in a future PyTorch release outputs will not be resized "
    "unless they have zero elements. You can explicitly reuse an out tensor t by resizing it, inplace, to zero "
    "elements with t.resize_(0)."
)


def fit_to(real: torch.Tensor, m: torch.Tensor, warn: bool = False) -> bool:
    """Give an ``out=``/in-place argument the shape and strides the operator gives it (resizing storage);
    returns whether it already had them (False: it was resized). ``warn``: an ``out=`` argument resized here
    rather than by the CPU kernel, which warns as ``at::native::resize_output`` does when it had elements."""
    if real.size() != m.size() or (real.numel() > 1 and real.stride() != m.stride()):
        if warn and real.numel() and real.size() != m.size():
            warnings.warn(RESIZE_WARNING.format(list(real.size()), list(m.size())), UserWarning, stacklevel=2)
        real.set_(real.untyped_storage(), real.storage_offset(), m.size(), m.stride())
        return False
    return True


def as_return(results: list) -> Any:
    """The operator's return value from its list of results: None, the one result, or a tuple."""
    return None if not results else results[0] if len(results) == 1 else tuple(results)
# LITERALINCLUDE END: OUTPUTS


# LITERALINCLUDE START: RESULTS INTO OUTPUTS
def output_pairs(view: Any, result: Any) -> list[tuple[torch.Tensor, Any]]:
    """``(output, result)`` pairs of one return or argument (a tensor or a list of tensors); None skipped."""
    if isinstance(view, torch.Tensor):
        return [(view, result)]
    return [(v, r) for v, r in zip(view or (), result or ()) if v is not None]


def copy_into(name: str, targets: list) -> None:
    """Copy CPU results into outputs' host views, all checked first: nothing is written when one disagrees."""
    both = [p for view, result in targets for p in output_pairs(view, result)]
    for view, result in both:
        check_output(name, view, result)
    for view, result in both:
        view.copy_(result)


class CpuDisagrees(RuntimeError):
    """A CPU kernel's output differs in shape or dtype from what the meta kernel said (``nansum(x, dim=[])``
    reduces everything on the CPU, nothing on meta): raised before any output is written."""


def check_output(name: str, view: torch.Tensor, result: torch.Tensor) -> None:
    """Raise :class:`CpuDisagrees` unless ``result`` (the CPU's) fits ``view`` (the meta kernel's output). An
    undefined tensor (None) disagrees too: ``_native_multi_head_attention(need_weights=False)``'s CPU kernel
    returns no weights where its meta kernel returns an empty tensor."""
    if not isinstance(result, torch.Tensor):
        raise CpuDisagrees(f"{name}: the CPU kernel gave no tensor where the meta kernel said {tuple(view.shape)} "
                           f"and {view.dtype}")
    if result.shape != view.shape or result.dtype != view.dtype:
        raise CpuDisagrees(
            f"{name}: the CPU kernel gave an output of shape {tuple(result.shape)} and dtype {result.dtype} where "
            f"the meta kernel said {tuple(view.shape)} and {view.dtype}"
        )
# LITERALINCLUDE END: RESULTS INTO OUTPUTS
