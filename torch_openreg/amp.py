"""Autocast for openreg: the ``AutocastPrivateUse1`` dispatch key, filled from Python.

PyTorch 2.13 registers autocast kernels for CPU, CUDA, XPU, MPS, MTIA and MAIA in
``aten/src/ATen/autocast_mode.cpp``, but nothing at all for ``AutocastPrivateUse1``: not
even the fallthrough that lets operators without a rule pass. This module registers

- a fallthrough fallback, so that every operator without a rule runs unchanged;
- one Python kernel per operator of CUDA's policy: lower precision (matmuls, convolutions),
  float32 (pointwise functions that lose range, reductions, norms, losses), "promote to the
  widest input type" (cat, stack, addcmul, ...), and banned (binary_cross_entropy).

A rule casts the eligible arguments (floating-point openreg tensors other than float64, as in
CUDA's ``is_eligible``), then calls the operator again with ``AutocastPrivateUse1`` excluded.
Unlike CUDA's C++ kernels it keeps no cache of casted weights: each use casts again.
"""

from __future__ import annotations

from typing import Any

import torch

# LITERALINCLUDE START: AMP POLICY
# The operator lists of CUDA's policy (autocast_mode.cpp, KERNEL_CUDA), by overload name.
LOWER_PRECISION = [
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu",
    "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "scaled_dot_product_attention",
]
FP32 = [
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
    "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm",
    "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
    "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
    "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
    "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa", "upsample_trilinear3d",
    "upsample_bicubic2d", "_upsample_bicubic2d_aa",
]
# float32 through the operator's own dtype argument when the input would be cast (CUDA's
# fp32_set_opt_dtype): the result is float32 without a float32 copy of the input. (The named-tensor
# overloads CUDA also lists, e.g. softmax.Dimname, are not visible to torch.library in 2.13.)
FP32_SET_OPT_DTYPE = [
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
]
PROMOTE = [
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
    "tensordot", "scatter_add", "cat", "stack", "index_copy",
]
BANNED = {
    "binary_cross_entropy": "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to "
    "autocast.\nMany models use a sigmoid layer right before the binary cross entropy layer.\nIn this case, "
    "combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\nor "
    "torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\nsafe to autocast.",
}
# LITERALINCLUDE END: AMP POLICY

_KEY = "AutocastPrivateUse1"
_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)


# LITERALINCLUDE START: AMP CASTS
def _eligible(value: Any) -> bool:
    """CUDA's ``is_eligible``: a floating-point tensor on the autocast device, float64 excepted."""
    return (isinstance(value, torch.Tensor) and value.is_floating_point() and value.device.type == "openreg"
            and value.dtype != torch.float64)


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if _eligible(value) and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _flat(args: tuple, kwargs: dict) -> list:
    flat = []
    for v in [*args, *kwargs.values()]:
        flat.extend(v if isinstance(v, (list, tuple)) else [v])
    return flat


def _cast_kernel(op: torch._ops.OpOverload, target):
    """A kernel that casts the eligible arguments to ``target(args, kwargs)`` and calls ``op``."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = target(args, kwargs)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*_cast(args, dtype), **{k: _cast(v, dtype) for k, v in kwargs.items()})

    return kernel


def _lower(args: tuple, kwargs: dict) -> torch.dtype:
    return torch.get_autocast_dtype("openreg")


def _fp32(args: tuple, kwargs: dict) -> torch.dtype:
    return torch.float32


def _widest(args: tuple, kwargs: dict) -> torch.dtype:
    dtype = torch.get_autocast_dtype("openreg")
    for v in _flat(args, kwargs):
        if _eligible(v):
            dtype = torch.promote_types(dtype, v.dtype)
    return dtype
# LITERALINCLUDE END: AMP CASTS


def _set_opt_dtype_kernel(op: torch._ops.OpOverload):
    names = [a.name for a in op._schema.arguments]

    def kernel(*args: Any, **kwargs: Any) -> Any:
        kwargs = {**dict(zip(names, args)), **kwargs}  # every argument by name
        if kwargs.get("dtype") is None and _eligible(kwargs[names[0]]):
            kwargs["dtype"] = torch.float32
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(**kwargs)

    return kernel


def _banned_kernel(name: str, message: str):
    def kernel(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{message}\n(aten::{name} inside torch.autocast('openreg'))")

    return kernel


def _overload(name: str) -> torch._ops.OpOverload:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


# LITERALINCLUDE START: AMP REGISTER
_global = torch.library.Library("_", "IMPL")
_global.fallback(torch.library.fallthrough_kernel, _KEY)  # operators without a rule run unchanged

_aten = torch.library.Library("aten", "IMPL")
for _name in LOWER_PRECISION:
    _aten.impl(_name, _cast_kernel(_overload(_name), _lower), _KEY)
for _name in FP32:
    _aten.impl(_name, _cast_kernel(_overload(_name), _fp32), _KEY)
for _name in FP32_SET_OPT_DTYPE:
    _aten.impl(_name, _set_opt_dtype_kernel(_overload(_name)), _KEY)
for _name in PROMOTE:
    _aten.impl(_name, _cast_kernel(_overload(_name), _widest), _KEY)
for _name, _message in BANNED.items():
    _aten.impl(_name, _banned_kernel(_name, _message), _KEY)
# LITERALINCLUDE END: AMP REGISTER


# LITERALINCLUDE START: AMP CUSTOM OP
@torch.library.custom_op("openreg::linear_relu", mutates_args=())
def linear_relu(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A "fused" operator of the backend: ``relu(input @ weight.T + bias)``."""
    return torch.relu(torch.nn.functional.linear(input, weight, bias))


@linear_relu.register_fake
def _(input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return input.new_empty((*input.shape[:-1], weight.shape[0]))


# Under autocast("openreg"), floating inputs are cast to float16 and the op runs with autocast off.
torch.library.register_autocast("openreg::linear_relu", "openreg", torch.float16)
# LITERALINCLUDE END: AMP CUSTOM OP
