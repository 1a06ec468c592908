"""Run PyTorch's own device-generic test files on openreg and on the CPU, and list what fails only on openreg.

PyTorch's test files are not in the wheel: point the command at ``test/`` of a PyTorch source checkout
whose files collect against the installed torch. Each file runs twice under pytest, once with
``PYTORCH_TESTING_DEVICE_ONLY_FOR=cpu`` and once with ``PYTORCH_TESTING_DEVICE_ONLY_FOR=openreg`` and
openreg's device base (``TORCH_TEST_DEVICES``, see :mod:`torch_openreg.testing.device_base`); tests
are matched by name with the device taken out, and the wall time of each run is measured::

    python -m torch_openreg.testing.suites /path/to/pytorch/test \\
        --files test_unary_ufuncs,test_view_ops,test_shape_ops,test_indexing,test_reductions
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from torch_openreg.testing import DEVICE_BASE

FILES = ("test_unary_ufuncs", "test_view_ops", "test_shape_ops", "test_indexing", "test_reductions")
_DEVICE_IN_NAME = re.compile(r"_(cpu|openreg)(?=_|$)")
_DEVICE_IN_CLASS = re.compile(r"(CPU|PRIVATEUSE1|OPENREG)$")


@dataclass
class Run:
    """One file on one device: each test's outcome (by device-free name) and the wall time."""

    outcomes: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    exit_code: int = 0


def _outcome(case: ET.Element) -> str:
    for kind in ("failure", "error", "skipped"):
        if case.find(kind) is not None:
            return kind
    return "passed"


def run_file(path: str, device: str, select: str | None = None, timeout: float = 7200) -> Run:
    """Run one PyTorch test file under pytest on ``device`` ("cpu" or "openreg")."""
    env = dict(os.environ, PYTORCH_TESTING_DEVICE_ONLY_FOR=device, CI="")
    if device == "openreg":
        env["TORCH_TEST_DEVICES"] = DEVICE_BASE
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.xml")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", path, f"--junitxml={report}"]
        if select:
            cmd += ["-k", select]
        started = time.perf_counter()
        done = subprocess.run(cmd, env=env, cwd=os.path.dirname(path), capture_output=True, text=True,
                              timeout=timeout)
        run = Run(seconds=time.perf_counter() - started, exit_code=done.returncode)
        if not os.path.exists(report):
            raise RuntimeError(f"{path} on {device} wrote no report:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        for case in ET.parse(report).iter("testcase"):
            cls = _DEVICE_IN_CLASS.sub("", case.get("classname", ""))
            name = cls + "." + _DEVICE_IN_NAME.sub("", case.get("name", ""))
            run.outcomes[name] = _outcome(case)
    return run


def compare(cpu: Run, openreg: Run) -> dict[str, list[str]]:
    """Tests by how openreg differs from the CPU: failing only on openreg, skipped only on openreg."""
    only_openreg = sorted(t for t, o in openreg.outcomes.items()
                          if o in ("failure", "error") and cpu.outcomes.get(t) == "passed")
    skipped = sorted(t for t, o in openreg.outcomes.items() if o == "skipped" and cpu.outcomes.get(t) == "passed")
    return {"fail": only_openreg, "skip": skipped}


def _count(run: Run, outcome: str) -> int:
    return sum(o == outcome for o in run.outcomes.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_dir", help="test/ of a PyTorch source checkout")
    parser.add_argument("--files", default=",".join(FILES))
    parser.add_argument("-k", dest="select", default=None, help="pytest -k expression, for a slice")
    args = parser.parse_args(argv)
    print("| file | tests | passed (cpu / openreg) | openreg-only failures | openreg-only skips "
          "| wall time cpu / openreg (s) | ratio |")
    print("|---|---|---|---|---|---|---|")
    details, failing = [], 0
    for name in args.files.split(","):
        path = os.path.join(os.path.abspath(args.test_dir), name + ".py")
        cpu, openreg = run_file(path, "cpu", args.select), run_file(path, "openreg", args.select)
        diff = compare(cpu, openreg)
        failing += len(diff["fail"])
        print(f"| {name} | {len(openreg.outcomes)} | {_count(cpu, 'passed')} / {_count(openreg, 'passed')} "
              f"| {len(diff['fail'])} | {len(diff['skip'])} | {cpu.seconds:.0f} / {openreg.seconds:.0f} "
              f"| {openreg.seconds / max(cpu.seconds, 1e-9):.2f} |", flush=True)
        details += [f"{name}: FAIL {t}" for t in diff["fail"]] + [f"{name}: SKIP {t}" for t in diff["skip"]]
    print("\n".join(details))
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
