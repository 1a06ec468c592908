"""Device graphs: replay of captured openreg work against eager openreg and eager CPU, measured in the same run.

* 100 elementwise operators on 16 floats (launch overhead is all there is);
* an MLP training step at batch 1 (forward, loss, backward, SGD step), captured whole.

Goal: a replay at least 3x faster than the same work launched eagerly on openreg; stretch: within 2x of
eager CPU. openreg times include a synchronize after each call, as any device timing must. ``python -m
benchmarks.graphs`` runs this part alone; ``python -m benchmarks`` runs it with the rest.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn

from .common import interleaved, table

GOAL, STRETCH = 3.0, 2.0


# LITERALINCLUDE START: BENCH GRAPH WORKLOADS
def elementwise(x: torch.Tensor) -> torch.Tensor:
    """100 elementwise operators."""
    for _ in range(25):
        x = (x * 1.01 + 0.1).sin().abs()
    return x


def mlp_step(device: str, width: int = 64) -> tuple[Callable[[], object], Callable[[], torch.Tensor]]:
    """A training step at batch 1 on ``device``: ``(step, loss)``; ``loss()`` reads the last step's loss."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                          nn.Linear(width, 8)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(1, width).to(device), torch.randn(1, 8).to(device)
    out = {}

    def step() -> None:
        opt.zero_grad(set_to_none=False)
        out["loss"] = loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()

    return step, lambda: out["loss"]


def captured(step: Callable[[], object], warmup: int = 3) -> Callable[[], None]:
    """``step`` captured into an openreg graph after a warm-up on the capture's side stream (every call shape
    seen before the capture); returns the graph's replay."""
    side = torch.openreg.Stream()
    side.wait_stream(torch.openreg.current_stream())
    with torch.openreg.stream(side):
        for _ in range(warmup):
            step()
    torch.openreg.current_stream().wait_stream(side)
    graph = torch.openreg.Graph()
    with torch.openreg.graph(graph, stream=side):
        step()
    return graph.replay
# LITERALINCLUDE END: BENCH GRAPH WORKLOADS


def _synced(fn: Callable[[], object]) -> Callable[[], None]:
    def call() -> None:
        fn()
        torch.openreg.synchronize()
    return call


def run_times(quick: bool) -> list[list[str]]:
    """Rows: workload, replay, eager openreg, eager CPU (us), eager openreg / replay, replay / CPU."""
    repeat, number = (3, 5) if quick else (15, 20)
    x_dev, x_cpu = torch.randn(16).to("openreg"), torch.randn(16)
    chain_dev = lambda: elementwise(x_dev)  # noqa: E731
    step_dev, _ = mlp_step("openreg")
    step_graph, _ = mlp_step("openreg")
    step_cpu, _ = mlp_step("cpu")
    workloads = {
        "100 elementwise ops, 16 floats": (captured(chain_dev), chain_dev, lambda: elementwise(x_cpu)),
        "MLP training step, batch 1": (captured(step_graph), step_dev, step_cpu),
    }
    rows = []
    for name, (replay, eager, cpu) in workloads.items():
        t = interleaved({"replay": _synced(replay), "eager": _synced(eager), "cpu": cpu}, repeat, number)
        rows.append([name, f"{t['replay'] * 1e6:.1f}", f"{t['eager'] * 1e6:.1f}", f"{t['cpu'] * 1e6:.1f}",
                     f"{t['eager'] / t['replay']:.2f}", f"{t['replay'] / t['cpu']:.2f}"])
    return rows


def run(quick: bool) -> str:
    out = ["## Device graphs\n",
           f"Median µs per call; openreg waits for its stream. Goal: replay ≥{GOAL:.0f}x faster than eager openreg; "
           f"stretch: replay within {STRETCH:.0f}x of eager CPU.\n"]
    out.append(table(["workload", "openreg replay (us)", "openreg eager (us)", "cpu eager (us)",
                      "eager / replay", "replay / cpu"], run_times(quick)))
    out.append("")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="few repeats: checks that it runs")
    print(run(parser.parse_args().quick))


if __name__ == "__main__":
    main()
