"""The benchmarks' quick mode runs in CI: it checks the suite works, not how fast anything is."""

from __future__ import annotations

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
