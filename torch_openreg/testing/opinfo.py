"""Conformance runner: PyTorch's operator database (OpInfo ``op_db``) on openreg, compared with the CPU.

For every operator and dtype, every sample input (or the first ``limit``) is made on openreg (as
PyTorch's own device tests make them), copied to the CPU, and the operator runs on both. Outputs are compared with
``torch.testing.assert_close``; in float32, for operators that support autograd, the gradients of
the sum of the outputs with respect to the inputs are compared too. After each sample the device is
synchronized, so an asynchronous kernel error is charged to the operator that caused it.

Usage (one command regenerates ``docs/conformance.md``)::

    python -m torch_openreg.testing.opinfo --dtypes float32,bfloat16,int64 --layouts all --limit 3 --repeat 3 \
        --output docs/conformance.md

``--layouts`` adds the sparse layouts an OpInfo has samples for (``OpInfo.sample_inputs_sparse``):
``--layouts all`` is every layout of ``LAYOUTS``.

The command line runs the operators in worker subprocesses: an operator that crashes the interpreter
or hangs is recorded as ``error`` and the run goes on with the next one.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
import unittest
from collections.abc import Iterable
from typing import Any

import torch

DEVICE = "openreg"

# LITERALINCLUDE START: EXCEPTIONS
# Operators whose openreg results are not compared value for value, each with its reason.
# Random operators: openreg generators are CPU (MT19937) generators, so most random ops draw the same
# numbers as the CPU for the same seed and are compared exactly; these draw differently (a different
# number or order of draws), so only shape, dtype and device are compared.
STATISTICAL = {
    "nn.functional.dropout": "PyTorch sends dropout on PrivateUse1 devices to native_dropout, on the CPU to "
    "bernoulli_: different draws",
    "nn.functional.scaled_dot_product_attention": "samples with dropout_p > 0 only: openreg's overrideable "
    "kernel draws the mask from the openreg generator, the CPU's flash kernel its own way",
}
# Operators compared with a looser tolerance, with the reason: (atol, rtol) for floating outputs.
TOLERANCE = {
    "nn.functional.scaled_dot_product_attention": (
        {torch.float32: (1e-4, 1e-4), torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3)},
        "the CPU computes attention with its flash kernel, openreg's overrideable kernel with the math path: "
        "rounding-level differences (about 1.5e-5 in float32; in float16/bfloat16 both compute in float32 "
        "but round at different points)",
    ),
}
# Operators in STATISTICAL only for the samples this says are random.
RANDOM_SAMPLE = {"nn.functional.scaled_dot_product_attention": lambda s: s.kwargs.get("dropout_p", 0) > 0}
# Operators that return uninitialized memory: only shape, dtype, strides and device are compared.
UNINITIALIZED = {
    "empty": "uninitialized memory", "empty_like": "uninitialized memory",
    "empty_strided": "uninitialized memory", "empty_permuted": "uninitialized memory",
    "new_empty": "uninitialized memory", "new_empty_strided": "uninitialized memory",
}
# Operators whose algorithm PyTorch chooses by device type: the CPU reference is made to use the
# choice PyTorch makes for openreg, so that the same computation is compared.
SAME_ALGORITHM = {
    "nn.functional.linear_cross_entropy": "the chunked path's accumulation policy 'auto' is 'accurate' "
    "(float32) on the CPU and 'compact' on other devices (torch.nn.modules.linear_cross_entropy_options."
    "_AUTO_DEFAULTS); the CPU reference runs with acc_policy='compact'",
}
# Operators not run at all.
SKIP: dict[str, str] = {}
# LITERALINCLUDE END: EXCEPTIONS

# LITERALINCLUDE START: LAYOUTS
# The layouts a sample can come in, with the OpInfo flag that says the operator has samples in it
# (``OpInfo.sample_inputs_sparse(layout, ...)``); strided samples are ``OpInfo.sample_inputs``.
LAYOUTS = {
    "strided": (torch.strided, None),
    "sparse_coo": (torch.sparse_coo, "supports_sparse"),
    "sparse_csr": (torch.sparse_csr, "supports_sparse_csr"),
    "sparse_csc": (torch.sparse_csc, "supports_sparse_csc"),
    "sparse_bsr": (torch.sparse_bsr, "supports_sparse_bsr"),
    "sparse_bsc": (torch.sparse_bsc, "supports_sparse_bsc"),
}
# LITERALINCLUDE END: LAYOUTS

PASS, FAIL, ERROR, SKIPPED = "pass", "fail", "error", "skip"


@dataclasses.dataclass
class Result:
    """The outcome of one operator in one dtype and sample layout."""

    op: str
    dtype: str
    status: str
    passed: int = 0
    samples: int = 0
    message: str = ""
    seconds: float = 0.0
    layout: str = "strided"

    @property
    def offered(self) -> bool:
        """False for a sparse layout the operator has no samples in: left out of the report."""
        return self.layout == "strided" or not (self.status == SKIPPED and self.message.startswith("no "))

    @property
    def kind(self) -> str:
        """The dtype, with the samples' layout when it is not strided: the report's rows."""
        return self.dtype if self.layout == "strided" else f"{self.dtype} {self.layout}"


class SampleTimeout(Exception):
    pass


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    return f"{type(exc).__name__}: {line}"[:300]


def op_name(op) -> str:
    return f"{op.name}.{op.variant_test_name}" if op.variant_test_name else op.name


def _map(value: Any, fn) -> Any:
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (list, tuple)) and not hasattr(value, "_fields"):
        return type(value)(_map(v, fn) for v in value)
    if isinstance(value, tuple):  # named tuples (torch.return_types)
        return type(value)(*(_map(v, fn) for v in value))
    if isinstance(value, dict):
        return {k: _map(v, fn) for k, v in value.items()}
    return value


def _leaves(value: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    _map(value, lambda t: found.append(t) or t)
    return found


def _to_cpu(t: torch.Tensor) -> torch.Tensor:
    """The CPU copy of an openreg tensor: its whole storage, same offset and strides (operators such as
    ``as_strided`` read outside the view). CPU tensors in a sample stay as they are (e.g. CPU indices)."""
    if t.device.type != DEVICE:
        return t
    if t.layout != torch.strided:  # sparse: its indices and values, copied as they are
        return t.detach().cpu().requires_grad_(t.requires_grad)
    storage = t.untyped_storage().cpu()
    copy = torch.empty(0, dtype=t.dtype).set_(storage, t.storage_offset(), t.size(), t.stride())
    if t.is_conj():
        copy = copy.conj()
    return copy.requires_grad_(t.requires_grad)


def _cpu_device(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type == DEVICE:
        return torch.device("cpu")
    if isinstance(value, str) and value.split(":")[0] == DEVICE:
        return "cpu"
    return value


def _cpu_sample(sample, name: str = ""):
    """The sample with every openreg tensor copied to the CPU and every openreg device made ``cpu``."""
    copy = sample.transform(lambda t: t)  # same structure, same objects
    copy.input = _map(sample.input, _to_cpu)
    copy.args = tuple(_cpu_device(_map(a, _to_cpu)) for a in sample.args)
    copy.kwargs = {k: _cpu_device(_map(v, _to_cpu)) for k, v in sample.kwargs.items()}
    options = copy.kwargs.get("options")
    if name in SAME_ALGORITHM and getattr(options, "acc_policy", None) == "auto":
        copy.kwargs["options"] = dataclasses.replace(options, acc_policy="compact")
    return copy


@contextlib.contextmanager
def _deadline(seconds: float):
    """Raise :class:`SampleTimeout` in the main thread when a sample runs longer than ``seconds``."""

    def expire(signum, frame):
        raise SampleTimeout(f"sample took longer than {seconds:g} s")

    if seconds <= 0 or not hasattr(signal, "setitimer"):
        yield
        return
    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _run(op, sample, seed: int) -> Any:
    torch.manual_seed(seed)  # seeds the CPU and every openreg generator alike
    return op(sample.input, *sample.args, **sample.kwargs)


def _grad_sum(outputs: Any, process) -> torch.Tensor | None:
    """The sum of every differentiable output (real and imaginary parts for complex ones)."""
    outputs = process(outputs)
    total = None
    for o in _leaves(outputs):
        if not o.requires_grad:
            continue
        s = torch.view_as_real(o.resolve_conj()).sum() if o.is_complex() else o.sum()
        total = s if total is None else total + s
    return total


def _statistical(op, sample=None) -> bool:
    if op.name in RANDOM_SAMPLE:
        return sample is not None and RANDOM_SAMPLE[op.name](sample)
    return op_name(op) in STATISTICAL or op.name in STATISTICAL


def _wanted_device(sample) -> str:
    """Where the sample's outputs belong: the device it names (``zeros_like(x, device="cpu")``), else
    openreg if it has an openreg tensor, else the default device, the CPU (a few factory samples,
    ``arange(2)``, name no device at all)."""
    if sample is None:
        return DEVICE
    requested = sample.kwargs.get("device")
    if requested is not None:
        return torch.device(requested).type
    tensors = _leaves([sample.input, list(sample.args), dict(sample.kwargs)])
    return DEVICE if any(t.device.type == DEVICE for t in tensors) else "cpu"


def _compare(op, got: Any, expected: Any, sample=None) -> None:
    wanted = _wanted_device(sample)
    for g, e in zip(_leaves(got), _leaves(expected)):
        if e.device.type == "cpu" and g.device.type != wanted:
            raise AssertionError(f"output on {g.device}, expected on {wanted}")
    got_cpu = _map(got, lambda t: t.detach().cpu())
    expected = _map(expected, lambda t: t.detach())
    if op.name in UNINITIALIZED or _statistical(op, sample):
        got_l, exp_l = _leaves(got_cpu), _leaves(expected)
        if len(got_l) != len(exp_l):
            raise AssertionError(f"{len(got_l)} outputs, expected {len(exp_l)}")
        for g, e in zip(got_l, exp_l):
            if (g.shape, g.dtype) != (e.shape, e.dtype):
                raise AssertionError(f"output {g.shape}/{g.dtype}, expected {e.shape}/{e.dtype}")
        return
    torch.testing.assert_close(got_cpu, expected, equal_nan=True, check_device=False, **_tolerance(op, expected))


def _tolerance(op, expected: Any) -> dict:
    """``atol``/``rtol`` for ``assert_close``: the defaults, or the TOLERANCE entry for the output's dtype."""
    entry = TOLERANCE.get(op.name)
    leaves = _leaves(expected)
    if entry is None or not leaves or leaves[0].dtype not in entry[0]:
        return {}
    atol, rtol = entry[0][leaves[0].dtype]
    return {"atol": atol, "rtol": rtol}


