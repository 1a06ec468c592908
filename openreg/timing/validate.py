"""The timing model against published measurements of real GPUs (``data/measurements.json``) and
against the workloads measured on a real H100 (``data/h100-calibration.json``, re-timed from their
openreg traces, ``data/h100-traces.json``).

``python -m openreg.timing.validate`` prints both comparison tables (the ones in docs/timing.md) and
their error summaries; ``--fit`` solves the model's fitted parameters again from the published rows
marked ``fit:<name>`` and the workload figures named in :data:`.calibrate.PARAMETERS` (one figure each)
and prints them: they must match the defaults of :mod:`.model`. Every other figure is held out.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from . import calibrate, model
from .profiles import DATA, DeviceProfile, builtin

MEASUREMENTS = DATA / "measurements.json"
_BYTES = {"float64": 8, "float32": 4, "tfloat32": 4, "bfloat16": 2, "float16": 2, "float8": 1, "int8": 1}
# STREAM-like kernels: (kind, arrays moved)
_STREAM = {"copy": ("copy", 2), "mul": ("elementwise", 2), "scale": ("elementwise", 2), "add": ("elementwise", 3),
           "triad": ("elementwise", 3), "dot": ("reduction", 2), "read": ("reduction", 1), "init": ("elementwise", 1)}


def load(path: Path = MEASUREMENTS) -> list[dict]:
    return json.loads(Path(path).read_text())["figures"]


# LITERALINCLUDE START: TIMING VALIDATE PREDICT
def predict_figure(row: dict, profile: DeviceProfile) -> float:
    """What the model predicts for one published figure, in the figure's unit."""
    p, quantity = row["params"], row["quantity"]
    if quantity == "gemm_tflops":
        m, n, k, size = p["m"], p["n"], p["k"], _BYTES[p["dtype"]]
        flops = 2.0 * m * n * k
        nbytes = (m * k + k * n) * size + m * n * p.get("out_bytes", size)
        cost = model.Cost("matrix", flops, nbytes, p["dtype"], shape=(m, n, k, 1), formula=True)
        return flops / model.predict(cost, profile).seconds / 1e12
    if quantity == "attention_tflops":  # fused attention, FLOPs as the FlashAttention papers count them
        b, h, s, d, size = p["batch"], p["heads"], p["seq"], p["head_dim"], _BYTES[p["dtype"]]
        backward = p.get("backward", False)
        flops = 4.0 * b * h * s * s * d * (2.5 if backward else 1.0)
        nbytes = (8 if backward else 4) * b * h * s * d * size
        cost = model.Cost("attention_backward" if backward else "attention", flops, nbytes, p["dtype"],
                          shape=(b * h, s, s, d), formula=True)
        return flops / model.predict(cost, profile).seconds / 1e12
    if quantity == "stream_tbs":
        kind, arrays = _STREAM[p["op"]]
        nbytes = arrays * p["elements"] * p["element_bytes"]
        return nbytes / model.predict(model.Cost(kind, bytes=nbytes, dtype="float64"), profile).seconds / 1e12
    if quantity == "launch_us":  # back-to-back tiny kernels: each its floor, then the gap to the next
        return max(model.predict(model.Cost("elementwise"), profile).seconds * 1e6, profile.launch_latency_us)
    if quantity in ("h2d_gbs", "d2h_gbs"):
        cost = model.Cost("copy", bytes=p["bytes"], link=quantity[:3])
        return p["bytes"] / model.predict(cost, profile).seconds / 1e9
    if quantity == "d2d_gbs":  # counted as bandwidthTest counts it: read plus write
        cost = model.Cost("copy", bytes=2 * p["bytes"])
        return 2 * p["bytes"] / model.predict(cost, profile).seconds / 1e9
    if quantity == "allreduce_busbw_gbs":  # NCCL's bus bandwidth: algorithm bandwidth x 2(p-1)/p
        ranks = p["ranks"]
        cost = model.Cost("collective", bytes=p["bytes"], collective="all_reduce", ranks=ranks)
        return p["bytes"] / model.predict(cost, profile).seconds * 2 * (ranks - 1) / ranks / 1e9
    raise ValueError(f"{row['id']}: unknown quantity {quantity!r}")
# LITERALINCLUDE END: TIMING VALIDATE PREDICT


def with_parameters(profile: DeviceProfile, params: dict) -> DeviceProfile:
    """``profile`` with the model's fitted parameters replaced by ``params`` (efficiencies by their class's
    name, the others as :func:`.calibrate.with_parameters` names them)."""
    named = {(f"efficiency.{k}" if k in model.EFFICIENCY else k): v for k, v in params.items()}
    return calibrate.with_parameters(profile, named)


