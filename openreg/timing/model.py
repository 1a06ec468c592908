"""The cost of one launch and the roofline that turns it into a predicted device duration.

A launch's :class:`Cost` says what it does (its kind, FLOPs, bytes moved, the data type it computes
in); :func:`predict` prices it on a :class:`~.profiles.DeviceProfile`:

* kernels: ``launch latency + max(FLOPs / achievable compute, bytes / achievable memory bandwidth)``,
  where "achievable" is the profile's peak times the efficiency of the kernel's class (matrix
  products, convolutions, elementwise, reductions, copies). Matrix products with known sizes are
  also charged for wave quantization: the output is cut in ``MATRIX_TILE``-square tiles, one per
  compute unit at a time, so a product of 64 tiles on a 108-unit device takes a whole wave;
* host copies: the host link's bandwidth (pinned or pageable), plus launch latency;
* peer copies and collectives: an alpha-beta model over the profile's interconnect (``steps``
  latencies plus the bytes each rank sends, over the link's achievable bandwidth).

Caches, fusion, occupancy, clocks and power are not modelled (docs/timing.md says what that means).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("matrix", "conv", "elementwise", "reduction", "copy", "collective")
MATRIX_TILE = 128  # output tile edge of a matrix-product kernel (cuBLAS's common 128x128 tiles)

# LITERALINCLUDE START: TIMING DEFAULTS
# The model's fitted parameters: each was solved from ONE published H100 figure (the "fit" rows of
# data/measurements.json; python -m openreg.timing.validate --fit recomputes them). Every other figure
# there is held out. A profile file may override any of them (its "efficiency" table, its
# "launch_latency_us" and its interconnect's "latency_us").
EFFICIENCY = {
    "matrix": 0.843,  # achieved / peak matrix-unit FLOPS (H100 BF16 best-shape matmul, 794.5 TFLOPS)
    "conv": 0.843,  # no published convolution figure was used: convolutions take the matrix value
    "elementwise": 0.895,  # achieved / peak memory bandwidth (H100 STREAM triad, 2.97 TB/s)
    "reduction": 0.963,  # (H100 STREAM dot, 3.18 TB/s)
    "copy": 0.877,  # device-to-device copies (H100 STREAM copy, 2.90 TB/s)
    "host_link": 0.797,  # achieved / per-direction host link bandwidth (H100 host-to-device, 51 GB/s)
    "interconnect": 1.065,  # collective bus bandwidth / per-direction link bandwidth (H100 NCCL, 478.9 GB/s)
}
LAUNCH_LATENCY_US = 2.433  # per-kernel overhead, back-to-back launches (Hopper, 2433 ns)
COLLECTIVE_LATENCY_US = 2.552  # alpha: per step of a collective (H100 NCCL all-reduce of 1 MB, 43.7 GB/s)
# LITERALINCLUDE END: TIMING DEFAULTS

# Steps (latencies paid) and the fraction of the buffer each rank sends, for ``ranks`` = p: ring
# algorithms, as NCCL's bus bandwidth counts them.
_COLLECTIVES = {
    "all_reduce": (lambda p: 2 * (p - 1), lambda p: 2 * (p - 1) / p),
    "all_gather": (lambda p: p - 1, lambda p: (p - 1) / p),
    "reduce_scatter": (lambda p: p - 1, lambda p: (p - 1) / p),
    "all_to_all": (lambda p: p - 1, lambda p: (p - 1) / p),
    "broadcast": (lambda p: p - 1, lambda p: 1.0),
    "reduce": (lambda p: p - 1, lambda p: 1.0),
    "gather": (lambda p: p - 1, lambda p: (p - 1) / p),
    "scatter": (lambda p: p - 1, lambda p: (p - 1) / p),
    "send": (lambda p: 1, lambda p: 1.0),
    "recv": (lambda p: 1, lambda p: 1.0),
    "barrier": (lambda p: 2 * (p - 1), lambda p: 0.0),
}
COLLECTIVES = tuple(_COLLECTIVES)
LINKS = ("h2d", "d2h", "peer")


# LITERALINCLUDE START: TIMING COST
@dataclass(frozen=True)
class Cost:
    """What one launch does, for the timing model (the runtime never looks inside a kernel).

    ``kind``: one of :data:`KINDS`. ``flops``: floating-point operations (0 when no formula is
    known: the launch is then priced by its bytes). ``bytes``: memory traffic, reads plus writes.
    ``dtype``: the type it computes in (``"bfloat16"``, ``"tfloat32"``, ...). ``shape``: ``(M, N, K,
    batch)`` of a matrix product (for wave quantization). ``link``: for copies that leave device
    memory, ``"h2d"``, ``"d2h"`` or ``"peer"`` (``pinned`` says whether the host side is pinned).
    ``collective`` and ``ranks``: which collective, over how many ranks (``bytes`` is the buffer).
    ``formula``: whether ``flops`` came from a formula (the report lists the operators without one).
    ``parts``: for a graph replay, its kernels' costs (one launch latency for them all).
    """

    kind: str
    flops: float = 0.0
    bytes: float = 0.0
    dtype: str = "float32"
    shape: tuple | None = None
    link: str | None = None
    pinned: bool = True
    collective: str | None = None
    ranks: int = 1
    formula: bool = False
    parts: tuple = ()  # a graph replay: the costs of its kernels, run as one launch

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Cost kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.flops < 0 or self.bytes < 0:
            raise ValueError(f"Cost FLOPs and bytes must be >= 0, got {self.flops} and {self.bytes}")
        if self.link is not None and self.link not in LINKS:
            raise ValueError(f"Cost link {self.link!r} is not one of {', '.join(LINKS)}")
        if self.collective is not None and self.collective not in _COLLECTIVES:
            raise ValueError(f"collective {self.collective!r} is not one of {', '.join(COLLECTIVES)}")


FREE = Cost("copy")  # a marker on a stream (event record, stream wait): takes no device time
# LITERALINCLUDE END: TIMING COST


@dataclass(frozen=True)
class Prediction:
    """A launch's predicted duration (seconds) and what bounds it: ``"compute"``, ``"memory"``,
    ``"latency"`` (the launch overhead is the largest part), ``"link"`` (host link or interconnect)."""

    seconds: float
    bound: str
    compute_s: float = 0.0
    memory_s: float = 0.0
    peak_flops: float = 0.0  # the peak its FLOPs were priced against (FLOP/s), for achieved fractions
    peak_bytes: float = 0.0  # likewise for its bytes (B/s)


# LITERALINCLUDE START: TIMING PREDICT
def predict(cost: Cost, profile) -> Prediction:
    """Predicted device duration of a launch of ``cost`` on ``profile`` (see the module docstring)."""
    if cost is FREE:
        return Prediction(0.0, "latency")
    eff = profile.efficiency
    latency = profile.launch_latency_us * 1e-6
    if cost.parts:  # a graph replay: its kernels back to back, behind one launch
        parts = [predict(part, profile) for part in cost.parts]
        work = [max(p.seconds - latency, 0.0) for p in parts]
        total = sum(work)
        main = parts[work.index(max(work))]
        return Prediction(latency + total, "latency" if latency >= total else main.bound,
                          sum(p.compute_s for p in parts), sum(p.memory_s for p in parts),
                          max(p.peak_flops for p in parts), max(p.peak_bytes for p in parts))
    if cost.collective is not None:
        steps, share = _COLLECTIVES[cost.collective]
        p = max(cost.ranks, 1)
        link = profile.interconnect_gbs * 1e9
        if p == 1:
            return Prediction(latency, "latency", peak_bytes=link)
        wire = share(p) * cost.bytes / (link * eff["interconnect"])
        seconds = latency + steps(p) * profile.collective_latency_us * 1e-6 + wire
        return Prediction(seconds, "link" if wire > seconds - wire else "latency", 0.0, wire, 0.0, link)
    if cost.link is not None:
        if cost.link == "peer":
            peak, share = profile.interconnect_gbs * 1e9, eff["interconnect"]
        else:
            peak = (profile.host_pinned_gbs if cost.pinned else profile.host_pageable_gbs) * 1e9
            share = eff["host_link"]
        wire = cost.bytes / (peak * share)
        return Prediction(latency + wire, "link" if wire > latency else "latency", 0.0, wire, 0.0, peak)
    matrix = cost.kind in ("matrix", "conv")
    peak = profile.peak_flops(cost.dtype, matrix=matrix)
    flops_rate = peak * eff[cost.kind] if matrix else peak
    compute = cost.flops / flops_rate if cost.flops else 0.0
    if cost.kind == "matrix" and cost.shape is not None and cost.flops:
        compute = _waves(cost.shape, profile.compute_units) * compute
    memory_eff = eff["elementwise"] if matrix else eff[cost.kind]
    bytes_rate = profile.memory_bandwidth_gbs * 1e9 * memory_eff
    memory = cost.bytes / bytes_rate
    work = max(compute, memory)
    bound = "latency" if latency >= work else ("compute" if compute >= memory else "memory")
    return Prediction(latency + work, bound, compute, memory, peak, profile.memory_bandwidth_gbs * 1e9)


def _waves(shape: tuple, units: int) -> float:
    """How much longer than its FLOPs alone a matrix product takes for its tiles and waves: the output
    is cut in MATRIX_TILE squares (partial tiles cost whole ones) and each wave runs one tile per
    compute unit, so the time is ``waves x one tile's time`` instead of ``FLOPs / peak``."""
    m, n, _, batch = shape
    tiles = math.ceil(m / MATRIX_TILE) * math.ceil(n / MATRIX_TILE) * max(batch, 1)
    waves = math.ceil(tiles / units)
    ideal = m * n * max(batch, 1) / (MATRIX_TILE * MATRIX_TILE * units)
    return waves / ideal if ideal else 1.0
# LITERALINCLUDE END: TIMING PREDICT