def _grads(loss: torch.Tensor | None, sample) -> tuple | None:
    inputs = [t for t in _leaves((sample.input, sample.args, sample.kwargs)) if t.requires_grad]
    if loss is None or not inputs:
        return None
    return torch.autograd.grad(loss, inputs, allow_unused=True)


def run_sample(op, sample, dtype: torch.dtype, check_grad: bool, seed: int = 0, repeat: int = 1) -> tuple[str, str]:
    """Run one sample (made on openreg) on openreg and on a CPU copy; returns (status, message). ``repeat``: the
    openreg side runs that many times, each compared (the later calls of a call shape run its plan, and from
    the third on a clean plan launches from the bridge); not for operators that write their inputs."""
    try:
        cpu_sample = _cpu_sample(sample, op.name)  # before anything runs: in-place operators change their inputs
        expected = _run(op, cpu_sample, seed)
        expected_grads = None
        if check_grad:
            expected_grads = _grads(_grad_sum(expected, sample.output_process_fn_grad), cpu_sample)
    except Exception as exc:  # noqa: BLE001 - the CPU reference itself fails: nothing to compare with
        return SKIPPED, "CPU reference fails: " + first_line(exc)
    try:
        got = _run(op, sample, seed)
        torch.openreg.synchronize()
        _compare(op, got, expected, sample)
        for call in range(2, repeat + 1 if not _writes_inputs(op) else 0):
            again = _run(op, sample, seed)
            torch.openreg.synchronize()
            try:
                _compare(op, again, expected, sample)
            except AssertionError as exc:
                raise AssertionError(f"call {call} of the same call shape: {first_line(exc)}") from None
        if expected_grads is not None and not _statistical(op, sample):  # random draws: values differ, so do gradients
            grads = _grads(_grad_sum(got, sample.output_process_fn_grad), sample)
            if grads is None:
                raise AssertionError("no differentiable output on openreg")
            torch.openreg.synchronize()
            for i, (g, e) in enumerate(zip(grads, expected_grads)):
                if (g is None) != (e is None):
                    raise AssertionError(f"gradient {i}: {g is None=} but CPU {e is None=}")
                if g is not None:
                    try:
                        torch.testing.assert_close(g.cpu(), e, equal_nan=True, **_tolerance(op, e))
                    except AssertionError as exc:
                        raise AssertionError(f"gradient {i}: {first_line(exc)}") from None
    except AssertionError as exc:
        return FAIL, first_line(exc)
    except Exception as exc:  # noqa: BLE001 - any error on openreg is the operator's error
        with contextlib.suppress(Exception):
            torch.openreg.synchronize()  # drain: the next operator must start clean
        return ERROR, first_line(exc)
    return PASS, ""


