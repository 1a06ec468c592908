"""Calibration from measured workloads: the fitting arithmetic (torch-free).

A *measurement file* (``data/h100-calibration.json``'s format) gives, per workload of the standard set,
what a real device measured: ``kernels_us`` (the summed durations of one step's kernels and copies),
``wall_us`` (CUDA events around a step, in a loop of steps) and ``peak_bytes`` (the allocator's peak
during a step, over what was allocated before it). A *trace file* keeps, per workload, what the
simulated clock was told during one step on openreg (its launches with their costs, the host's views,
its waits; ``torch_openreg.timing.calibrate --trace`` writes it): :func:`replay` re-times a trace on any
profile without running anything, so :func:`solve` can fit a profile's parameters to the measurements
(each parameter from ONE named workload figure, by bisection) and :func:`compare` predicts the rest.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path

from . import model
from .clock import Clock
from .profiles import DATA, DeviceProfile

MEASURED = DATA / "h100-calibration.json"  # the H100's measurements (a copy of the shared file)
TRACES = DATA / "h100-traces.json"  # the same workloads' traces on openreg
QUANTITIES = ("kernels_us", "wall_us", "peak_bytes")

# LITERALINCLUDE START: TIMING CALIBRATION PARAMETERS
# Which measured figure sets which parameter (``table.key`` names a profile's table entry). The rest of
# the figures are held out. Solved in this order, several passes (they depend on each other a little).
PARAMETERS = {
    "kernel_floor_us": ("tiny-adds-x100", "kernels_us"),
    "host_us.op": ("tiny-adds-x100", "wall_us"),
    "matrix_overhead_us": ("mm-bf16-1024", "kernels_us"),
    "efficiency.l2": ("add-f32-1M", "kernels_us"),
    "efficiency.normalization": ("softmax-f32-4096x8192", "kernels_us"),
    "efficiency.conv": ("conv3x3-f32-b16-c128-28", "kernels_us"),
    "efficiency.attention_fill": ("sdpa-bf16-b8-h16-s512-d128", "kernels_us"),
    "host_us.library": ("sdpa-bf16-b8-h16-s512-d128", "wall_us"),
    "host_us.python": ("conv3x3-f32-b16-c128-28", "wall_us"),
    "efficiency.multi_tensor": ("mlp-step-bf16-b512-w1024", "kernels_us"),
    "host_us.autograd": ("mlp-step-bf16-b512-w1024", "wall_us"),
    "scratch.conv_workspace": ("conv3x3-f32-b16-c128-28", "peak_bytes"),
}
# LITERALINCLUDE END: TIMING CALIBRATION PARAMETERS


def load_measurements(path: str | Path = MEASURED) -> dict[str, dict]:
    """``{workload: {"kernels_us", "wall_us", "peak_bytes", ...}}`` from a measurement file."""
    data = json.loads(Path(path).read_text())
    workloads = data.get("workloads") if isinstance(data, Mapping) else None
    if not isinstance(workloads, Mapping):
        raise ValueError(f"{path}: a measurement file has a 'workloads' table")
    for name, row in workloads.items():
        for quantity in QUANTITIES:
            if quantity in row and not isinstance(row[quantity], (int, float)):
                raise ValueError(f"{path}: workload {name!r}: {quantity} must be a number, got {row[quantity]!r}")
    return dict(workloads)


# --- traces: what the clock was told, as JSON ------------------------------------------------------------

def _cost_to_json(cost: model.Cost | None):
    if cost is None:
        return None
    out = {f.name: getattr(cost, f.name) for f in dataclasses.fields(cost)
           if getattr(cost, f.name) != f.default and f.name != "parts"}
    if cost.parts:
        out["parts"] = [_cost_to_json(p) for p in cost.parts]
    for key in ("shape", "grid"):
        if getattr(cost, key) is not None:
            out[key] = list(getattr(cost, key))
    return out


def _cost_from_json(data) -> model.Cost | None:
    if data is None:
        return None
    data = dict(data)
    if "parts" in data:
        data["parts"] = tuple(_cost_from_json(p) for p in data["parts"])
    for key in ("shape", "grid"):
        if key in data:
            data[key] = tuple(data[key])
    return model.FREE if data == {"kind": "copy", "host": "none"} else model.Cost(**data)


def encode(trace: list) -> list:
    """A trace (``openreg.timing.tracing()``'s list) as JSON-able lists."""
    return [[*op[:5], _cost_to_json(op[5]), op[6]] if op[0] == "launch" else list(op) for op in trace
            if op[0] in ("launch", "host", "wait", "mark")]


def decode(data: list) -> list:
    return [("launch", *op[1:5], _cost_from_json(op[5]), op[6]) if op[0] == "launch" else tuple(op)
            for op in data]


# LITERALINCLUDE START: TIMING REPLAY
def busy(intervals) -> float:
    """Seconds covered by ``(start, end)`` intervals, overlaps counted once (the device's busy time)."""
    total, reached = 0.0, None
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if reached is None or start >= reached:
            total, reached = total + end - start, end
        elif end > reached:
            total, reached = total + end - reached, end
    return total


def replay(trace: list, profile: DeviceProfile, steps: int = 3) -> dict[str, float]:
    """Re-time one traced step on ``profile``, ``steps`` times back to back as a benchmark loop runs it:
    ``kernels_us`` (the last step's busy device time) and ``wall_us`` (from an event recorded before the
    last step to one after it: the loop's time per step)."""
    clock = Clock(profile)
    last = max((op[3] for op in trace if op[0] in ("launch", "wait")), default=0) + 1
    marks, records = [], []
    for step in range(steps):
        offset = step * last
        marks.append(clock.now(0, 0))
        for op in trace:
            if op[0] == "launch":
                records.append((step, clock.launch(op[1], op[2], op[3] + offset, op[4], op[5], op[6])))
            elif op[0] == "host":
                clock.host_spends(op[1])
            elif op[0] == "wait":
                clock.host_waits(op[1], op[2], op[3] + offset)
    marks.append(clock.now(0, 0))
    device = busy((r.start, r.end) for s, r in records if s == steps - 1)
    return {"kernels_us": device * 1e6, "wall_us": (marks[-1] - marks[-2]) * 1e6}
# LITERALINCLUDE END: TIMING REPLAY


def predict(workload: Mapping, profile: DeviceProfile) -> dict[str, float]:
    """A traced workload's ``kernels_us``, ``wall_us`` and ``peak_bytes`` on ``profile``: the allocator's
    peak, or a library's scratch on top of what was allocated at its launch, if higher."""
    out = replay(workload["trace"], profile)
    scratch = [at + basis * profile.scratch[kind] for at, basis, kind in workload.get("scratch", ())]
    out["peak_bytes"] = max([workload.get("peak_bytes", 0), *scratch])
    return out


def load_traces(path: str | Path = TRACES) -> dict[str, dict]:
    data = json.loads(Path(path).read_text())
    return {name: {**w, "trace": decode(w["trace"])} for name, w in data["workloads"].items()}


# --- fitting ----------------------------------------------------------------------------------------------

def with_parameters(profile: DeviceProfile, params: Mapping[str, float]) -> DeviceProfile:
    """``profile`` with parameters replaced: top-level fields by name, table entries as ``table.key``."""
    changes: dict = {}
    for name, value in params.items():
        if "." in name:
            table, key = name.split(".", 1)
            changes.setdefault(table, dict(getattr(profile, table)))[key] = value
        else:
            changes[name] = value
    return dataclasses.replace(profile, **changes)


def parameters_of(profile: DeviceProfile, names) -> dict[str, float]:
    out = {}
    for name in names:
        if "." in name:
            table, key = name.split(".", 1)
            out[name] = getattr(profile, table)[key]
        else:
            out[name] = getattr(profile, name)
    return out


# LITERALINCLUDE START: TIMING SOLVE
def solve(traces: Mapping[str, Mapping], measured: Mapping[str, Mapping], profile: DeviceProfile,
          parameters: Mapping[str, tuple[str, str]] = PARAMETERS, passes: int = 4) -> dict[str, float]:
    """Each parameter of ``parameters`` solved so that the model reproduces its one workload figure
    (bisection over a wide range; the parameters in turn, ``passes`` times). Parameters whose workload
    is not measured or traced keep the profile's value."""
    usable = {p: (w, q) for p, (w, q) in parameters.items() if w in traces and q in measured.get(w, {})}
    params = parameters_of(profile, usable)
    for _ in range(passes):
        for name, (workload, quantity) in usable.items():
            target = measured[workload][quantity]

            def error(x: float, name: str = name, workload: str = workload, quantity: str = quantity,
                      target: float = target) -> float:
                trial = with_parameters(profile, {**params, name: x})
                return predict(traces[workload], trial)[quantity] - target

            times = name.endswith("_us") or name.startswith(("host_us.", "scratch."))
            low, high = (0.0, 1000.0) if times else (0.01, 20.0)
            e_low, e_high = error(low), error(high)
            if e_low == e_high or (e_low > 0) == (e_high > 0):  # the figure does not depend on it, or out of range
                params[name] = low if abs(e_low) < abs(e_high) else high
                continue
            params[name] = bisect(error, low, high)
    return params


def bisect(error: Callable[[float], float], low: float, high: float, steps: int = 50) -> float:
    """The value in ``[low, high]`` where ``error`` changes sign (it changes sign there once)."""
    rising = error(high) > error(low)
    for _ in range(steps):
        mid = (low + high) / 2
        if (error(mid) > 0) == rising:
            high = mid
        else:
            low = mid
    return (low + high) / 2
# LITERALINCLUDE END: TIMING SOLVE


def compare(traces: Mapping[str, Mapping], measured: Mapping[str, Mapping], profile: DeviceProfile,
            parameters: Mapping[str, tuple[str, str]] = PARAMETERS) -> list[dict]:
    """Per workload and quantity: measured, predicted, relative error, and whether that figure fitted a
    parameter (``fit``) or was held out."""
    fitted = {(w, q) for w, q in parameters.values()}
    rows = []
    for name in measured:
        if name not in traces:
            continue
        predicted = predict(traces[name], profile)
        for quantity in QUANTITIES:
            value = measured[name].get(quantity)
            if value is None:
                continue
            guess = predicted[quantity]
            error = (guess - value) / value if value else (0.0 if not guess else float("inf"))
            rows.append({"workload": name, "quantity": quantity, "measured": value, "predicted": guess,
                         "error": error, "use": "fit" if (name, quantity) in fitted else "held-out"})
    return rows


def summary(rows: list[dict], quantity: str, use: str | None = "held-out") -> dict:
    """Median and worst absolute error of one quantity (over held-out rows, or all with ``use`` None)."""
    chosen = [r for r in rows if r["quantity"] == quantity and (use is None or r["use"] == use)]
    if not chosen:
        return {"count": 0, "median": float("nan"), "worst": None}
    worst = max(chosen, key=lambda r: abs(r["error"]))
    return {"count": len(chosen), "median": statistics.median(abs(r["error"]) for r in chosen),
            "worst": (worst["workload"], worst["error"])}


def markdown(rows: list[dict]) -> str:
    """The real-device table: one row per workload, its three figures measured and predicted."""
    by_name: dict[str, dict] = {}
    for r in rows:
        by_name.setdefault(r["workload"], {})[r["quantity"]] = r
    lines = ["| workload | kernels measured | predicted | error | wall measured | predicted | error | "
             "peak measured | predicted | error |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def cell(r: dict | None, unit: str) -> str:
        if r is None:
            return " | | "
        fit = " (fit)" if r["use"] == "fit" else ""
        if unit == "MiB":
            return f"{r['measured'] / 2**20:.2f} MiB | {r['predicted'] / 2**20:.2f} MiB | {r['error'] * 100:+.0f}%{fit}"
        return f"{r['measured']:.1f} us | {r['predicted']:.1f} us | {r['error'] * 100:+.0f}%{fit}"

    for name, figures in by_name.items():
        lines.append(f"| {name} | {cell(figures.get('kernels_us'), 'us')} | {cell(figures.get('wall_us'), 'us')} | "
                     f"{cell(figures.get('peak_bytes'), 'MiB')} |")
    lines.append("")
    for quantity, label in (("kernels_us", "device time"), ("wall_us", "wall time"), ("peak_bytes", "peak memory")):
        s = summary(rows, quantity)
        if s["count"]:
            lines.append(f"Held-out {label}: {s['count']} figures, median absolute error {s['median'] * 100:.1f}%, "
                         f"worst {s['worst'][0]} ({s['worst'][1] * 100:+.0f}%).")
    return "\n".join(lines)
