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
import statistics
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
    messages: dict[str, str] = field(default_factory=dict)  # first line of a failure's or skip's message
    seconds: float = 0.0  # wall time of the whole pytest run (collection included)
    test_seconds: float = 0.0  # the tests' own durations, as pytest reports them (set-up and tear-down included)
    exit_code: int = 0


def _outcome(case: ET.Element) -> tuple[str, str]:
    """``(outcome, first line of its message)`` of a junit test case."""
    for kind in ("failure", "error", "skipped"):
        found = case.find(kind)
        if found is not None:
            text = (found.get("message") or found.text or "").strip()
            return kind, text.splitlines()[0][:200] if text else ""
    return "passed", ""


# A test the file itself restricts to other devices (@onlyCPU, @onlyCUDA, @onlyOn, ...): skipped on openreg
# by the test's own decorator, not by anything openreg does. Counted apart from other openreg-only skips.
_DEVICE_RESTRICTED = re.compile(r"Only runs on|only runs on|onlyNativeDeviceTypes|not in \[")


def run_file(path: str, device: str, select: str | None = None, timeout: float = 7200) -> Run:
    """Run one PyTorch test file under pytest on ``device`` ("cpu" or "openreg")."""
    env = dict(os.environ, PYTORCH_TESTING_DEVICE_ONLY_FOR=device, CI="")
    if device == "openreg":
        env["TORCH_TEST_DEVICES"] = DEVICE_BASE
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.xml")
        # --noconftest: PyTorch's test/conftest.py uses hook arguments pytest 9 removed (it would not load);
        # what it adds (sharding, slow-test lists, XML naming) is PyTorch CI's, not the tests'.
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest", path,
               f"--junitxml={report}"]
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
            run.outcomes[name], run.messages[name] = _outcome(case)
            run.test_seconds += float(case.get("time") or 0)
    return run


def _alternate(path: str, select: str | None, repeat: int) -> tuple[Run, Run]:
    """Run the file on the CPU and on openreg ``repeat`` times each, alternating (so that both see the same
    machine), and keep the last outcomes with the median wall time of each side."""
    runs: dict[str, list[Run]] = {"cpu": [], "openreg": []}
    for _ in range(max(1, repeat)):
        for device in runs:
            runs[device].append(run_file(path, device, select))
    result = []
    for done in runs.values():
        last = done[-1]
        last.seconds = statistics.median(r.seconds for r in done)
        last.test_seconds = statistics.median(r.test_seconds for r in done)
        result.append(last)
    return result[0], result[1]


def compare(cpu: Run, openreg: Run) -> dict[str, list[str]]:
    """Tests by how openreg differs from the CPU: failing only on openreg, skipped only on openreg (the
    test's own device restriction apart: ``restricted``)."""
    only_openreg = sorted(t for t, o in openreg.outcomes.items()
                          if o in ("failure", "error") and cpu.outcomes.get(t) == "passed")
    skipped = sorted(t for t, o in openreg.outcomes.items() if o == "skipped" and cpu.outcomes.get(t) == "passed")
    restricted = [t for t in skipped if _DEVICE_RESTRICTED.search(openreg.messages.get(t, ""))]
    return {"fail": only_openreg, "skip": [t for t in skipped if t not in restricted], "restricted": restricted}


def _count(run: Run, outcome: str) -> int:
    return sum(o == outcome for o in run.outcomes.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_dir", help="test/ of a PyTorch source checkout")
    parser.add_argument("--files", default=",".join(FILES))
    parser.add_argument("-k", dest="select", default=None, help="pytest -k expression, for a slice")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each side this many times, alternating, and report the median wall times")
    args = parser.parse_args(argv)
    print("| file | tests | passed (cpu / openreg) | openreg-only failures | openreg-only skips "
          "| skipped by the test's device restriction | wall time cpu / openreg (s) | ratio "
          "| test time cpu / openreg (s) | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    details, failing = [], 0
    for name in args.files.split(","):
        path = os.path.join(os.path.abspath(args.test_dir), name + ".py")
        cpu, openreg = _alternate(path, args.select, args.repeat)
        diff = compare(cpu, openreg)
        failing += len(diff["fail"])
        print(f"| {name} | {len(openreg.outcomes)} | {_count(cpu, 'passed')} / {_count(openreg, 'passed')} "
              f"| {len(diff['fail'])} | {len(diff['skip'])} | {len(diff['restricted'])} "
              f"| {cpu.seconds:.0f} / {openreg.seconds:.0f} | {openreg.seconds / max(cpu.seconds, 1e-9):.2f} "
              f"| {cpu.test_seconds:.0f} / {openreg.test_seconds:.0f} "
              f"| {openreg.test_seconds / max(cpu.test_seconds, 1e-9):.2f} |", flush=True)
        details += [f"{name}: {kind.upper()} {t}: {openreg.messages.get(t, '')}"
                    for kind in ("fail", "skip") for t in diff[kind]]
    print("\n".join(details))
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