def _writes_inputs(op) -> bool:
    """Whether the OpInfo's own call writes its inputs (an in-place operator): a repeat would not compute the same."""
    return op.name.endswith("_") or getattr(getattr(op, "op", None), "__name__", "").endswith("_")


# LITERALINCLUDE START: RUN OP
def run_op(op, dtype: torch.dtype, limit: int | None = None, timeout: float = 30.0,
           layout: str = "strided", repeat: int = 1) -> Result:
    """Every sample (or the first ``limit``) of one OpInfo in one dtype and layout, openreg against the CPU."""
    name, dname = op_name(op), str(dtype).removeprefix("torch.")
    start = time.perf_counter()
    torch_layout, flag = LAYOUTS[layout]
    if flag is not None and not getattr(op, flag, False):
        return Result(name, dname, SKIPPED, message=f"no {layout} samples", layout=layout)
    if name in SKIP or op.name in SKIP:
        return Result(name, dname, SKIPPED, message=SKIP.get(name) or SKIP[op.name], layout=layout)
    if dtype not in op.supported_dtypes("cpu"):
        return Result(name, dname, SKIPPED, message="dtype not supported on the CPU", layout=layout)
    check_grad = dtype == torch.float32 and op.supports_autograd
    result = Result(name, dname, PASS, layout=layout)
    try:
        with _deadline(timeout):
            if flag is None:
                samples = list(op.sample_inputs(DEVICE, dtype, requires_grad=check_grad))
            else:
                samples = list(op.sample_inputs_sparse(torch_layout, DEVICE, dtype, requires_grad=check_grad))
    except (NotImplementedError, unittest.SkipTest) as exc:  # the OpInfo claims the layout but has no samples in it
        return Result(name, dname, SKIPPED, message=f"no {layout} samples: " + first_line(exc), layout=layout)
    except Exception as exc:  # noqa: BLE001 - making the inputs on openreg is part of the test
        with contextlib.suppress(Exception):
            torch.openreg.synchronize()
        return Result(name, dname, ERROR, message="making sample inputs on openreg fails: " + first_line(exc),
                      layout=layout)
    skipped = []
    for sample in samples[:limit] if limit else samples:
        try:
            with _deadline(timeout):
                status, message = run_sample(op, sample, dtype, check_grad, repeat=repeat)
        except SampleTimeout as exc:
            status, message = ERROR, first_line(exc)
            with contextlib.suppress(Exception):
                torch.openreg.synchronize()
        if status == SKIPPED:
            skipped.append(message)
            continue
        result.samples += 1
        if status == PASS:
            result.passed += 1
        elif result.status == PASS or (result.status == FAIL and status == ERROR):
            result.status, result.message = status, message  # errors rank above mismatches
    if result.samples == 0:
        result.status = SKIPPED
        result.message = skipped[0] if skipped else "no sample inputs"
    result.seconds = time.perf_counter() - start
    return result
