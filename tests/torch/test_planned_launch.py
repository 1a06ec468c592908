"""Planned calls launched in one bridge call (``aten/fast/planned_launch.py``, ``csrc/planned_launch.cpp``): once a
call shape's out= kernel has run clean, its calls launch from C++ and must compute, fail and release memory
exactly as the Python plan (the reference) and the CPU do."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from torch_openreg.aten.fast import call_plans, planned_launch

DEV = torch.device("openreg", 0)


@pytest.fixture
def python_plan_runs(monkeypatch, fallback_fast):
    """The call plans run by their Python path (``Plan.run``, the reference) during the test; a planned call
    launched from the bridge does not appear (skipped with OPENREG_CPP_LAUNCH=0)."""
    if not planned_launch.ENABLED:
        pytest.skip("tests the C++ planned launch (OPENREG_CPP_LAUNCH=0 turns it off)")
    # A fresh plan table: in a long run the table (bounded, call_plans._bound) may be emptied in the middle of a
    # test, and the plans made again take the Python path once more.
    for table in call_plans._bound.caches:
        table.clear()
    call_plans._bound.count = 0
    seen = []
    real = call_plans.Plan.run

    def counting(plan, *args, **kwargs):
        seen.append(plan.traits.name)
        return real(plan, *args, **kwargs)

    monkeypatch.setattr(call_plans.Plan, "run", counting)
    return seen


CASES = {
    "functional": lambda x, y: torch.add(x, y, alpha=2),
    "two outputs": lambda x, y: torch.max(x * y, dim=1),
    "in place": lambda x, y: x.clone().mul_(y).add_(y, alpha=-0.5),
    "out=": lambda x, y: torch.mul(x, y, out=torch.empty_like(x)),
    "numbers for tensors": lambda x, y: torch.ops.aten.mul.Tensor(x, 2.5) + torch.ops.aten.sub.Tensor(y, -1.0),
    "views": lambda x, y: x[1:, ::2] * y[:-1, 1::2],
    "integer": lambda x, y: (x * 100).to(torch.int64) // 7,
}


@pytest.mark.parametrize("case", CASES)
def test_planned_calls_launch_from_the_bridge_and_match_the_cpu(case, python_plan_runs, launches):
    fn = CASES[case]
    for step in range(5):
        x, y = torch.randn(6, 8), torch.randn(6, 8)
        got = fn(x.to(DEV), y.to(DEV))
        torch.testing.assert_close(torch.utils._pytree.tree_map(lambda t: t.cpu(), got), fn(x, y))
        if step == 2:  # the first calls of each shape take the general path and the plan's own
            python_plan_runs.clear()
            launches.clear()
    assert any(name.startswith("aten::") for name, _, _ in launches)
    assert not python_plan_runs, "a call shape that ran clean should launch from the bridge"


def test_numbers_of_another_value_are_wrapped_per_call(python_plan_runs):
    x = torch.randn(9)
    d = x.to(DEV)
    for factor in (2.5, 2.5, 3.5, -0.0, 0.0, 7.25):  # a plan with numbers to wrap: its Python path wraps them
        torch.testing.assert_close(torch.ops.aten.mul.Tensor(d, factor).cpu(), torch.ops.aten.mul.Tensor(x, factor))
    assert "aten::mul.Tensor" in python_plan_runs


def test_a_planned_kernel_that_fails_reports_at_the_next_synchronize_like_the_python_plan(python_plan_runs,
                                                                                          monkeypatch):
    def failure(rows: int) -> BaseException:
        x = torch.randn(rows, 3, device=DEV)
        good = torch.tensor([0, 1], device=DEV)
        for _ in range(3):
            torch.index_select(x, 0, good)  # clean runs: the call shape is planned, then launched from the bridge
        bad = torch.tensor([0, rows + 5], device=DEV)
        torch.openreg.synchronize()
        python_plan_runs.clear()
        torch.index_select(x, 0, bad)  # queued: the CPU kernel's check fails when it runs
        with pytest.raises(Exception) as caught:
            torch.openreg.synchronize()
        return caught.value

    from_bridge = failure(4)
    assert not python_plan_runs
    monkeypatch.setattr(planned_launch, "ENABLED", False)
    from_python = failure(5)  # a new call shape: its plan has no recipe
    assert python_plan_runs == ["aten::index_select"]
    assert type(from_bridge) is type(from_python)
    assert isinstance(from_bridge, torch.AcceleratorError) and isinstance(from_bridge, IndexError)
    assert "index out of range" in str(from_bridge) and "index out of range" in str(from_python)
    torch.testing.assert_close(torch.ones(2, device=DEV).cpu(), torch.ones(2))  # the device works on


def test_out_of_memory_in_a_planned_launch_leaves_nothing_allocated(python_plan_runs, memory_in_use):
    x = torch.randn(256, 256, device=DEV)
    for _ in range(4):
        x + x
    torch.openreg.synchronize()
    before = memory_in_use()
    python_plan_runs.clear()
    total = torch.openreg.mem_get_info()[1]
    kept = []
    torch.openreg.set_per_process_memory_fraction((torch.openreg.memory_reserved() + (4 << 20)) / total)
    try:
        with pytest.raises(torch.OutOfMemoryError):
            for _ in range(100):
                kept.append(x + x)
        assert len(kept) > 2 and not python_plan_runs
    finally:
        torch.openreg.set_per_process_memory_fraction(1.0)
        kept.clear()
    assert memory_in_use() == before


def test_graph_replays_rerun_a_planned_kernel(python_plan_runs, no_leak):
    x = torch.randn(32, device=DEV)
    for _ in range(4):
        x * x + x
    python_plan_runs.clear()
    g = torch.openreg.Graph()
    with torch.openreg.graph(g):
        y = x * x + x
    assert not python_plan_runs
    for _ in range(3):
        value = torch.randn(32)
        x.copy_(value)
        g.replay()
        torch.testing.assert_close(y.cpu(), value * value + value)
    g.reset()
    del y


def test_the_sanitizer_sees_the_write_set_of_planned_calls(python_plan_runs):
    x, y = torch.randn(64, device=DEV), torch.randn(64, device=DEV)
    for _ in range(4):
        torch.add(x, y, out=y)
    python_plan_runs.clear()
    torch.openreg.synchronize()
    side = torch.openreg.Stream()
    with torch.openreg.sanitizer.sanitizing():
        with torch.openreg.stream(side):
            torch.add(x, y, out=y)  # the plan's own path: the sanitizer needs the write set
        with pytest.raises(torch.AcceleratorError, match="STREAM_RACE|race"):
            y.add_(1)  # writes what the side stream writes, unordered
        torch.openreg.synchronize()
    assert "aten::add.out" in python_plan_runs


def test_the_setting_turns_it_off():
    code = (
        "import torch\n"
        "from torch_openreg.aten.fast import call_plans, planned_launch\n"
        "x = torch.randn(5, device='openreg')\n"
        "for _ in range(4): y = x * x\n"
        "plans = [p for e in call_plans._ops.values() if e for p in e.plans.values()]\n"
        "torch.testing.assert_close(y.cpu(), x.cpu() * x.cpu())\n"
        "print(planned_launch.ENABLED, any(p.recipe for p in plans), any(p.clean for p in plans))\n"
    )
    env = dict(os.environ, OPENREG_CPP_LAUNCH="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False", "True"]


def test_a_kernel_that_uses_its_output_as_scratch_space_keeps_the_python_plan(python_plan_runs):
    x, y = torch.randn(50), torch.randn(50)
    for _ in range(4):  # mse_loss's CPU out= kernel resizes its output: the plan computes into host tensors
        torch.testing.assert_close(torch.nn.functional.mse_loss(x.to(DEV), y.to(DEV)).cpu(),
                                   torch.nn.functional.mse_loss(x, y))
    plans = call_plans._ops[torch.ops.aten.mse_loss.default].plans.values()
    assert plans and not any(p.recipe for p in plans)
    assert "aten::mse_loss" in python_plan_runs


def test_queued_planned_calls_keep_no_python_tensors(python_plan_runs, asynchronous):
    """A queued planned call holds its arguments' host views in C++ only: a host view shared with the Python
    object made for it would keep that object alive until the kernel runs (PyTorch preserves a tensor's Python
    object while C++ holds it), so a long queue would fill the garbage collector's generations with tensors."""
    import gc
    import threading

    import openreg

    a, b = torch.randn(3, 6, device=DEV), torch.randn(6, 3, device=DEV)
    for _ in range(3):
        torch.mm(a, b).add(1.0)  # the call shapes' first calls: checked, then planned
    torch.openreg.synchronize()
    gate = threading.Event()
    openreg.current_stream(0).launch(lambda: gate.wait(10), name="gate")  # every call below stays queued
    python_plan_runs.clear()
    before = sum(type(o) is torch.Tensor for o in gc.get_objects())
    kept = [torch.mm(a, b).add(1.0) for _ in range(200)]
    queued = sum(type(o) is torch.Tensor for o in gc.get_objects()) - before
    gate.set()
    assert python_plan_runs == []  # launched from the bridge
    assert queued <= len(kept) + 10, queued  # the results only (not 2-3 host views per queued call)
    torch.openreg.synchronize()
    torch.testing.assert_close(kept[-1].cpu(), a.cpu() @ b.cpu() + 1)
