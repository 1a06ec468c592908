"""``torch.compile`` on openreg: a Dynamo device interface and an Inductor backend.

Nothing here is imported by ``import torch``: compiling costs seconds of imports (``torch._dynamo``
alone takes about two), and most programs never compile. :func:`install` only leaves two post-import
hooks, so that each part registers right after the PyTorch module that needs it has loaded:

* ``torch._dynamo`` (``torch.compile``, ``torch.export`` and ``torch._dynamo.explain`` import it first):
  :mod:`.dynamo` registers the device interface, the trace rules of ``torch.openreg`` and the named
  backend ``"openreg"``;
* ``torch._inductor.compile_fx`` (every Inductor compilation goes through it): :mod:`.inductor` registers
  the scheduling, the wrapper code generation, the device-op overrides and the workarounds, before
  Inductor first looks a backend up.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings
from collections.abc import Callable
from types import ModuleType

__all__ = ["install"]


# LITERALINCLUDE START: LAZY REGISTRATION
def install() -> None:
    """Hook openreg's compiler pieces into Dynamo and Inductor, to be registered when they are first needed."""
    for module, register in (("torch._dynamo", _register_dynamo), ("torch._inductor.compile_fx", _register_inductor)):
        if module in sys.modules:  # imported before the backend (autoload off): register now
            register()
        else:
            sys.meta_path.insert(0, _AfterImport(module, register))


def _register_dynamo() -> None:
    from . import dynamo

    dynamo.register()


def _register_inductor() -> None:
    from . import inductor

    inductor.register()
# LITERALINCLUDE END: LAZY REGISTRATION


class _AfterImport(importlib.abc.MetaPathFinder):
    """Run ``callback`` once ``name`` has been imported (a one-shot post-import hook).

    It finds the module's spec with the other finders and wraps its loader, so the module itself loads
    exactly as it would have; ``callback`` runs after the module's code, before the import returns.
    """

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name, self.callback = name, callback

    def find_spec(self, fullname: str, path: object, target: object = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _LoaderThenCall(spec.loader, self.callback)
        return spec


class _LoaderThenCall(importlib.abc.Loader):
    def __init__(self, loader: importlib.abc.Loader, callback: Callable[[], None]) -> None:
        self.loader, self.callback = loader, callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self.loader  # what inspect, linecache and importlib.resources read
        if module.__spec__ is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        try:
            self.callback()
        except Exception as exc:  # noqa: BLE001 - torch._dynamo must still import; say what is missing
            warnings.warn(f"openreg could not register its torch.compile support: {exc!r}", stacklevel=2)

    def __getattr__(self, name: str) -> object:  # get_source, get_resource_reader, ...
        return getattr(self.loader, name)