# LITERALINCLUDE END: RUN OP


def select_ops(names: Iterable[str] | None = None, exact: bool = False) -> list:
    """OpInfos of ``op_db`` by name (``name`` matches every variant, ``name.variant`` one of them;
    with ``exact``, ``name`` matches only the operator without a variant name)."""
    from torch.testing._internal.common_methods_invocations import op_db

    if not names:
        return list(op_db)
    wanted = set(names)
    chosen = [op for op in op_db if op_name(op) in wanted or (not exact and op.name in wanted)]
    missing = wanted - {op.name for op in chosen} - {op_name(op) for op in chosen}
    if missing:
        raise ValueError(f"not in op_db: {sorted(missing)}")
    return chosen


def run(ops: Iterable[str] | None = None, dtypes: Iterable[torch.dtype] = (torch.float32,),
        limit: int | None = None, timeout: float = 30.0, progress=None,
        layouts: Iterable[str] = ("strided",), repeat: int = 1) -> list[Result]:
    """Run in this process (no crash isolation); ``progress(result)`` is called after each operator."""
    results = []
    for op in select_ops(ops):
        for dtype in dtypes:
            for layout in layouts:
                r = run_op(op, dtype, limit, timeout, layout, repeat)
                results.append(r)
                if progress:
                    progress(r)
    return results


