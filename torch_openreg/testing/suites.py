"""Run PyTorch's own device-generic test files on openreg and on the CPU, and list what fails only on openreg.

PyTorch's test files are not in the wheel: point the command at ``test/`` of a PyTorch source checkout
whose files collect against the installed torch. Each file runs twice under pytest, once with
``PYTORCH_TESTING_DEVICE_ONLY_FOR=cpu`` and once with ``PYTORCH_TESTING_DEVICE_ONLY_FOR=openreg`` and
openreg's device base (``TORCH_TEST_DEVICES``, see :mod:`torch_openreg.testing.device_base`); tests
are matched by name with the device taken out, and the wall time of each run is measured::

    python -m torch_openreg.testing.suites /path/to/pytorch/test --output docs/pytorch_suites.md

runs the whole list (``FILES``) and writes the table ``docs/testing.md`` shows. The time ratio compares the
tests that passed on both devices, each test's own duration summed (set-up and tear-down included), so that a
test that fails or is skipped on one side does not count on the other.

PyTorch's testing helpers give openreg more (or other) work than the CPU in some tests: ``--same-work`` runs the CPU
side a second time with :mod:`torch_openreg.testing.same_work`, which makes those choices for the CPU as for openreg,
and prints the time ratio against that run beside the literal one. The openreg-only failures stay those of the
plain CPU run.
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

# LITERALINCLUDE START: SUITE FILES
# PyTorch's device-generic test files openreg runs (paths under test/ without ``.py``).
FILES = (
    "test_view_ops", "test_shape_ops", "test_indexing", "test_unary_ufuncs", "test_reductions", "test_type_promotion",
    "test_tensor_creation_ops", "test_scatter_gather_ops", "test_masked", "test_foreach", "test_modules", "test_optim",
    "test_autograd", "test_sort_and_select", "test_segment_reductions", "test_dlpack", "test_complex",
    "nn/test_embedding", "nn/test_pooling", "nn/test_dropout", "nn/test_multihead_attention",
)
# Files that import helpers 2.13 renamed (pytorch_compat.py provides them): run with ``--files``; test_binary_ufuncs
# alone is 13,000 tests, hours on a 2-core machine.
LARGE_FILES = ("test_torch", "test_nn", "test_binary_ufuncs")
# LITERALINCLUDE END: SUITE FILES
SUITE_DEVICE_MEMORY = "8GiB"
_DEVICE_IN_NAME = re.compile(r"_(cpu|openreg)(?=_|$)")
_DEVICE_IN_CLASS = re.compile(r"(CPU|PRIVATEUSE1|OPENREG)$")


@dataclass
class Run:
    """One file on one device: each test's outcome (by device-free name) and the wall time."""

    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # first line of a failure's or skip's message
    durations: dict[str, float] = field(default_factory=dict)  # each test's own seconds
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


SAME_WORK_PLUGIN = "torch_openreg.testing.same_work"


def run_file(path: str, device: str, select: str | None = None, timeout: float = 7200,
             plugins: tuple[str, ...] = ()) -> Run:
    """Run one PyTorch test file under pytest on ``device`` ("cpu" or "openreg"), loading ``plugins`` too."""
    env = dict(os.environ, PYTORCH_TESTING_DEVICE_ONLY_FOR=device, CI="")
    if device == "openreg":
        env["TORCH_TEST_DEVICES"] = DEVICE_BASE
        # A few tests size their tensors for a GPU's memory without largeTensorTest (test_pooling's nhwc tests need
        # about 4 GiB): each simulated device gets 8 GiB unless the caller says otherwise. Pages are host memory
        # taken only when written, as the CPU run takes its own.
        env.setdefault("OPENREG_DEVICE_MEMORY", SUITE_DEVICE_MEMORY)
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.xml")
        # --noconftest: PyTorch's test/conftest.py uses hook arguments pytest 9 removed (it would not load);
        # what it adds (sharding, slow-test lists, XML naming) is PyTorch CI's, not the tests'.
        # -p pytorch_compat: the few helpers v2.6's files import under names 2.13 dropped (test_torch, test_nn,
        # test_binary_ufuncs), defined in this subprocess only (pytorch_compat.py).
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--noconftest",
               "-p", "torch_openreg.testing.pytorch_compat", path, f"--junitxml={report}"]
        for plugin in plugins:  # --same-work's CPU run: same_work.py
            cmd += ["-p", plugin]
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
            run.durations[name] = float(case.get("time") or 0)
            run.test_seconds += run.durations[name]
    return run


