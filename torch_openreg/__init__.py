"""torch_openreg: the openreg simulated accelerator, plugged into PyTorch as PrivateUse1.

Importing this package (which ``import torch`` does through the
``torch.backends`` entry point) loads the C++ bridge, renames PrivateUse1 to
``openreg``, registers ``torch.openreg``, generates the ``Tensor.openreg()``-style
methods and registers the Python operator kernels.
"""

# LITERALINCLUDE START: AUTOLOAD


def _autoload() -> None:
    """Entry point of the ``torch.backends`` group: importing this package does the work.

    Defined before ``import torch`` so that ``import torch_openreg`` done first also works: that
    import runs torch's autoload, which finds this (still loading) module and calls this function.
    """


import torch  # noqa: E402

from . import _C  # noqa: E402,F401  (registers guard, hooks, allocators, minimal ops)
from . import errors as _errors  # noqa: E402

_errors.install()  # driver errors are torch.AcceleratorError too, as CUDA's are

import openreg  # noqa: E402

openreg.memory.add_view_listener(_C._set_views)  # host views of device tensors are built in C++: it translates too
if openreg.settings.CPP_LAUNCH:  # the device guard answers from its copy of each thread's current streams
    openreg.stream.set_current_listener(_C._current_stream_changed)
    _C._know_current_streams(True)

torch.utils.rename_privateuse1_backend("openreg")

from . import device as _device_module  # noqa: E402

torch._register_device_module("openreg", _device_module)
torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)

# autocast policy; operator registrations; what PyTorch 2.13 leaves PrivateUse1 out of (Module.to, fake metadata);
# torch.backends.openreg
from . import amp, aten, backends, compat  # noqa: E402,F401
from . import multiprocessing as _multiprocessing  # noqa: E402
from .memory import block_cache as _block_cache  # noqa: E402,F401  (the bridge's block cache, OPENREG_CPP_LAUNCH)

_multiprocessing.install()

from . import dlpack as _dlpack  # noqa: E402

_dlpack.install()

from . import compiler as _compiler  # noqa: E402  (torch.compile support, registered when first needed)

_compiler.install()

from . import distributed as _distributed  # noqa: E402

_distributed.register()  # the c10d backend "occl"; built when a process group uses it
# LITERALINCLUDE END: AUTOLOAD

from . import profiler as _profiler  # noqa: E402,F401  (OPENREG_LAUNCH_SITES=1 installs the launch hook)