def current_parameters() -> dict:
    """The model's defaults, by the names :func:`fit` gives them."""
    return {**model.EFFICIENCY, "launch_latency_us": model.LAUNCH_LATENCY_US,
            "matrix_overhead_us": model.MATRIX_OVERHEAD_US,
            "collective_latency_us": model.COLLECTIVE_LATENCY_US, "kernel_floor_us": model.KERNEL_FLOOR_US,
            **{f"host_us.{k}": v for k, v in model.HOST_US.items()},
            **{f"scratch.{k}": v for k, v in model.SCRATCH.items()}}


# LITERALINCLUDE START: TIMING FIT
def fit(rows: list[dict]) -> dict:
    """Solve each parameter named by a ``fit:<parameter>`` row so that the model reproduces that row's
    figure exactly (bisection; the parameters are solved in turn, three passes), then each parameter of
    :data:`.calibrate.PARAMETERS` from its H100 workload figure (re-timing the workloads' traces), and
    the whole again, twice (the two sets depend on each other a little)."""
    params = current_parameters()
    profiles = builtin()
    fitting = [r for r in rows if r["use"].startswith("fit:")]
    traces, measured = calibrate.load_traces(), calibrate.load_measurements()
    for _ in range(2):
        for _ in range(3):
            for row in fitting:
                name = row["use"][4:]
                low, high = (0.0, 100.0) if name.endswith("_us") else (0.0, 20.0) if name.endswith("_fill") \
                    else (0.01, 2.0)

                def error(x: float, row: dict = row, name: str = name) -> float:
                    trial = with_parameters(profiles[row["device"]], {**params, name: x})
                    return predict_figure(row, trial) - row["value"]

                params[name] = calibrate.bisect(error, low, high, 60)
        h100 = with_parameters(profiles["h100-sxm"], params)
        for name, value in calibrate.solve(traces, measured, h100).items():
            params[name.removeprefix("efficiency.")] = value
    params["sort"] = params["reduction"]  # no figure: radix passes stream as a reduction does
    return params
# LITERALINCLUDE END: TIMING FIT


def compare_workloads() -> list[dict]:
    """The H100 workloads: measured against predicted on the built-in H100 profile."""
    return calibrate.compare(calibrate.load_traces(), calibrate.load_measurements(), builtin()["h100-sxm"])


def compare(rows: list[dict], params: dict | None = None) -> list[tuple[dict, float, float]]:
    """``(row, predicted, relative error)`` per figure, on the built-in profiles (with ``params``)."""
    profiles = builtin()
    out = []
    for row in rows:
        profile = profiles[row["device"]] if params is None else with_parameters(profiles[row["device"]], params)
        predicted = predict_figure(row, profile)
        out.append((row, predicted, (predicted - row["value"]) / row["value"]))
    return out


def summary(compared: list[tuple[dict, float, float]]) -> dict:
    """Median absolute error over all figures and over the held-out ones, and the worst held-out figure."""
    held = [c for c in compared if c[0]["use"] == "held-out"]
    worst = max(held, key=lambda c: abs(c[2]))
    return {
        "figures": len(compared), "held_out": len(held),
        "devices": sorted({c[0]["device"] for c in compared}),
        "median_abs_error": statistics.median(abs(c[2]) for c in compared),
        "median_abs_error_held_out": statistics.median(abs(c[2]) for c in held),
        "worst_held_out": (worst[0]["id"], worst[2]),
    }


def markdown(compared: list[tuple[dict, float, float]]) -> str:
    """The docs table: one row per figure."""
    lines = ["| figure | device | published | predicted | error | use | source |", "|---|---|---:|---:|---:|---|---|"]
    for row, predicted, err in compared:
        lines.append(f"| {row['id']} | {row['device']} | {row['value']:g} {row['unit']} | {predicted:.4g} | "
                     f"{err * 100:+.0f}% | {row['use']} | [{_short(row['source'])}]({row['url'].split(' ')[0]}) |")
    s = summary(compared)
    lines.append("")
    lines.append(f"{s['figures']} figures on {len(s['devices'])} devices ({', '.join(s['devices'])}), {s['held_out']} "
                 f"held out. Median absolute error: {s['median_abs_error'] * 100:.1f}% over all, "
                 f"{s['median_abs_error_held_out'] * 100:.1f}% over the held-out figures; worst held-out figure: "
                 f"{s['worst_held_out'][0]} ({s['worst_held_out'][1] * 100:+.0f}%).")
    return "\n".join(lines)


def _short(source: str) -> str:
    return source.split(":")[0].split(",")[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openreg.timing.validate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fit", action="store_true", help="solve the fitted parameters from the fit rows")
    args = parser.parse_args(argv)
    rows = load()
    if args.fit:
        for name, value in fit(rows).items():
            print(f"{name} = {value:.4g}")
        return 0
    print(markdown(compare(rows)))
    print()
    print(calibrate.markdown(compare_workloads()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
