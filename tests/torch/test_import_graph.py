"""The import graph of ``torch_openreg`` runs down its layers, without cycles; an import inside a function only
defers a cost.

:data:`LAYERS` is the picture of docs/architecture.md: a module imports from its own layer and the layers below,
never from one above (importing ``torch_openreg.device.state`` runs ``torch_openreg/device/__init__.py`` first,
so a layer is a whole package). Inside a package no modules import each other in a circle.

A module that imports another inside a function, when the other is loaded by ``import torch_openreg``
anyway, does so only to dodge an import cycle: an import running back up the layers. Such imports go
through a module below both instead (``device/state.py`` holds what the device module's parts share).
Imports of what ``import torch_openreg`` does not load (``torch._dynamo``, the c10d backend, the
compiler's parts) stay in their functions: importing them at the top would make ``import torch`` dearer.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from import_scan import cycles, describe, imports  # tests/import_scan.py

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "torch_openreg"


def _bridge(name: str) -> bool:
    return name == "torch_openreg._C"  # the extension module, also where it is not built


# LITERALINCLUDE START: TORCH LAYERS
# torch_openreg's layers, bottom to top: a module imports from its own layer and those below it.
LAYERS = [
    # the C++ bridge and the driver errors PyTorch sees
    ["torch_openreg._C", "torch_openreg.errors"],
    # the policies the bridge's calls serve: caching allocators, the graph behind torch.accelerator.Graph,
    # the sync debug mode, the torch side of the timing model
    ["torch_openreg.memory", "torch_openreg.graph_impl", "torch_openreg.sync_debug", "torch_openreg.timing"],
    # the functions the C++ bridge calls
    ["torch_openreg._runtime"],
    # operators and what PyTorch 2.13 leaves PrivateUse1 out of
    ["torch_openreg.aten", "torch_openreg.amp", "torch_openreg.backends", "torch_openreg.compat",
     "torch_openreg.dlpack", "torch_openreg.multiprocessing"],
    # the device module, torch.openreg: the frontend over the operators, as torch.cuda is
    ["torch_openreg.device"],
    # the high-level modules
    ["torch_openreg.compiler", "torch_openreg.distributed", "torch_openreg.profiler", "torch_openreg.integrations",
     "torch_openreg.testing", "torch_openreg.predict"],
    # the package: autoload
    ["torch_openreg"],
]
# LITERALINCLUDE END: TORCH LAYERS


def layer(module: str) -> int:
    """The index in :data:`LAYERS` of the longest prefix naming ``module``'s package or module."""
    best, found = -1, None
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, found = len(name), i
    if found is None:
        raise AssertionError(f"{module} is in no layer of LAYERS: give it one")
    return found


def upward_imports(root: Path = ROOT) -> list[str]:
    return [f"{edge.file}:{edge.line}: {edge.source} imports {edge.target}, a layer above it"
            for edge in imports(root, "torch_openreg", _bridge) if layer(edge.target) > layer(edge.source)]


def test_imports_run_down_the_layers():
    offenders = upward_imports()
    assert offenders == [], "imports running up torch_openreg's layers:\n" + "\n".join(offenders)


@pytest.mark.parametrize("package", ["torch_openreg", "benchmarks"])
def test_no_import_cycle_inside_a_package(package):
    found = [describe(cycle) for cycle in cycles(list(imports(ROOT, package, _bridge)))]
    assert found == [], f"import cycles inside {package}:\n" + "\n".join(found)


def function_imports(root: Path, package: str) -> list[tuple[str, int, str]]:
    """``(file, line, module)`` of every import of ``package``'s own modules made inside a function."""
    return sorted({(edge.file, edge.line, edge.target) for edge in imports(root, package) if edge.in_function})


def test_imports_in_functions_only_defer_what_import_does_not_load(run_python):
    # What the import loads (an operator's first meta run would load more: PyTorch's Python meta kernels
    # import torch._dynamo, and with it the compiler's registration, which is lazy for import's sake).
    proc = run_python("import sys, torch, torch_openreg\nprint('\\n'.join(sorted(sys.modules)))\n")
    assert proc.returncode == 0, proc.stderr
    loaded = set(proc.stdout.split())
    assert "torch_openreg._runtime" in loaded and "torch_openreg.device.state" in loaded
    offenders = [f"{file}:{line}: {target}" for file, line, target in function_imports(ROOT, "torch_openreg")
                 if target in loaded]
    assert offenders == [], "imports in functions of modules that are loaded anyway (a cycle):\n" + "\n".join(offenders)


def test_the_scanner_resolves_imports_in_functions(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for name in ("__init__.py", "a.py", "b.py", "sub/__init__.py", "sub/c.py"):
        (pkg / name).write_text("")
    (pkg / "sub" / "c.py").write_text(
        "import os\nfrom pkg import a\n\n"
        "def f():\n    from .. import b\n    from ..a import thing\n    import pkg.sub\n    import json\n\n"
        "class K:\n    def m(self):\n        from . import c\n"
    )
    (pkg / "sub" / "__init__.py").write_text(
        "def g():\n    from . import c\n    from .c import f\n    from .. import _C\n"
    )
    (pkg / "_C.cpython-311-x86_64-linux-gnu.so").write_text("")
    assert function_imports(tmp_path, "pkg") == [
        ("pkg/sub/__init__.py", 2, "pkg.sub.c"),
        ("pkg/sub/__init__.py", 3, "pkg.sub.c"),
        ("pkg/sub/__init__.py", 4, "pkg._C"),
        ("pkg/sub/c.py", 5, "pkg.b"),
        ("pkg/sub/c.py", 6, "pkg.a"),
        ("pkg/sub/c.py", 7, "pkg.sub"),
        ("pkg/sub/c.py", 12, "pkg.sub.c"),
    ]


def test_the_cycle_check_reports_each_cycle(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from . import a\n",
        "a.py": "from . import b\n",
        "b.py": "import pkg.c\n",
        "c.py": "def f():\n    from .a import thing\n",  # a -> b -> c -> a, the last in a function
        "d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import e\n",
        "e.py": "from . import d\n",  # for annotations only: no cycle
        "sub/__init__.py": "",
        "sub/x.py": "from .y import f\n",
        "sub/y.py": "from pkg.sub import x\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    assert [describe(cycle) for cycle in cycles(list(imports(tmp_path, "pkg")))] == [
        "pkg.sub.x -> pkg.sub.y (pkg/sub/x.py:1) -> pkg.sub.x (pkg/sub/y.py:1)",
        "pkg.a -> pkg.b (pkg/a.py:1) -> pkg.c (pkg/b.py:1) -> pkg.a (pkg/c.py:2)",
    ]


def test_the_layer_check_finds_an_import_up(tmp_path, monkeypatch):
    pkg = tmp_path / "torch_openreg"
    (pkg / "device").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import device\n")
    (pkg / "device" / "__init__.py").write_text("from .. import _runtime\n")
    (pkg / "_runtime.py").write_text("from .device import state\n")
    (pkg / "device" / "state.py").write_text("")
    assert upward_imports(tmp_path) == [
        "torch_openreg/_runtime.py:1: torch_openreg._runtime imports torch_openreg.device.state, a layer above it"]
