"""Profile an MLP training step on openreg, write its Chrome trace and draw it as a picture.

``python examples/profile_trace.py [trace.json] [picture.png]`` (defaults: ``/tmp/openreg_trace.json``,
``docs/profiler_trace.png``). The trace opens in Perfetto (ui.perfetto.dev) or chrome://tracing; the
picture, drawn with matplotlib from the same JSON, is the one in docs/debugging.md: host operators on
the CPU thread, openreg kernels on their streams, the flow arrows from each launch to its kernel.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

ROOT = Path(__file__).resolve().parents[1]


def trace(path: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to("openreg")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(128, 256, device="openreg"), torch.randint(0, 10, (128,), device="openreg")
    side = torch.openreg.Stream()

    def step() -> None:
        with record_function("forward"):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            opt.step()
            opt.zero_grad()
        with torch.openreg.stream(side):  # some work on a second stream
            (x * 2).sum()

    step()
    torch.openreg.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]) as prof:
        step()
        torch.openreg.synchronize()
    prof.export_chrome_trace(path)
    print(prof.key_averages().table(sort_by="device_time_total", row_limit=8))


def draw(path: str, picture: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    events = json.loads(Path(path).read_text())["traceEvents"]
    spans = [e for e in events if e.get("ph") == "X"]
    t0 = min(e["ts"] for e in spans)
    host = [e for e in spans if e.get("cat") in ("cpu_op", "user_annotation")]
    device = [e for e in spans if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_user_annotation")]
    streams = sorted({e["tid"] for e in device})
    depth: list[tuple[float, float]] = []  # open host spans, to stack nested operators
    rows = {}
    for e in sorted(host, key=lambda e: (e["ts"], -e["dur"])):
        while depth and depth[-1][1] <= e["ts"]:
            depth.pop()
        rows[id(e)] = len(depth)
        depth.append((e["ts"], e["ts"] + e["dur"]))
    levels = max(rows.values(), default=0) + 1
    fig, ax = plt.subplots(figsize=(12, 0.35 * (levels + 2 * len(streams)) + 1.5))
    colors = plt.get_cmap("tab20")
    names = sorted({e["name"] for e in host + device})
    color = {n: colors(i % 20) for i, n in enumerate(names)}
    y_of_stream = {}
    for i, s in enumerate(streams):
        y_of_stream[s] = levels + 1 + 2 * i
    for e in host:
        ax.barh(rows[id(e)], e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, height=0.8, color=color[e["name"]],
                edgecolor="black", linewidth=0.2)
    for e in device:
        annotation = e["cat"] == "gpu_user_annotation"
        y = y_of_stream[e["tid"]] + (1 if annotation else 0)
        ax.barh(y, e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, height=0.8, color=color[e["name"]],
                edgecolor="black", linewidth=0.2, alpha=0.5 if annotation else 1.0)
        if e["dur"] > 0.06 * max(d["dur"] for d in device):
            ax.text((e["ts"] - t0 + e["dur"] / 2) / 1e3, y, e["name"].replace("aten::", ""), ha="center",
                    va="center", fontsize=6, clip_on=True)
    starts = {e["id"]: e for e in events if e.get("ph") == "s"}
    for end in (e for e in events if e.get("ph") == "f"):
        start = starts.get(end["id"])
        kernel = next((d for d in device if d["ts"] == end["ts"] and d["tid"] == end["tid"]), None)
        if start is None or kernel is None:
            continue
        ax.annotate("", xy=((end["ts"] - t0) / 1e3, y_of_stream[end["tid"]] - 0.4),
                    xytext=((start["ts"] - t0) / 1e3, levels - 0.5),
                    arrowprops={"arrowstyle": "->", "color": "gray", "linewidth": 0.5, "alpha": 0.6})
    ticks = list(range(levels)) + [y for s in streams for y in (y_of_stream[s], y_of_stream[s] + 1)]
    labels = [f"CPU threads, depth {i}" for i in range(levels)] + [
        label for s in streams for label in (f"openreg:0 stream {s}", f"stream {s}: record_function")]
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("milliseconds since the first event")
    ax.set_title("torch.profiler trace of an MLP training step on openreg (arrows: launch -> kernel)", fontsize=9)
    fig.tight_layout()
    fig.savefig(picture, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/openreg_trace.json"
    trace(out)
    draw(out, sys.argv[2] if len(sys.argv) > 2 else str(ROOT / "docs" / "profiler_trace.png"))
