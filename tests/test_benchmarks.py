"""The benchmarks' quick mode runs in CI: it checks the suite works, not how fast anything is."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_memory_benchmark_quick_mode_reports_every_measurement():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for row in ("| 4 KiB |", "| 1024 KiB |", "| H2D pinned |", "| D2H pageable |", "| D2D |"):
        assert row in out, out
    ratios = [float(line.split("|")[3]) for line in out.splitlines() if line.startswith("| H2D") or
              line.startswith("| D2H")]
    assert len(ratios) == 4 and all(r > 0 for r in ratios)


def test_suite_quick_mode_runs_every_section():
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick"], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    for section in ("## Small operators, launch only", "## Small operators, with synchronize", "## Large operators",
                    "## Copy bandwidth", "## Training steps", "## Memory during training", "## torch.compile",
                    "## Profiling overhead", "## Device graphs", "## The synchronous path",
                    "## Stream sanitizer: launches", "## Stream sanitizer: training steps"):
        assert section in proc.stdout, proc.stdout
    for row in ("| add |", "| matmul 2048 |", "| conv2d |", "| H2D pinned |", "| Transformer",
                "| 40-op elementwise chain, 1024 floats |", "| MLP training step |",
                "| openreg, torch.profiler (CPU + PrivateUse1) |", "| openreg, legacy profiler (use_device) |",
                "| 100 elementwise ops, 16 floats |", "| MLP training step, batch 1 |", "| (a + b).cpu() |",
                "| a.add(b).sum().item() |", "| a.cpu() of a ready tensor |", "| a + b, 200 launches queued |",
                "| queue (Stream.launch) and return |", "| sum of the parts |", "two 256x256 matmuls, two streams",
                "| a pinned H2D copy on one stream, a matmul on another, one host thread |", "| matmul | 4096 |",
                "| runtime launch (no-op kernel, one buffer) |", "| a + b, 16 floats (launch and run) |",
                "| ResNet-18 (batch 2, 3x32x32, SGD momentum) |",
                "| ResNet-18 channels_last (batch 2, 3x32x32, SGD momentum) |", "| CNN (2 conv, batch 1, SGD) |"):
        assert row in proc.stdout, proc.stdout
    sanitized = proc.stdout.split("## Stream sanitizer: training steps")[1]
    rows = [line.split("|") for line in sanitized.splitlines()
            if line.startswith(("| MLP", "| CNN", "| Transformer", "| ResNet"))]
    assert len(rows) == 6 and all(float(r[5]) > 0 and float(r[6]) > 0 for r in rows), sanitized  # on/off, on/cpu
    machine = proc.stdout.splitlines()[0]
    assert machine.startswith("Machine: ") and " cores; torch " in machine, machine


def test_the_report_names_the_cpu_model():
    from benchmarks.suite import cpu_name

    name = cpu_name()
    assert name
    if Path("/proc/cpuinfo").exists() and "model name" in Path("/proc/cpuinfo").read_text():
        assert name != platform.machine() and name.endswith(f"({platform.machine()})"), name

