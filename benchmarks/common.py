"""Measuring helpers shared by the benchmarks: interleaved repeats, medians, a table printer."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_time(fn: Callable[[], object], repeat: int, number: int = 1,
                after: Callable[[], object] | None = None) -> float:
    """Median seconds per call of ``fn`` over ``repeat`` rounds of ``number`` calls (``after`` runs untimed
    after each round, e.g. draining queued device work)."""
    fn()  # warm up
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - start) / number)
        if after is not None:
            after()
    return statistics.median(samples)


# LITERALINCLUDE START: BENCH INTERLEAVED
def interleaved(fns: dict[str, Callable[[], object]], repeat: int, number: int = 1,
                after: dict[str, Callable[[], object]] | None = None) -> dict[str, float]:
    """Median seconds per call of each function, with the repeats of all functions interleaved.

    ``after[name]`` runs untimed after each timed block of ``name`` (e.g. draining queued device work, so
    that it does not run during the next function's timing).
    """
    after = after or {}
    for fn in fns.values():
        fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(number):
                fn()
            samples[name].append((time.perf_counter() - start) / number)
            if name in after:
                after[name]()
    return {name: statistics.median(s) for name, s in samples.items()}
# LITERALINCLUDE END: BENCH INTERLEAVED


def table(headers: list[str], rows: list[list[str]]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
