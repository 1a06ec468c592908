"""``python -m torch_openreg.timing.calibrate``: a device profile fitted to measured workloads.

A vendor with hardware measures the standard workload set (:mod:`.workloads`) once and gets a profile::

    python -m torch_openreg.timing.calibrate --measure cuda --save-measurements x1.json --output x1-profile.json
    python -m torch_openreg.timing.calibrate x1.json --profile x1-base.json --output x1-profile.json

The first measures the set on this machine's CUDA device (``--measure cpu``: the CPU, eagerly) in the
shared file's format; the second fits a profile from a measurement file made elsewhere. Either way each
workload is traced on openreg (one step under simulated time), the fitting arithmetic of
:mod:`openreg.timing.calibrate` solves each parameter from its one named figure, the profile is written,
and the table of measured against predicted figures (fitted and held out) is printed. ``--no-fit``
only compares: the validation of a profile on fresh traces (re-running the workloads on openreg).
``--trace FILE`` writes the traces (``openreg/timing/data/h100-traces.json`` is such a file).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys

import torch

import openreg
from openreg.timing import calibrate as arithmetic
from openreg.timing.profiles import DeviceProfile, from_dict, to_dict

from . import costs, simulate, workloads
from .measure import measure, measure_all  # noqa: F401 - the command's, and the tests'

# LITERALINCLUDE START: TIMING CPU CALIBRATION
# A CPU runs its operators on the issuing thread: the host's cost is inside each operator's time, so a
# CPU profile has no host costs; it fits its floor (per-operator overhead) and five efficiencies, and
# the other classes take the fitted value of their family. bfloat16 is emulated on most CPUs: the CPU
# set is the float32 workloads.
CPU_PARAMETERS = {
    "kernel_floor_us": ("tiny-adds-x100", "kernels_us"),
    "efficiency.matrix": ("mm-f32-2048", "kernels_us"),
    "efficiency.elementwise": ("add-f32-16M", "kernels_us"),
    "efficiency.normalization": ("softmax-f32-4096x8192", "kernels_us"),
    "efficiency.conv": ("conv3x3-f32-b16-c128-28", "kernels_us"),
}
CPU_TIES = {"attention": "matrix", "attention_backward": "matrix",
            "reduction": "elementwise", "sort": "elementwise", "copy": "elementwise",
            "multi_tensor": "elementwise"}
CPU_WORKLOADS = ("mm-f32-2048", "add-f32-1M", "add-f32-16M", "tiny-adds-x100", "softmax-f32-4096x8192",
                 "sum-f32-64M", "conv3x3-f32-b16-c128-28", "h2d-pinned-256MB")


def cpu_template() -> DeviceProfile:
    """A starting profile for this machine's CPU: nominal peaks (the fitted efficiencies absorb their
    error), no cache term, no host costs."""
    cores = os.cpu_count() or 1
    return from_dict({
        "name": "cpu-calibrated", "description": f"this machine's CPU ({cores} cores), calibrated",
        "compute_units": cores, "vector_tflops": {"float32": 0.05 * cores, "float64": 0.025 * cores},
        "memory_gib": 16, "memory_bandwidth_gbs": 20,
        "host_link": {"pinned_gbs": 20, "pageable_gbs": 20}, "interconnect": {"bandwidth_gbs": 20},
        "launch_latency_us": 0.0001, "kernel_floor_us": 5.0, "cache": {"l2_mib": 0}, "matrix_overhead_us": 0,
        "host_us": {key: 0.0 for key in openreg.timing.HOST_US},
        "sources": {"vector_tflops": "nominal: 50 GFLOPS per core (the fit scales it)"},
    })
# LITERALINCLUDE END: TIMING CPU CALIBRATION


# LITERALINCLUDE START: TIMING TRACE WORKLOAD
def trace(name: str, profile="h100-sxm", small: bool = False) -> dict:
    """One step of workload ``name`` on openreg, after two warm-up steps, under simulated time: the
    clock's trace, the allocator's peak during the step over what was allocated before it, and the
    library scratch points (memory allocated at each launch that allocates scratch, and its basis)."""
    step = workloads.build(name, "openreg", small)
    for _ in range(2):
        step()
    torch.openreg.synchronize()
    gc.collect()
    device = torch.openreg.current_device()
    base = torch.openreg.memory_allocated(device)
    with simulate(profile):
        with openreg.timing.tracing() as ops:
            step()
        points = [(at - base, basis, kind) for d, at, basis, kind in costs.scratch_points if d == device]
        peak = torch.openreg.max_memory_allocated(device) - base
    torch.openreg.synchronize()
    return {"trace": ops, "peak_bytes": peak, "scratch": points}
# LITERALINCLUDE END: TIMING TRACE WORKLOAD




def fit(measured: dict, traces: dict, base: DeviceProfile, parameters: dict,
        ties: dict | None = None) -> DeviceProfile:
    """``base`` with ``parameters`` solved from ``measured`` (and ``ties``: classes that take another
    class's fitted efficiency)."""
    params = arithmetic.solve(traces, measured, base, parameters)
    profile = arithmetic.with_parameters(base, params)
    if ties:
        eff = dict(profile.efficiency)
        eff.update({kind: eff[source] for kind, source in ties.items()})
        profile = dataclasses.replace(profile, efficiency=eff)
    return profile


def _trace_json(data: dict) -> str:
    """The trace file, one traced operation per line (readable diffs when the pricing changes)."""
    lines = ["{", f' "about": {json.dumps(data["about"])},', f' "small": {json.dumps(data["small"])},',
             ' "workloads": {']
    names = list(data["workloads"])
    for i, name in enumerate(names):
        w = data["workloads"][name]
        lines.append(f'  {json.dumps(name)}: {{"peak_bytes": {json.dumps(w["peak_bytes"])}, '
                     f'"scratch": {json.dumps(w["scratch"])}, "trace": [')
        ops = [f"   {json.dumps(op)}" for op in w["trace"]]
        lines.append(",\n".join(ops))
        lines.append("  ]}" + ("," if i < len(names) - 1 else ""))
    lines += [" }", "}"]
    return "\n".join(lines) + "\n"


def workload_names(spec: str | None, device: str | None = None) -> list[str]:
    """The workloads a ``--workloads`` value names: a comma-separated list, ``classes`` (the kernel-class
    set, :mod:`.class_workloads`), ``all`` (both sets); by default the standard set (the CPU's with
    ``--measure cpu``)."""
    classes = list(workloads.class_workloads())
    if not spec:
        return list(CPU_WORKLOADS if device == "cpu" else workloads.WORKLOADS)
    if spec == "classes":
        return classes
    if spec == "all":
        return [*workloads.WORKLOADS, *classes]
    return spec.split(",")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_openreg.timing.calibrate",
                                     description="Fit a device profile to measured times of the standard workloads.")
    parser.add_argument("measurements", nargs="?", help="a measurement file (the shared file's format)")
    parser.add_argument("--measure", choices=("cuda", "cpu"), help="measure the set on this machine instead")
    parser.add_argument("--save-measurements", metavar="JSON", help="write what --measure measured there")
    parser.add_argument("--profile", default=None, help="the profile to start from (default: h100-sxm; "
                        "the CPU template with --measure cpu)")
    parser.add_argument("--output", metavar="JSON", help="write the fitted profile there")
    parser.add_argument("--workloads", help="comma-separated names, 'classes' (the kernel-class set) or 'all' "
                        "(default: the standard set)")
    parser.add_argument("--small", action="store_true", help="the workloads' small sizes (quick; for tests)")
    parser.add_argument("--traces", metavar="JSON", help="read the openreg traces from there instead of tracing")
    parser.add_argument("--trace", metavar="JSON", help="only trace the set on openreg and write the traces there")
    parser.add_argument("--measure-only", action="store_true", help="with --measure: only measure (and save), "
                        "no openreg traces (the short call on a machine lent for measuring)")
    parser.add_argument("--no-fit", action="store_true", help="only predict the measured figures on the profile "
                        "(run the workloads on openreg and compare: the validation on fresh traces)")
    args = parser.parse_args(argv)
    names = workload_names(args.workloads, args.measure)
    base = cpu_template() if args.measure == "cpu" and args.profile is None else \
        openreg.timing.resolve(args.profile or "h100-sxm")
    if args.trace:
        out = {name: trace(name, base, args.small) for name in names}
        data = {"about": "openreg traces of the standard workloads (python -m torch_openreg.timing.calibrate "
                "--trace): what the simulated clock was told during one step", "small": args.small,
                "workloads": {n: {**w, "trace": arithmetic.encode(w["trace"])} for n, w in out.items()}}
        with open(args.trace, "w") as f:
            f.write(_trace_json(data))
        print(f"traced {len(out)} workloads into {args.trace}")
        return 0
    if args.measure:
        if args.measure == "cuda" and not torch.cuda.is_available():
            parser.error("--measure cuda needs a CUDA device")
        measured = measure_all(names, args.measure, args.small, args.save_measurements)
        if args.measure_only:
            return 0
    elif args.measurements:
        measured = {n: w for n, w in arithmetic.load_measurements(args.measurements).items() if n in names}
    else:
        parser.error("give a measurement file, or --measure cuda|cpu")
    traces = arithmetic.load_traces(args.traces) if args.traces else \
        {name: trace(name, base, args.small) for name in measured if name in workload_names("all")}
    parameters = CPU_PARAMETERS if args.measure == "cpu" else arithmetic.PARAMETERS
    if args.no_fit:
        profile = base
    else:
        profile = fit(measured, traces, base, parameters, CPU_TIES if args.measure == "cpu" else None)
    rows = arithmetic.compare(traces, measured, profile, parameters)
    print(arithmetic.markdown(rows))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(to_dict(profile), f, indent=1)
        print(f"profile written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
