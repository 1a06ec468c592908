"""The layering rules of the simulated device (openreg/): it never imports torch; no import cycle inside it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from import_scan import cycles, describe, imports  # tests/import_scan.py

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


SETTINGS = ROOT / "openreg" / "settings.py"
PREFIXES = ("OPENREG_", "OCCL_")


def _is_environ(node: ast.AST) -> bool:
    return ast.unparse(node) in ("os.environ", "environ")


def _setting_reads(path: Path, root: Path = ROOT) -> list[str]:
    """Every read of an OpenReg environment variable (``os.environ[...]``, ``.get``, ``os.getenv``) in a file,
    and every read of the environment by a name held in a variable (which may be one)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key, environ = node.slice, _is_environ(node.value)
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("get", "getenv"):
            key = node.args[0] if node.args else None
            environ = node.func.attr == "getenv" or _is_environ(node.func.value)
        else:
            continue
        if isinstance(key, ast.Constant):
            setting = isinstance(key.value, str) and key.value.startswith(PREFIXES)
        else:
            setting = environ and key is not None
        if setting:
            found.append(f"{path.relative_to(root)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_environment_settings_are_read_in_one_module():
    """``openreg/settings.py`` reads every setting, for the runtime and torch_openreg alike (one docs table)."""
    places = [*_python_files(RUNTIME), *_python_files(ROOT / "torch_openreg")]
    offenders = [hit for path in places if path != SETTINGS for hit in _setting_reads(path)]
    assert offenders == [], "settings read outside openreg/settings.py:\n" + "\n".join(offenders)
    names = {node.value for node in ast.walk(ast.parse(SETTINGS.read_text()))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith(PREFIXES)}
    assert {"OPENREG_DEVICE_COUNT", "OPENREG_LAUNCH_BLOCKING", "OPENREG_FALLBACK_FAST"} <= names
    table = (ROOT / "docs" / "runtime.md").read_text()
    assert [n for n in sorted(names) if f"| `{n}` |" not in table] == [], "a setting missing from the docs table"


def test_the_scanner_finds_setting_reads(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import os\na = os.environ.get('OPENREG_X', '0')\nb = os.environ['OCCL_Y']\nc = os.getenv('OPENREG_Z')\n"
        "d = os.environ.get('HOME')\ne = {'OPENREG_W': 1}\nenv = {}\nenv['OPENREG_V'] = '1'\n"
        "NAME = 'OPENREG_U'\nf = os.environ.get(NAME)\ng = os.environ[NAME]\nh = env.get(NAME)\n"
    )
    assert _setting_reads(sample, tmp_path) == [
        "sample.py:2: os.environ.get('OPENREG_X', '0')",
        "sample.py:3: os.environ['OCCL_Y']",
        "sample.py:4: os.getenv('OPENREG_Z')",
        "sample.py:10: os.environ.get(NAME)",
        "sample.py:11: os.environ[NAME]",
    ]


@pytest.mark.parametrize("package", ["openreg"])
def test_no_import_cycle_inside_a_package(package):
    """No modules of the runtime import each other in a circle (at the top or in a function): each cycle is
    named with the imports that close it (tests/import_scan.py, shared with tests/torch/test_import_graph.py)."""
    found = [describe(cycle) for cycle in cycles(list(imports(ROOT, package)))]
    assert found == [], f"import cycles inside {package}:\n" + "\n".join(found)