# ---------------------------------------------------------------- the report


def totals(results: list[Result]) -> dict[str, collections.Counter]:
    by_dtype: dict[str, collections.Counter] = {}
    for r in results:
        by_dtype.setdefault(r.kind, collections.Counter())[r.status] += 1
    return by_dtype


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'").replace("<", "&lt;").replace("*", "\\*").replace("_", "\\_")


def write_report(results: list[Result], path: str, command: str, limit: int | None, seconds: float,
                 repeat: int = 1) -> None:
    results = [r for r in results if r.offered]
    counts = totals(results)
    lines = [
        "(conformance)=",
        "# Conformance report: PyTorch's OpInfo database on openreg",
        "",
        f"Generated by `torch_openreg.testing.opinfo`; do not edit. Regenerate with `{command}`.",
        "",
        f"Each operator ran {'its first ' + str(limit) if limit else 'all its'} sample inputs per dtype on openreg "
        + (f"({repeat} times each, every call compared: the later calls of a call shape run its plan) " if repeat > 1
           else "")
        + "and on the CPU; outputs (and, in float32, gradients) compared with `torch.testing.assert_close`. "
        "`pass`: every compared sample matches; `fail`: a mismatch; `error`: openreg raised (or crashed, or hung) "
        "where the CPU did not; `skip`: nothing to compare (the dtype is not supported on the CPU, or the CPU "
        f"reference itself fails for every sample, or the operator is on the runner's exception list). "
        f"The run took {seconds / 60:.1f} minutes. "
        "{doc}`testing` explains the runner and its exceptions.",
        "",
        "## Totals",
        "",
        "| dtype | pass | fail | error | skip | total |",
        "|---|---|---|---|---|---|",
    ]
    for dtype, c in counts.items():
        lines.append(f"| {dtype} | {c[PASS]} | {c[FAIL]} | {c[ERROR]} | {c[SKIPPED]} | {sum(c.values())} |")
    problems = [r for r in results if r.status in (FAIL, ERROR)]
    lines += ["", "## Failures and errors", ""]
    if problems:
        lines += ["| operator | dtype | status | samples passed | first error |", "|---|---|---|---|---|"]
        for r in problems:
            lines.append(f"| `{r.op}` | {r.kind} | {r.status} | {r.passed}/{r.samples} | {_escape(r.message)} |")
    else:
        lines.append("None.")
    lines += ["", "## Every operator", "",
              "| operator | dtype | status | samples passed | note |", "|---|---|---|---|---|"]
    for r in results:
        note = _escape(r.message) if r.status != PASS else ""
        lines.append(f"| `{r.op}` | {r.kind} | {r.status} | {r.passed}/{r.samples} | {note} |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


# ---------------------------------------------------------------- command line, crash isolation


def _worker(args) -> None:
    """Run the operators named on stdin's argument list, printing one JSON line per result."""
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    for op in select_ops(args.ops.split(","), exact=True):
        print(json.dumps({"start": op_name(op)}), flush=True)
        for dtype in dtypes:
            for layout in args.layouts.split(","):
                r = run_op(op, dtype, args.limit, args.timeout, layout, args.repeat)
                print(json.dumps(dataclasses.asdict(r)), flush=True)


def _kinds(args) -> dict[tuple[str, str], str]:
    """(dtype, layout) -> the report's row name, for every pair the command line asks for."""
    pairs = [(d, layout) for d in args.dtypes.split(",") for layout in args.layouts.split(",")]
    return {(d, layout): Result("", d, PASS, layout=layout).kind for d, layout in pairs}


def _supervise(ops: list[str], args, log) -> list[Result]:
    """Run ``ops`` in worker subprocesses; a worker that dies or stalls costs one operator, not the run."""
    results: list[Result] = []
    pending = list(ops)
    kinds = _kinds(args)
    stall = args.timeout * 4 + 120
    while pending:
        cmd = [sys.executable, "-m", "torch_openreg.testing.opinfo", "--worker", "--ops", ",".join(pending),
               "--dtypes", args.dtypes, "--layouts", args.layouts, "--timeout", str(args.timeout)]
        if args.limit:
            cmd += ["--limit", str(args.limit)]
        if args.repeat > 1:
            cmd += ["--repeat", str(args.repeat)]
        stderr = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=stderr, text=True)
        current, done = None, []
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        last = time.monotonic()
        buffer = ""
        while True:
            if not sel.select(timeout=5):
                if time.monotonic() - last > stall:
                    proc.kill()
                    break
                continue
            chunk = os.read(proc.stdout.fileno(), 65536).decode()
            if not chunk:
                break
            last = time.monotonic()
            buffer += chunk
            *complete, buffer = buffer.split("\n")
            for line in complete:
                if not line.startswith("{"):
                    continue
                item = json.loads(line)
                if "start" in item:
                    current, done = item["start"], []
                    continue
                r = Result(**item)
                results.append(r)
                done.append(r.kind)
                log(r)
                if len(done) == len(kinds) and current in pending:
                    pending.remove(current)
        proc.wait()
        if current is not None and current in pending:  # the worker died or stalled in this operator
            how = "crashed" if proc.returncode not in (0, -9) else "stalled"
            stderr.seek(0)
            last = ([line for line in stderr.read().splitlines() if line.strip()] or [""])[-1][:200]
            for (d, layout), kind in kinds.items():
                if kind not in done:
                    r = Result(current, d, ERROR, message=f"worker {how} (exit code {proc.returncode}): {last}",
                               layout=layout)
                    results.append(r)
                    log(r)
            pending.remove(current)
        elif current is None:
            stderr.seek(0)
            raise RuntimeError(f"worker exited with {proc.returncode} before running anything:\n{stderr.read()}")
        stderr.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_openreg.testing.opinfo", description=__doc__.split("\n")[0])
    parser.add_argument("--ops", default="", help="comma-separated OpInfo names (default: the whole op_db)")
    parser.add_argument("--dtypes", default="float32", help="comma-separated dtypes, e.g. float32,bfloat16,int64")
    parser.add_argument("--layouts", default="strided",
                        help="comma-separated sample layouts (LAYOUTS: strided, sparse_coo, sparse_csr, ...) or 'all'")
    parser.add_argument("--limit", type=int, default=None, help="at most N sample inputs per operator and dtype")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds allowed per sample")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run each sample N times on openreg, each compared (N >= 3 reaches the launch of clean "
                             "call plans from the bridge); not for operators that write their inputs")
    parser.add_argument("--output", default=None, help="write the markdown report here (e.g. docs/conformance.md)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.layouts == "all":
        args.layouts = ",".join(LAYOUTS)
    unknown = set(args.layouts.split(",")) - set(LAYOUTS)
    if unknown:
        parser.error(f"unknown layouts {sorted(unknown)}: choose from {', '.join(LAYOUTS)} or 'all'")
    if args.worker:
        _worker(args)
        return 0
    ops = [op_name(op) for op in select_ops(args.ops.split(",") if args.ops else None)]
    ops = list(dict.fromkeys(ops))
    start = time.monotonic()

    def log(r: Result) -> None:
        if not r.offered:
            return
        print(f"{r.op:45s} {r.kind:9s} {r.status:5s} {r.passed}/{r.samples} {r.seconds:6.1f}s {r.message[:100]}",
              flush=True)

    results = _supervise(ops, args, log)
    seconds = time.monotonic() - start
    for dtype, c in totals([r for r in results if r.offered]).items():
        print(f"{dtype}: " + ", ".join(f"{c[s]} {s}" for s in (PASS, FAIL, ERROR, SKIPPED)))
    if args.output:
        command = "python -m torch_openreg.testing.opinfo " + " ".join(
            a for a in (argv if argv is not None else sys.argv[1:]))
        write_report(results, args.output, command, args.limit, seconds, args.repeat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
