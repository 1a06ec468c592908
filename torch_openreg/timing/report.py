"""The report of a simulation: device time, the operators that took it and what bounds them, the
memory peak against the profile's capacity, and a roofline plot."""

from __future__ import annotations

import collections
from dataclasses import dataclass

from openreg.timing import DeviceProfile, Launch
from openreg.timing.calibrate import busy
from openreg.timing.clock import issue_seconds


@dataclass
class Operator:
    """One operator (launch name) over a simulation: its calls and where its predicted time went."""

    name: str
    kind: str
    calls: int
    seconds: float  # predicted device time, summed over its launches
    flops: float
    bytes: float
    bound: str  # what bounds most of its time: compute, memory, latency or link
    compute_fraction: float  # achieved FLOP/s over the peak its FLOPs were priced against
    memory_fraction: float  # achieved bytes/s over the memory bandwidth (or link) peak
    formula: bool  # whether its FLOPs came from a PyTorch formula
    priced: bool  # whether its launches came with a cost at all


# LITERALINCLUDE START: TIMING REPORT
class Report:
    """What ``torch.openreg.simulate(...)`` returns: filled in while the block runs."""

    def __init__(self, profile: DeviceProfile) -> None:
        self.profile = profile
        self.launches: list[Launch] = []  # every launch made inside the block, in launch order
        self.memory_peak: dict[int, int] = {}  # device -> peak bytes inside the block (library scratch included)
        self.wall_time = 0.0  # what CUDA events around the block read (set when the block ends)
        self.host_time = 0.0  # the host's simulated time spent inside the block: issuing launches, waiting
        self.python_calls = 0  # the program's Python function calls inside the block (charged to the host)

    @property
    def device_time(self) -> float:
        """The device's busy time: simulated seconds during which a kernel or copy ran, on any stream
        (overlapping launches counted once, idle gaps excluded), as a profiler's kernel durations add up."""
        return busy((r.start, r.end) for r in self.launches)

    @property
    def issue_time(self) -> float:
        """The host's simulated cost of issuing the block's launches and its calls into PyTorch's Python
        code (the profile's ``host_us``), waits excluded."""
        launches = sum(issue_seconds(r.cost, self.profile) for r in self.launches if r.cost is not None)
        return launches + self.python_calls * self.profile.host_us["python"] * 1e-6

    @property
    def bound(self) -> str:
        """``"host"`` when the device waited for the host more than it worked (the wall time is mostly
        the host's issue cost), else ``"device"``."""
        return "host" if self.wall_time > 0 and self.device_time < 0.5 * self.wall_time else "device"

    @property
    def memory_capacity(self) -> int:
        return self.profile.memory_bytes

    def operators(self) -> list[Operator]:
        """The launches grouped by name, the most expensive first."""
        groups: dict[str, list[Launch]] = collections.defaultdict(list)
        for record in self.launches:
            groups[record.name].append(record)
        rows = []
        for name, records in groups.items():
            seconds = sum(r.prediction.seconds for r in records)
            by_bound: dict[str, float] = collections.Counter()
            for r in records:
                by_bound[r.prediction.bound] += r.prediction.seconds
            flops = sum(r.cost.flops for r in records if r.cost is not None)
            nbytes = sum(r.cost.bytes for r in records if r.cost is not None)
            peak_flops = max((r.prediction.peak_flops for r in records), default=0.0)
            peak_bytes = max((r.prediction.peak_bytes for r in records), default=0.0)
            first = records[0].cost
            rows.append(Operator(
                name=name, kind=first.kind if first is not None else "unpriced", calls=len(records), seconds=seconds,
                flops=flops, bytes=nbytes, bound=max(by_bound, key=by_bound.get),
                compute_fraction=flops / seconds / peak_flops if seconds and peak_flops else 0.0,
                memory_fraction=nbytes / seconds / peak_bytes if seconds and peak_bytes else 0.0,
                formula=first is not None and first.formula, priced=first is not None,
            ))
        return sorted(rows, key=lambda r: r.seconds, reverse=True)

    @property
    def no_formula(self) -> list[str]:
        """Operators with no FLOP formula: priced by their bytes (and launch latency) alone."""
        return sorted(r.name for r in self.operators() if r.priced and not r.formula and r.kind not in
                      ("copy", "collective"))

    @property
    def unpriced(self) -> list[str]:
        """Launches that came without a cost (priced at the launch latency alone)."""
        return sorted(r.name for r in self.operators() if not r.priced)

    def table(self, top: int = 15) -> str:
        """The top operators by predicted time, what bounds each, the achieved fraction of each peak,
        and the memory peak against the profile's capacity."""
        busy = sum(r.prediction.seconds for r in self.launches) or 1.0
        wall = self.wall_time or 1.0
        share = (f"host-bound: the device is busy {self.device_time / wall:.0%} of the wall time, the host issues "
                 f"for {min(self.issue_time / wall, 1.0):.0%} of it" if self.bound == "host" else
                 f"device-bound: the device is busy {self.device_time / wall:.0%} of the wall time")
        lines = [f"device profile: {self.profile.name} ({self.profile.description})",
                 f"simulated device time: {_time(self.device_time)} over {len(self.launches)} launches",
                 f"simulated wall time: {_time(self.wall_time)} ({share})", "",
                 f"{'operator':<44} {'calls':>6} {'time':>10} {'share':>6}  {'bound':<8} {'of peak FLOPS':>13} "
                 f"{'of peak bytes/s':>15}"]
        for row in self.operators()[:top]:
            lines.append(f"{row.name[:44]:<44} {row.calls:>6} {_time(row.seconds):>10} {row.seconds / busy:>6.1%}  "
                         f"{row.bound:<8} {row.compute_fraction:>13.1%} {row.memory_fraction:>15.1%}")
        peaks = {d: p for d, p in self.memory_peak.items() if p} or dict(list(self.memory_peak.items())[:1])
        for device, peak in sorted(peaks.items()):
            lines.append(f"memory peak on openreg:{device}: {_size(peak)} of {_size(self.memory_capacity)} "
                         f"({peak / self.memory_capacity:.1%} of the profile's capacity)")
        if self.no_formula:
            lines.append(f"priced by bytes alone (no FLOP formula): {', '.join(self.no_formula)}")
        if self.unpriced:
            lines.append(f"launches without a cost (launch latency only): {', '.join(self.unpriced)}")
        return "\n".join(lines)
    # LITERALINCLUDE END: TIMING REPORT

    def roofline(self, path: str | None = None):
        """A roofline plot (matplotlib) of the operators with FLOPs: arithmetic intensity against
        achieved FLOP/s, under the profile's memory and compute roofs. Saved to ``path`` if given."""
        import matplotlib

        if path is not None:
            matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        profile = self.profile
        bandwidth = profile.memory_bandwidth_gbs * 1e9
        figure, axes = plt.subplots(figsize=(8, 5))
        points = [r for r in self.operators() if r.bytes and r.seconds and r.kind not in ("copy", "collective")]
        roofs = {}
        for row in (r for r in points if r.flops):  # the roofs of the operators on the plot
            peak = max((r.prediction.peak_flops for r in self.launches if r.name == row.name), default=0.0)
            roofs[peak] = roofs.get(peak, row.kind)
        intensities = [r.flops / r.bytes for r in points if r.flops] or [1.0]
        low, high = min(min(intensities) / 4, 0.1), max(max(intensities) * 4, 1e3)
        xs = [low * (high / low) ** (i / 200) for i in range(201)]
        for peak, kind in sorted(roofs.items()):
            if peak:
                axes.loglog(xs, [min(peak, bandwidth * x) / 1e12 for x in xs], "-",
                            label=f"roof: {peak / 1e12:g} TFLOPS ({kind}), {profile.memory_bandwidth_gbs:g} GB/s")
        for row in points:
            if row.flops:
                x, y = row.flops / row.bytes, row.flops / row.seconds / 1e12
                axes.loglog([x], [y], "o")
                axes.annotate(row.name.replace("aten::", ""), (x, y), fontsize=7, xytext=(3, 3),
                              textcoords="offset points")
        axes.set_xlabel("arithmetic intensity (FLOP/byte)")
        axes.set_ylabel("achieved TFLOPS (predicted)")
        axes.set_title(f"{profile.name}: operators on the roofline")
        axes.legend(fontsize=7, loc="lower right")
        figure.tight_layout()
        if path is not None:
            figure.savefig(path, dpi=120)
        return figure

    def __repr__(self) -> str:
        return (f"<openreg timing Report: {self.profile.name}, {_time(self.device_time)} over "
                f"{len(self.launches)} launches>")


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3f} {unit}"
    return f"{seconds * 1e9:.1f} ns"


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"
