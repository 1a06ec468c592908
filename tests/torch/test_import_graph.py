"""The import graph of ``torch_openreg`` stays top-down: an import inside a function only defers a cost.

A module that imports another inside a function, when the other is loaded by ``import torch_openreg``
anyway, does so only to dodge an import cycle: an import running back up the layers. Such imports go
through a module below both instead (``device/state.py`` holds what the device module's parts share).
Imports of what ``import torch_openreg`` does not load (``torch._dynamo``, the c10d backend, the
compiler's parts) stay in their functions: importing them at the top would make ``import torch`` dearer.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "torch_openreg"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, exists) -> list[str]:
    """The modules an import statement loads (for ``from m import x``: ``m.x`` when that is a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".")
        base = base[: len(base) - node.level + (1 if is_package else 0)]
        source = ".".join([*base, node.module] if node.module else base)
    else:
        source = node.module or ""
    return [f"{source}.{alias.name}" if exists(f"{source}.{alias.name}") else source for alias in node.names]


def function_imports(root: Path, package: str) -> list[tuple[str, int, str]]:
    """``(file, line, module)`` of every import of ``package``'s own modules made inside a function."""

    def exists(name: str) -> bool:
        path = root.joinpath(*name.split("."))
        return (path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()
                or any(path.parent.glob(f"{path.name}.*.so")))  # an extension module (torch_openreg._C)

    found = []
    for path in sorted((root / package).rglob("*.py")):
        module = _module_name(path, root)
        tree = ast.parse(path.read_text(), filename=str(path))
        for func in ast.walk(tree):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    for target in _targets(node, module, path.name == "__init__.py", exists):
                        if target == package or target.startswith(package + "."):
                            found.append((str(path.relative_to(root)), node.lineno, target))
    return sorted(set(found))


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
