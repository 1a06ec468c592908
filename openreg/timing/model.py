"""The cost of one launch and the roofline that turns it into a predicted device duration.

A launch's :class:`Cost` says what it does (its kind, FLOPs, bytes moved, the data type it computes
in); :func:`predict` prices it on a :class:`~.profiles.DeviceProfile`:

* kernels: ``kernel floor + max(FLOPs / achievable compute, bytes / achievable bandwidth)``, where
  "achievable" is the profile's peak times the efficiency of the kernel's class (matrix products,
  convolutions, attention, elementwise, reductions, normalizations, sorts, copies) and the bandwidth
  is the L2 cache's when the kernel's bytes fit in it (a benchmark loop's working set stays there), the
  memory's otherwise. The floor is the shortest a kernel runs (a small grid's ramp-up and tail).
  Matrix products and convolutions with known sizes also pay for wave quantization: the output is cut
  in ``MATRIX_TILE``-square tiles, one per compute unit at a time;
* host copies: the host link's bandwidth (pinned or pageable);
* peer copies and collectives: an alpha-beta model over the profile's interconnect (``steps``
  latencies plus the bytes each rank sends, over the link's achievable bandwidth).

The duration is the device's busy time; the gap between back-to-back kernels (``launch_latency_us``
less the floor) and the host's cost of issuing each launch are the clock's (:mod:`.clock`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("matrix", "conv", "attention", "attention_backward", "elementwise", "reduction", "normalization", "sort",
         "copy", "collective")
SPLIT_K_MIN = 256  # the least K a split of a split-K product keeps (an assumption, not fitted)
ATTENTION_TILE = 128  # keys per block of a fused attention's inner loop (FlashAttention's, cuDNN's)
MATRIX_TILE = 128  # output tile edge of a matrix-product kernel (cuBLAS's common 128x128 tiles)
MATRIX_KINDS = ("matrix", "conv", "attention", "attention_backward")  # priced against the matrix units
HOST = ("op", "library", "autograd", "none")  # what issuing a launch costs the host: see HOST_US

# LITERALINCLUDE START: TIMING DEFAULTS
# The model's fitted parameters: each was solved from ONE figure, published (data/measurements.json's
# "fit" rows) or measured on an H100 (data/h100-calibration.json's workloads named here); python -m
# openreg.timing.validate --fit recomputes them. Every other figure is held out. A profile file may
# override any of them (its "efficiency", "host_us" and "scratch" tables, "launch_latency_us", "kernel_floor_us",
# and its interconnect's "latency_us"); python -m torch_openreg.timing.calibrate fits them for a device.
EFFICIENCY = {
    "matrix": 0.8465,  # achieved / peak matrix-unit FLOPS (H100 BF16 best-shape matmul, 794.5 TFLOPS)
    "conv": 0.3255,  # convolutions as implicit matrix products (H100 workload conv3x3-f32-b16-c128-28)
    "attention": 0.6854,  # fused attention's products (FA3 paper: cuDNN fwd d128 s2k, 617 TFLOPS)
    "attention_backward": 0.751,  # its backward's five products (FA3 paper: cuDNN bwd d128 s2k, 465 TFLOPS)
    "softmax": 0.4674,  # attention's per-score softmax / special-function rate (FA3 paper: cuDNN, d64, 335 TFLOPS)
    "attention_fill": 1.542,  # key blocks' worth a query tile's prologue/epilogue costs (H100 workload sdpa-...-s512)
    "attention_backward_fill": 3.376,  # the same in the backward (FA3 paper: cuDNN bwd d128 s512, 305 TFLOPS)
    "elementwise": 0.8902,  # achieved / peak memory bandwidth (H100 STREAM triad, 2.97 TB/s)
    "reduction": 0.9555,  # (H100 STREAM dot, 3.18 TB/s)
    "normalization": 0.547,  # softmax, norms: more passes than bytes counted (H100 workload softmax-f32-4096x8192)
    "sort": 0.9555,  # radix sorts and selections, per pass (no figure: the reduction value)
    "multi_tensor": 0.7159,  # _foreach_ and fused optimizer kernels (H100 workload mlp-step-bf16-b512-w1024)
    "copy": 0.8708,  # device-to-device copies (H100 STREAM copy, 2.90 TB/s)
    "l2": 3.013,  # L2-resident bandwidth / memory bandwidth (H100 workload add-f32-1M)
    "host_link": 0.797,  # achieved / per-direction host link bandwidth (H100 host-to-device, 51 GB/s)
    "interconnect": 1.065,  # collective bus bandwidth / per-direction link bandwidth (H100 NCCL, 478.9 GB/s)
}
LAUNCH_LATENCY_US = 2.433  # per kernel, back-to-back launches: floor + gap (Hopper, 2433 ns)
MEMORY_LATENCY_US = 0.371  # a load that misses L2 (D. Ernst, gpu-benches gpu-latency, H100: 650 cycles at 1755 MHz)
L2_LATENCY_US = 0.151  # a load that hits L2 (same: 265 cycles)
MATRIX_OVERHEAD_US = 1.956  # a matrix product's pipeline fill and last epilogue (H100 workload mm-bf16-1024)
KERNEL_FLOOR_US = 1.1  # shortest kernel duration (H100 workload tiny-adds-x100: 110.1 us / 100 kernels)
COLLECTIVE_LATENCY_US = 2.552  # alpha: per step of a collective (H100 NCCL all-reduce of 1 MB, 43.7 GB/s)
HOST_US = {  # the host's cost of issuing one launch (PyTorch eager: Python, dispatch, the driver's launch)
    "op": 14.67,  # an operator (H100 host: workload tiny-adds-x100, 1466.7 us / 100 operators)
    "library": 56.4,  # a library call that selects and plans its kernel: attention (sdpa workload)
    "autograd": 46.04,  # an operator autograd records or replays (training: MLP training-step workload)
    "python": 3.549,  # per call into PyTorch's Python code (nn.Module, optim): conv3x3 workload
}
SCRATCH = {  # device scratch a GPU library allocates during a launch, x a basis in bytes
    "conv_workspace": 2.092,  # cuDNN's workspace, x the output (H100 workload conv3x3-f32-b16-c128-28)
    "attention_backward": 0.35,  # x the query as float32: FlashAttention-2's dq accumulator (its design; no figure)
}
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
    ``parts``: for a graph replay, its kernels' costs (one launch for them all), or the stages of a
    fused operator (``_transformer_encoder_layer_fwd``: its products, attention and normalizations).
    ``host``: what issuing it costs the host, one of :data:`HOST` (``"none"``: the runtime's own
    markers); ``tensors``: the tensors of a multi-tensor kernel (its class: ``multi_tensor``).
    ``scratch``: bytes a GPU library's scratch scales with (a convolution's output), for the memory peak.
    ``grid``: for a kernel whose grid may not fill the device (a multi-tensor kernel: one block per chunk),
    ``(blocks, rounds, resident)``: each block waits for memory ``rounds`` times in turn, and ``resident``
    blocks fit on a compute unit at once; the kernel takes at least its waves x rounds memory latencies.
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
    host: str = "op"
    tensors: int = 0
    scratch: float = 0.0
    grid: tuple | None = None  # (blocks, dependent memory round trips per block, blocks resident per unit)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Cost kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.flops < 0 or self.bytes < 0:
            raise ValueError(f"Cost FLOPs and bytes must be >= 0, got {self.flops} and {self.bytes}")
        if self.link is not None and self.link not in LINKS:
            raise ValueError(f"Cost link {self.link!r} is not one of {', '.join(LINKS)}")
        if self.collective is not None and self.collective not in _COLLECTIVES:
            raise ValueError(f"collective {self.collective!r} is not one of {', '.join(COLLECTIVES)}")
        if self.host not in HOST:
            raise ValueError(f"Cost host {self.host!r} is not one of {', '.join(HOST)}")


FREE = Cost("copy", host="none")  # a marker on a stream (event record, stream wait): takes no device time
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
def predict(cost: Cost, profile, cached: float | None = None) -> Prediction:
    """Predicted device duration of a launch of ``cost`` on ``profile`` (see the module docstring).
    ``cached``: the share of its bytes the L2 cache holds (the clock's LRU of recent launches' buffers);
    None: all of them if they fit in it (a benchmark loop's working set), none otherwise."""
    if cost is FREE:
        return Prediction(0.0, "latency")
    eff = profile.efficiency
    floor = profile.kernel_floor_us * 1e-6
    if cost.parts:  # a graph replay or a fused operator: its kernels back to back, behind one launch
        parts = [predict(part, profile, cached) for part in cost.parts]
        main = max(parts, key=lambda p: p.seconds)
        return Prediction(sum(p.seconds for p in parts), main.bound, sum(p.compute_s for p in parts),
                          sum(p.memory_s for p in parts), max(p.peak_flops for p in parts),
                          max(p.peak_bytes for p in parts))
    if cost.collective is not None:
        steps, share = _COLLECTIVES[cost.collective]
        p = max(cost.ranks, 1)
        link = profile.interconnect_gbs * 1e9
        latency = profile.launch_latency_us * 1e-6
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
        return Prediction(floor + wire, "link" if wire > floor else "latency", 0.0, wire, 0.0, peak)
    matrix = cost.kind in MATRIX_KINDS
    peak = profile.peak_flops(cost.dtype, matrix=matrix)
    flops_rate = peak * eff[cost.kind] if matrix else peak
    compute = cost.flops / flops_rate if cost.flops else 0.0
    if cost.kind in ("matrix", "conv") and cost.flops:
        if cost.shape is not None:
            compute = _waves(cost.shape, profile.compute_units) * compute
        compute += profile.matrix_overhead_us * 1e-6
    if cost.kind in ("attention", "attention_backward") and cost.shape is not None:
        # the forward's softmax overlaps its products (Hopper kernels pipeline them: the slower bounds it);
        # the backward recomputes it between its five products, which wait for it
        softmax = _softmax(cost.shape, profile)
        compute = compute + softmax if cost.kind == "attention_backward" else max(compute, softmax)
        # each query tile's prologue and epilogue (loading Q, writing O and its statistics; the backward's
        # dQ, dK, dV) cost ``fill`` of its loop's key-block iterations: short sequences pay more of it
        fill = eff["attention_backward_fill" if cost.kind == "attention_backward" else "attention_fill"]
        compute *= 1.0 + fill / max(math.ceil(cost.shape[2] / ATTENTION_TILE), 1)
    memory_eff = eff["elementwise"] if matrix else eff["multi_tensor"] if cost.tensors else eff[cost.kind]
    dram = profile.memory_bandwidth_gbs * 1e9
    if cached is None:
        cached = 1.0 if cost.bytes <= profile.l2_cache_mib * (1 << 20) else 0.0
    memory = cost.bytes / (dram * memory_eff) * (1.0 - cached + cached / eff["l2"])
    if cost.grid is not None:  # a small grid cannot keep enough loads in flight: its latency bounds it
        blocks, rounds, resident = cost.grid
        waves = math.ceil(blocks / max(profile.compute_units * resident, 1))
        latency = (1.0 - cached) * profile.memory_latency_us + cached * profile.l2_latency_us
        memory = max(memory, waves * rounds * latency * 1e-6)
    work = max(compute, memory)
    bound = "latency" if floor >= work else ("compute" if compute >= memory else "memory")
    return Prediction(floor + work, bound, compute, memory, peak, dram)


def _softmax(shape: tuple, profile) -> float:
    """Seconds of a fused attention's softmax, which the matrix units cannot do: one exponential (and its
    row bookkeeping) per score, ``batch x heads x queries x keys`` for ``shape = (batch x heads, queries,
    keys, head_dim)``, on the special-function units (FlashAttention-3 paper: an H100 SXM5 has 989 TFLOPS
    of BF16 products but 3.9 TFLOPS of exponentials). It bounds the kernel when the head is narrow."""
    scores = shape[0] * shape[1] * shape[2]
    return scores / (profile.special_tops * 1e12 * profile.efficiency["softmax"])


def _waves(shape: tuple, units: int) -> float:
    """How much longer than its FLOPs alone a matrix product takes for its tiles and waves: the output
    is cut in MATRIX_TILE squares (half as wide along a side of at most MATRIX_TILE / 2, as the
    libraries pick a narrower tile there; partial tiles cost whole ones) and each wave runs one tile per
    compute unit, so the time is ``waves x one tile's time`` instead of ``FLOPs / peak``. A product with
    fewer tiles than units splits K over the idle units (cuBLAS's split-K and stream-K), as long as each
    split keeps ``SPLIT_K_MIN`` of K (an assumption of the model: a few stages of its K pipeline)."""
    m, n, k, batch = shape
    tm, tn = (MATRIX_TILE // 2 if x <= MATRIX_TILE // 2 else MATRIX_TILE for x in (m, n))
    tiles = math.ceil(m / tm) * math.ceil(n / tn) * max(batch, 1)
    splits = max(1, min(units // max(tiles, 1), k // SPLIT_K_MIN)) if tiles < units else 1
    waves = math.ceil(tiles * splits / units) / splits * (tm * tn) / (MATRIX_TILE * MATRIX_TILE)
    ideal = m * n * max(batch, 1) / (MATRIX_TILE * MATRIX_TILE * units)
    return waves / ideal if ideal else 1.0
# LITERALINCLUDE END: TIMING PREDICT
