"""Device graphs on openreg: torch.accelerator.Graph, torch.openreg's graph API, pools, RNG, errors, users."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

import openreg


def _stats() -> tuple[int, int]:
    torch.openreg.synchronize()
    gc.collect()
    stats = torch.openreg.memory_stats()
    return stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"]


@pytest.fixture
def baseline():
    """Memory statistics with an empty cache before the test; the test checks it gets back there."""
    torch.openreg.synchronize()
    gc.collect()
    torch.openreg.empty_cache()
    return _stats()


def _chain(x: torch.Tensor, calls: list | None = None) -> torch.Tensor:
    if calls is not None:
        calls.append(1)
    for _ in range(5):
        x = (x * 1.5 + 0.25).sin()
    return x.relu() - x.mean()


# LITERALINCLUDE START: TEST ACCELERATOR GRAPH
def test_accelerator_graph_replays_the_launches_not_the_python(no_leak):
    x = torch.randn(16).to("openreg")
    _chain(x)  # warm-up: every call shape seen outside the capture
    calls = []
    stream = torch.openreg.Stream()
    g = torch.accelerator.Graph()
    with stream, g:
        y = _chain(x, calls)
    assert calls == [1]
    for value in (torch.randn(16), torch.randn(16)):
        x.copy_(value)
        g.replay()
        torch.testing.assert_close(y.cpu(), _chain(value))  # against the CPU
        torch.testing.assert_close(y, _chain(x))  # against eager openreg
    assert calls == [1]
    g.reset()
    del y
# LITERALINCLUDE END: TEST ACCELERATOR GRAPH


def test_torch_openreg_graph_context_and_pools(baseline):
    x = torch.ones(64, device="openreg")
    g1, g2 = torch.openreg.Graph(), torch.openreg.Graph()
    pool = torch.openreg.graph_pool_handle()
    with torch.openreg.graph(g1, pool=pool):
        a = x + 1
        assert torch.openreg.is_current_stream_capturing()
    assert not torch.openreg.is_current_stream_capturing()
    reserved = _stats()[1]
    with torch.openreg.graph(g2, pool=g1.pool()):  # shares g1's pool: no new segment
        b = a * 3
    assert g1.pool() == g2.pool() == pool and _stats()[1] == reserved
    segments = [s for s in torch.openreg.memory_snapshot() if s["segment_pool_id"] == pool]
    assert segments and all(s["stream"] == torch.openreg.graph.default_capture_stream.stream_id for s in segments)
    eager = torch.empty(64, device="openreg")  # never from the pool
    assert all(not (s["address"] <= eager.data_ptr() < s["address"] + s["total_size"]) for s in segments)
    for value in (2.0, 5.0):
        x.fill_(value)
        g1.replay()
        g2.replay()
        torch.testing.assert_close(b.cpu(), torch.full((64,), (value + 1) * 3))
    del a, b, eager, x
    g1.reset()
    assert _stats()[1] == reserved  # g2 still uses the pool
    g2.reset()
    torch.openreg.empty_cache()
    assert _stats() == baseline


def test_reset_frees_the_pool_once_the_outputs_are_gone(baseline):
    x = torch.ones(300_000, device="openreg")  # large pool segments
    g = torch.openreg.Graph()
    with torch.openreg.graph(g):
        y = (x * 2).sum(0, keepdim=True)
    g.replay()
    assert y.item() == 600_000
    g.reset()
    assert _stats()[0] > baseline[0]  # y is alive, in the pool
    del y, x
    torch.openreg.empty_cache()
    assert _stats() == baseline
    with pytest.raises(RuntimeError, match="holds no captured graph"):
        g.replay()
    with torch.openreg.graph(g):  # a reset graph captures again
        z = torch.ones(4, device="openreg") * 2
    g.replay()
    assert z.tolist() == [2.0] * 4
    g.reset()
    del z
    assert _stats() == baseline


def test_capture_on_the_default_stream_and_nested_capture_are_errors(no_leak):
    with pytest.raises(RuntimeError, match="default stream of openreg:0 is not allowed"):
        with torch.accelerator.Graph():
            pass
    torch.ones(2, device="openreg").add_(1).cpu()  # the stream works
    outer = torch.openreg.Graph()
    with torch.openreg.graph(outer):
        with pytest.raises(RuntimeError, match="nested in a capture"):
            with torch.openreg.graph(torch.openreg.Graph(), stream=torch.openreg.Stream()):
                pass
    with pytest.raises(RuntimeError, match="already holds a captured graph"):
        outer.capture_begin()
    outer.reset()


@pytest.mark.parametrize("sync", ["item", "to_cpu", "synchronize", "nonzero", "print", "manual_seed"])
def test_host_synchronization_during_capture_is_a_clear_error(sync, baseline):
    x = torch.arange(8.0, device="openreg")
    stream = torch.openreg.Stream()
    actions = {
        "item": lambda t: t.sum().item(), "to_cpu": lambda t: t.cpu(), "nonzero": lambda t: t.nonzero(),
        "synchronize": lambda t: torch.openreg.synchronize(), "print": lambda t: str(t),
        "manual_seed": lambda t: torch.manual_seed(1),
    }
    g = torch.openreg.Graph()
    with pytest.raises(RuntimeError, match="during a graph capture|while a graph capture is underway") as info:
        with torch.openreg.graph(g, stream=stream):
            x * 2  # recorded
            actions[sync](x)
    assert "cannot wait for the device" in str(info.value) or "the default streams cannot be used" in str(info.value)
    assert not openreg.is_capturing(openreg.get_stream(0, stream.stream_id))
    with torch.openreg.stream(stream):  # the stream is usable
        assert (x * 2).sum().item() == 56.0
    with pytest.raises(RuntimeError, match="holds no captured graph"):
        g.replay()
    del x, g, info  # the exception's frames hold the capture's tensors
    torch.openreg.empty_cache()
    assert _stats() == baseline


def test_torch_accelerator_graph_exit_names_the_refusal(no_leak):
    x = torch.ones(4, device="openreg")
    with pytest.raises(RuntimeError, match="the graph capture was invalidated: item, a synchronous call"):
        with torch.openreg.Stream(), torch.accelerator.Graph():
            x.sum().item()


def test_random_ops_draw_fresh_numbers_each_replay_and_repeat_under_manual_seed(no_leak):
    ones = torch.ones(32, device="openreg")

    def sample():
        return torch.rand(32, device="openreg") + torch.randn(32, device="openreg") * 0, nn.functional.dropout(ones)

    sample()
    g = torch.openreg.Graph()
    with torch.openreg.graph(g):
        r, d = sample()
    torch.openreg.manual_seed(7)
    g.replay()
    first = r.cpu(), d.cpu()
    g.replay()
    assert not torch.equal(r.cpu(), first[0])  # fresh numbers
    torch.openreg.manual_seed(7)
    g.replay()
    torch.testing.assert_close((r.cpu(), d.cpu()), first)  # the same again
    torch.manual_seed(7)  # the CPU draws the same numbers for the seed, in the same order
    cpu = torch.rand(32)
    torch.randn(32)
    torch.testing.assert_close(first[0], cpu)
    g.reset()
    del r, d


# LITERALINCLUDE START: TEST FORK JOIN
def test_fork_and_join_of_streams_inside_a_capture(no_leak):
    x = torch.arange(16.0, device="openreg")
    side = torch.openreg.Stream()
    g = torch.openreg.Graph()
    x + 1, x * 2  # warm-up
    with torch.openreg.graph(g):
        main = torch.openreg.current_stream()
        side.wait_stream(main)  # fork: side joins the capture
        with torch.openreg.stream(side):
            a = x * 2
        b = x + 1
        main.wait_stream(side)  # join
        c = a + b
    pool = [seg for seg in torch.openreg.memory_snapshot() if seg["segment_pool_id"] == g.pool()]
    for t in (a, b, c):  # the joined stream allocates from the graph's pool too
        assert any(seg["address"] <= t.data_ptr() < seg["address"] + seg["total_size"] for seg in pool)
    x.fill_(1.0)
    g.replay()
    torch.testing.assert_close(c.cpu(), torch.full((16,), 4.0))
    g.reset()
    del a, b, c
# LITERALINCLUDE END: TEST FORK JOIN


def test_a_fork_never_joined_and_a_captured_event_query_are_errors(no_leak):
    x = torch.ones(8, device="openreg")
    # two draws in a row from the round-robin pool differ (torch.openreg.graph's own capture stream comes from
    # the same pool: a lone draw may be that very stream, depending on how many streams earlier tests drew)
    capture, side = torch.openreg.Stream(), torch.openreg.Stream()
    with pytest.raises(RuntimeError, match="forked into it but not joined back"):
        with torch.openreg.graph(torch.openreg.Graph(), stream=capture):
            side.wait_stream(torch.openreg.current_stream())
            with torch.openreg.stream(side):
                x.mul(2)
    event = torch.openreg.Event()
    with pytest.raises(RuntimeError, match="query of an event recorded into the capture"):
        with torch.openreg.graph(torch.openreg.Graph()):
            event.record()
            event.query()
    assert event.query()  # after the capture, never reached: complete
    side.synchronize()


def test_replay_after_a_captured_input_was_freed_is_an_error(baseline):
    x = torch.ones(16, device="openreg")
    g = torch.openreg.Graph()
    with torch.openreg.graph(g):
        y = x * 3
    g.replay()
    del x  # its block goes back to the cache, and may be handed out again
    with pytest.raises(RuntimeError, match="captured memory was freed: the block at 0x"):
        g.replay()
    g.reset()
    del y
    torch.openreg.empty_cache()
    assert _stats() == baseline


def test_an_input_freed_during_the_capture_makes_the_graph_stale(no_leak):
    x = torch.ones(16, device="openreg")
    g = torch.openreg.Graph()
    with torch.openreg.graph(g):
        x = x * 2  # the first x, made outside the capture, is freed inside it
    with pytest.raises(RuntimeError, match="captured memory was freed"):
        g.replay()
    g.reset()
    del x


def test_replay_runs_on_the_capture_device_whatever_is_current(two_devices, no_leak):
    x = torch.ones(8, device="openreg:0")
    g = torch.openreg.Graph()
    with torch.openreg.graph(g):
        y = x + 1
    with torch.openreg.device(1):
        g.replay()
    assert y.device == torch.device("openreg:0") and y.tolist() == [2.0] * 8
    g.reset()
    del y
    with pytest.raises(RuntimeError, match="default stream of openreg:0 while a graph capture is underway"):
        with torch.openreg.graph(torch.openreg.Graph(), stream=torch.openreg.Stream(device=1)):
            x + 1  # openreg:0's work, while openreg:1's stream captures
    (x + 1).cpu()


def test_host_values_are_fixed_at_capture(no_leak):
    x = torch.ones(4, device="openreg")
    scale = torch.tensor(2.0)  # a CPU scalar: read when the launch is made
    g = torch.openreg.Graph()
    with torch.openreg.graph(g):
        y = x * scale
    scale.fill_(10.0)
    g.replay()
    assert y.tolist() == [2.0] * 4  # the value at capture, as a CUDA graph's kernel arguments
    g.reset()
    del y


def test_debug_dump_writes_the_graph(tmp_path, no_leak):
    x = torch.ones(4, device="openreg")
    g = torch.openreg.Graph(keep_graph=True)
    g.enable_debug_mode()
    with torch.openreg.graph(g):
        y = (x + 1) * 2
    g.instantiate()
    g.debug_dump(str(tmp_path / "graph.dot"))
    dump = (tmp_path / "graph.dot").read_text()
    assert dump.startswith("digraph") and "aten::add.Tensor" in dump and "aten::mul.Tensor" in dump
    g.replay()
    assert y.tolist() == [4.0] * 4
    g.reset()
    del y


def test_mempool_and_use_mem_pool(baseline):
    pool = torch.openreg.MemPool()
    assert pool.use_count() == 1 and pool.allocator is None
    with torch.openreg.use_mem_pool(pool):
        assert pool.use_count() == 2
        a = torch.empty(1000, device="openreg")
    b = torch.empty(1000, device="openreg")
    snap = pool.snapshot()
    assert len(snap) == 1 and snap[0]["segment_pool_id"] == pool.id
    blocks = {blk["address"] for blk in snap[0]["blocks"] if blk["state"] == "active_allocated"}
    assert a.data_ptr() in blocks and b.data_ptr() not in blocks
    g = torch.openreg.Graph()  # a graph may capture into a MemPool
    with torch.openreg.graph(g, pool=pool.id):
        c = a + 1
    assert pool.use_count() == 2
    assert c.data_ptr() in {blk["address"] for seg in pool.snapshot() for blk in seg["blocks"]}
    with pytest.raises(NotImplementedError, match="no pluggable allocators"):
        torch.openreg.MemPool(allocator=object())
    g.reset()
    del a, b, c, pool
    torch.openreg.empty_cache()
    assert _stats() == baseline


def test_mempool_no_split_and_use_on_oom(baseline):
    whole = torch.openreg.MemPool(no_split=True)
    with torch.openreg.use_mem_pool(whole):
        small = torch.empty(16, device="openreg")
    (segment,) = whole.snapshot()
    assert [b["size"] for b in segment["blocks"]] == [segment["total_size"]]  # not split
    del small, segment, whole

    lender = torch.openreg.MemPool(use_on_oom=True)
    with torch.openreg.use_mem_pool(lender):
        big = torch.empty(4 << 20, dtype=torch.uint8, device="openreg")
    lent = big.data_ptr()
    del big  # its block stays in the pool
    reserved = torch.openreg.memory_reserved()
    torch.openreg.set_per_process_memory_fraction(reserved / torch.openreg.get_device_properties().total_memory)
    try:
        again = torch.empty(4 << 20, dtype=torch.uint8, device="openreg")  # no room outside the pool
    finally:
        torch.openreg.set_per_process_memory_fraction(1.0)
    assert again.data_ptr() == lent
    del again, lender
    torch.openreg.empty_cache()
    assert _stats() == baseline


def _mlp(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4)).to(device)


def _train(model: nn.Module, x: torch.Tensor, t: torch.Tensor, steps: int = 4) -> list[float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), t)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_make_graphed_callables_trains_an_mlp_like_eager(no_leak):
    torch.manual_seed(3)
    x, t = torch.randn(5, 8), torch.randn(5, 4)
    cpu = _train(_mlp("cpu"), x, t)
    eager = _train(_mlp("openreg"), x.to("openreg"), t.to("openreg"))
    model = _mlp("openreg")
    graphed = torch.openreg.make_graphed_callables(model, (torch.randn(5, 8, device="openreg"),))
    assert graphed is model
    torch.testing.assert_close(_train(graphed, x.to("openreg"), t.to("openreg")), cpu)
    torch.testing.assert_close(eager, cpu)
    model.eval()  # not captured in eval mode: its own forward runs
    torch.testing.assert_close(model(x.to("openreg")).cpu(), model.cpu()(x))
    with pytest.raises(ValueError, match="capture again for other shapes"):
        model.to("openreg").train()(torch.randn(3, 8, device="openreg"))


def test_make_graphed_callables_with_functions_and_input_gradients(no_leak):
    w = torch.randn(6, 6, device="openreg", requires_grad=True)

    def f(a):
        return (a @ w).sin()

    a = torch.randn(3, 6, device="openreg", requires_grad=True)
    graphed = torch.openreg.make_graphed_callables((f,), ((a.detach().clone().requires_grad_(),),))[0]
    out = graphed(a)
    out.sum().backward()
    expect = torch.autograd.grad(f(a).sum(), a)[0]
    torch.testing.assert_close(a.grad, expect)


def test_a_whole_training_step_captured_matches_eager(no_leak):
    from benchmarks.graphs import captured, mlp_step

    cpu_step, cpu_loss = mlp_step("cpu")
    eager_step, eager_loss = mlp_step("openreg")
    step, loss = mlp_step("openreg")
    replay = captured(step)  # three warm-up steps, then the capture: a fourth step runs at the first replay
    for _ in range(3):
        cpu_step()
        eager_step()
    for _ in range(4):
        replay()
        cpu_step()
        eager_step()
        torch.testing.assert_close(loss().cpu(), cpu_loss())
        torch.testing.assert_close(eager_loss(), loss())


def test_compile_reduce_overhead_trains_with_openreg_graphs(monkeypatch):
    import torch._dynamo

    recorded = []
    end_capture = openreg.end_capture
    monkeypatch.setattr(openreg, "end_capture", lambda s: recorded.append(1) or end_capture(s))

    def train(device: str, mode: str | None) -> list[float]:
        torch.manual_seed(0)
        model = _mlp(device)
        torch.manual_seed(1)
        x, t = torch.randn(4, 8).to(device), torch.randn(4, 4).to(device)
        return _train(torch.compile(model, mode=mode) if mode else model, x, t, steps=5)

    try:
        torch.testing.assert_close(train("openreg", "reduce-overhead"), train("cpu", None))
    finally:
        torch._dynamo.reset()
    assert len(recorded) == 2  # the forward graph and the backward graph
