"""Names PyTorch v2.6.0's test files import that 2.13's ``torch.testing._internal`` no longer has.

``test_torch.py``, ``test_nn.py`` and ``test_binary_ufuncs.py`` (the copies Debian's source package carries)
import four helpers that later versions renamed or dropped. This module puts each back under its old name,
defined from what 2.13 has, so the files run unchanged. It is a pytest plugin the suites runner loads in its
own test subprocess (``-p torch_openreg.testing.pytorch_compat``), never part of ``import torch_openreg``:
a program that imports openreg sees PyTorch's testing modules as they are.
"""

from __future__ import annotations

import torch
from torch.testing._internal import common_cuda, common_methods_invocations, common_mkldnn, common_nn


# LITERALINCLUDE START: PYTORCH COMPAT
def _tf32_is_not_fp32() -> bool:
    """v2.6's ``common_cuda.tf32_is_not_fp32``: whether CUDA matmuls may use TF32. Never without CUDA."""
    if not torch.cuda.is_available() or torch.version.cuda is None:
        return False
    return common_mkldnn.tf32_is_not_fp32()


_OLD_NAMES = {
    (common_cuda, "tf32_is_not_fp32"): lambda: _tf32_is_not_fp32,
    # v2.6's decorator (bf32 precision for mkldnn on the CPU) became reduced_f32_on_and_off
    (common_mkldnn, "bf32_on_and_off"): lambda: common_mkldnn.reduced_f32_on_and_off,
    # v2.6 built the module list at import; 2.13 builds it on request
    (common_nn, "new_module_tests"): lambda: common_nn.get_new_module_tests(),
    # v2.6's binary ufuncs of op_db and python_ref_db: 2.13's binary_ufuncs already takes both
    (common_methods_invocations, "binary_ufuncs_and_refs"): lambda: tuple(common_methods_invocations.binary_ufuncs),
}


def install() -> list[str]:
    """Define each missing name; returns those it defined (a name 2.13 still has is left alone)."""
    defined = []
    for (module, name), make in _OLD_NAMES.items():
        if not hasattr(module, name):
            setattr(module, name, make())
            defined.append(f"{module.__name__}.{name}")
    return defined
# LITERALINCLUDE END: PYTORCH COMPAT


install()  # as a pytest plugin: before the test files are collected
