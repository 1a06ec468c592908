"""The layering rule: the simulated device (openreg/) never imports torch."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "openreg"
TESTS = Path(__file__).resolve().parent


def _torch_imports(path: Path, root: Path = ROOT) -> list[str]:
    """Every import of torch (or a torch submodule) in a Python file, as 'file:line: statement'."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if node.level == 0 else []
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Name, ast.Attribute))
            and getattr(node.func, "id", getattr(node.func, "attr", None)) in ("__import__", "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]  # __import__("torch"), importlib.import_module("torch")
        else:
            continue
        for name in names:
            if name == "torch" or name.startswith("torch."):
                found.append((node.lineno, f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}"))
    return [hit for _, hit in sorted(found)]


def _python_files(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*.py"))


def test_runtime_sources_exist():
    files = {p.name for p in _python_files(RUNTIME)}
    assert {"__init__.py", "device.py", "memory.py", "stream.py", "event.py", "copy.py", "errors.py"} <= files


@pytest.mark.parametrize("folder", [RUNTIME, TESTS], ids=["openreg", "tests/runtime"])
def test_no_torch_import(folder):
    offenders = [hit for path in _python_files(folder) for hit in _torch_imports(path)]
    assert offenders == [], "torch imported where it must not be:\n" + "\n".join(offenders)


def test_the_scanner_finds_torch_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\nimport torch\nimport torch.nn as nn\nfrom torch import Tensor\nfrom torch.utils import data\n"
        "import torchvision\nfrom . import torch\nimport importlib\nimportlib.import_module('torch')\n"
        "if True:\n    import torch._C\n"
    )
    hits = _torch_imports(sample, tmp_path)
    assert hits == [
        "sample.py:2: import torch",
        "sample.py:3: import torch.nn as nn",
        "sample.py:4: from torch import Tensor",
        "sample.py:5: from torch.utils import data",
        "sample.py:9: importlib.import_module('torch')",
        "sample.py:11: import torch._C",
    ]


def test_importing_and_using_openreg_does_not_load_torch(run_python):
    code = """
import ctypes, sys
import openreg
p = openreg.malloc(64)
s = openreg.Stream()
e = openreg.Event(enable_timing=True)
buf = ctypes.create_string_buffer(b"x" * 64)
openreg.memcpy_async(p, ctypes.addressof(buf), 64, openreg.MemcpyKind.HOST_TO_DEVICE, stream=s)
e.record(s)
s.synchronize()
openreg.free(p)
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.") or m.startswith("torch_")))
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