def _alternate(path: str, select: str | None, repeat: int, same_work: bool = False) -> list[Run]:
    """Run the file on the CPU and on openreg (and, with ``same_work``, on the CPU doing openreg's work)
    ``repeat`` times each, alternating (so that all see the same machine), and keep the last outcomes with the
    median wall time of each side: ``[cpu, openreg]`` or ``[cpu, openreg, same-work cpu]``."""
    sides = [("cpu", ()), ("openreg", ())] + ([("cpu", (SAME_WORK_PLUGIN,))] if same_work else [])
    runs: list[list[Run]] = [[] for _ in sides]
    for _ in range(max(1, repeat)):
        for done, (device, plugins) in zip(runs, sides):
            done.append(run_file(path, device, select, plugins=plugins))
    result = []
    for done in runs:
        last = done[-1]
        last.seconds = statistics.median(r.seconds for r in done)
        last.test_seconds = statistics.median(r.test_seconds for r in done)
        result.append(last)
    return result


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


def _family(test: str) -> str:
    """A test's family: its method name without the parametrization that follows a module or OpInfo name
    (``test_gradgrad_nn_GRU_float64`` -> ``test_gradgrad``) or a dtype (``test_gather_float32`` -> ``test_gather``)."""
    method = test.rsplit(".", 1)[-1]
    return _PARAMETRIZED.split(method, 1)[0]


_PARAMETRIZED = re.compile(r"_(?=nn_|(?:(?:float|int|uint|bfloat|complex)\d+|bool)(?:_|$))")


def extra_time(cpu: Run, openreg: Run, most: int = 5) -> list[tuple[str, float, float]]:
    """Where openreg's time beyond the CPU's goes: ``(family, cpu seconds, openreg seconds)`` of the test families
    (:func:`_family`) with the most extra time, over the tests that passed on both, largest first."""
    families: dict[str, list[float]] = {}
    for t in _passed_on_both(cpu, openreg):
        times = families.setdefault(_family(t), [0.0, 0.0])
        times[0] += cpu.durations.get(t, 0.0)
        times[1] += openreg.durations.get(t, 0.0)
    ranked = sorted(families.items(), key=lambda item: item[1][0] - item[1][1])
    return [(name, c, o) for name, (c, o) in ranked[:most] if o > c]


def _passed_on_both(cpu: Run, openreg: Run) -> list[str]:
    return [t for t, o in openreg.outcomes.items() if o == "passed" and cpu.outcomes.get(t) == "passed"]


def matched_seconds(cpu: Run, openreg: Run) -> tuple[float, float]:
    """The summed own durations, on each device, of the tests that passed on both."""
    both = _passed_on_both(cpu, openreg)
    return sum(cpu.durations.get(t, 0.0) for t in both), sum(openreg.durations.get(t, 0.0) for t in both)


HEADER = ("| file | tests | passed (cpu / openreg) | openreg-only failures | openreg-only skips "
          "| skipped by the test's device restriction | matched test time cpu / openreg (s) | ratio "
          "| wall time cpu / openreg (s) |\n|---|---|---|---|---|---|---|---|---|")
# --same-work's columns, after HEADER's: the same comparison against the CPU run that did openreg's work
SAME_WORK_HEADER = (HEADER.replace(" |\n", " | same work: matched test time cpu / openreg (s) | same-work ratio "
                                   "| same-work cpu: wall time (s), failures only there |\n")
                    + "---|---|---|")


