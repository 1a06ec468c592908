"""The c10d backend ``occl``: collectives on openreg tensors, for ``torch.distributed``.

Importing ``torch_openreg`` registers the backend name (a dictionary entry in c10d: nothing is
loaded); the backend itself (:mod:`.backend`, the transport, the C++ ``c10d::Backend``) is built
when a process group asks for it::

    dist.init_process_group("cpu:gloo,openreg:occl")   # CPU tensors on gloo, openreg tensors on occl
    dist.init_process_group(device_id=torch.device("openreg", rank))   # occl alone, bound to a device
"""

from __future__ import annotations

NAME = "occl"


def _create(options, backend_options=None):
    """The creator c10d calls for each new process group that uses occl (extended API)."""
    from .backend import create

    return create(options, backend_options)


# LITERALINCLUDE START: OCCL REGISTER
def register() -> None:
    """Name ``occl`` in c10d as the backend of the ``openreg`` device type."""
    import torch.distributed as dist  # already imported by ``import torch``

    if not dist.is_available() or NAME.upper() in dist.Backend._plugins:
        return
    # extended_api: the creator gets c10d's DistributedBackendOptions (store, rank, size, timeout,
    # group name); devices: "openreg" maps to occl in Backend.default_device_backend_map, which is
    # what init_process_group(device_id=...) and a backend-less init_process_group() consult.
    dist.Backend.register_backend(NAME, _create, extended_api=True, devices=["openreg"])
# LITERALINCLUDE END: OCCL REGISTER