def row(name: str, cpu: Run, openreg: Run, diff: dict[str, list[str]], same_work: Run | None = None) -> str:
    """One file's line of the table (with ``same_work``, the CPU run that did openreg's work, its columns too)."""
    matched = matched_seconds(cpu, openreg)
    line = (f"| {name} | {len(openreg.outcomes)} | {_count(cpu, 'passed')} / {_count(openreg, 'passed')} "
            f"| {len(diff['fail'])} | {len(diff['skip'])} | {len(diff['restricted'])} "
            f"| {matched[0]:.2f} / {matched[1]:.2f} | {matched[1] / max(matched[0], 1e-9):.2f} "
            f"| {cpu.seconds:.0f} / {openreg.seconds:.0f} |")
    if same_work is not None:
        same = matched_seconds(same_work, openreg)
        line += (f" {same[0]:.2f} / {same[1]:.2f} | {same[1] / max(same[0], 1e-9):.2f} "
                 f"| {same_work.seconds:.0f}, {len(same_work_failures(cpu, same_work))} |")
    return line


def same_work_failures(cpu: Run, same_work: Run) -> list[str]:
    """Tests that pass on the plain CPU run and fail on the CPU doing openreg's work (what the plugin changed)."""
    return sorted(t for t, o in same_work.outcomes.items()
                  if o in ("failure", "error") and cpu.outcomes.get(t) == "passed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("test_dir", help="test/ of a PyTorch source checkout")
    parser.add_argument("--files", default=",".join(FILES))
    parser.add_argument("-k", dest="select", default=None, help="pytest -k expression, for a slice")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each side this many times, alternating, and report the median wall times")
    parser.add_argument("--same-work", action="store_true",
                        help="also run the CPU side doing openreg's work (same_work.py) and print that time ratio")
    parser.add_argument("--output", help="write the table and the list of openreg-only failures there (Markdown)")
    args = parser.parse_args(argv)
    header = SAME_WORK_HEADER if args.same_work else HEADER
    print(header, flush=True)
    rows, details, failing, total, same_total = [], [], 0, [0.0, 0.0], [0.0, 0.0]
    for name in args.files.split(","):
        path = os.path.join(os.path.abspath(args.test_dir), name + ".py")
        cpu, openreg, *same_work = _alternate(path, args.select, args.repeat, args.same_work)
        diff = compare(cpu, openreg)  # openreg-only failures: against the plain CPU run
        failing += len(diff["fail"])
        total = [a + b for a, b in zip(total, matched_seconds(cpu, openreg))]
        rows.append(row(name, cpu, openreg, diff, *same_work))
        print(rows[-1], flush=True)
        details += [f"- {name}: {kind} `{t}`: {openreg.messages.get(t, '')}"
                    for kind in ("fail", "skip") for t in diff[kind]]
        details += [f"- {name}: extra time in `{family}`: {c:.2f} s on the CPU, {o:.2f} s on openreg"
                    for family, c, o in extra_time(cpu, openreg)]
        if same_work:
            same_total = [a + b for a, b in zip(same_total, matched_seconds(same_work[0], openreg))]
            details += [f"- {name}: fails only on the same-work CPU run `{t}`: {same_work[0].messages.get(t, '')}"
                        for t in same_work_failures(cpu, same_work[0])]
    summary = (f"All files: {failing} openreg-only failures; matched test time {total[0]:.0f} s on the CPU, "
               f"{total[1]:.0f} s on openreg ({total[1] / max(total[0], 1e-9):.2f}x).")
    if args.same_work:
        summary += (f" Same work: {same_total[0]:.0f} s on the CPU doing openreg's work, {same_total[1]:.0f} s on "
                    f"openreg ({same_total[1] / max(same_total[0], 1e-9):.2f}x).")
    print("\n".join(details), summary, sep="\n")
    if args.output:
        with open(args.output, "w") as out:
            out.write("\n".join([header, *rows, "", summary, "", *details]) + "\n")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
