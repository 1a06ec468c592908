"""``torch.openreg`` (shaped like ``torch.cuda``), the device-agnostic APIs, generated methods, RNG."""

from __future__ import annotations

import threading

import pytest
import torch

import openreg


def test_device_count_matches_runtime():
    assert torch.openreg.device_count() == openreg.device_count() >= 1
    assert torch.openreg.is_available()


def test_current_and_set_device(two_devices):
    assert torch.openreg.current_device() == 0
    torch.openreg.set_device(1)
    assert torch.openreg.current_device() == 1
    assert torch.empty(1, device="openreg").device == torch.device("openreg", 1)  # "openreg" = current device
    torch.openreg.set_device("openreg:0")
    assert torch.openreg.current_device() == 0
    torch.openreg.set_device(torch.device("openreg", 1))
    assert torch.openreg.current_device() == 1
    assert openreg.get_device() == 1  # the runtime agrees


def test_current_device_is_per_thread(two_devices):
    torch.openreg.set_device(1)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(torch.openreg.current_device()))
    thread.start()
    thread.join()
    assert seen == [0]
    assert torch.openreg.current_device() == 1


def test_device_context_manager(two_devices):
    with torch.openreg.device(1):
        assert torch.openreg.current_device() == 1
        assert torch.ones(2, device="openreg").device.index == 1
        with torch.openreg.device("openreg:0"):
            assert torch.openreg.current_device() == 0
        assert torch.openreg.current_device() == 1
    assert torch.openreg.current_device() == 0
    with torch.openreg.device(None):  # like torch.cuda.device(None): no change
        assert torch.openreg.current_device() == 0


def test_device_context_restores_on_error(two_devices):
    with pytest.raises(ZeroDivisionError), torch.openreg.device(1):
        1 / 0  # noqa: B018
    assert torch.openreg.current_device() == 0


def test_device_rejects_other_device_types():
    with pytest.raises(ValueError, match="openreg"):
        torch.openreg.get_device_properties("cpu")


def test_synchronize_waits_for_queued_work(two_devices):
    x = torch.randn(128, 128, device="openreg:1")
    y = x
    for _ in range(5):
        y = torch.tanh(y @ x)
    torch.openreg.synchronize(1)
    assert openreg.current_stream(1).query()
    torch.openreg.synchronize()  # current device
    torch.openreg.synchronize("openreg:1")


def test_device_properties_name_capability():
    props = torch.openreg.get_device_properties(0)
    runtime = openreg.get_device_properties(0)
    assert props.name == runtime.name == torch.openreg.get_device_name(0) == torch.openreg.get_device_name()
    assert props.total_memory == openreg.device_capacity(0) > 0
    assert torch.openreg.get_device_capability() == (props.major, props.minor)
    assert torch.openreg.get_device_properties(torch.device("openreg", 0)) == props


def test_init_and_is_initialized():
    torch.openreg.init()
    assert torch.openreg.is_initialized()


def test_lazy_init_and_fork_poisoning(run_python):
    """Nothing initializes at import; seeding before init is queued; a fork after init refuses the device."""
    code = (
        "import os, torch\n"
        "assert not torch.openreg.is_initialized(), 'initialized at import'\n"
        "torch.openreg.manual_seed(7)\n"
        "assert not torch.openreg.is_initialized(), 'manual_seed initialized the device'\n"
        "a = torch.randn(3, device='openreg')\n"
        "assert torch.openreg.is_initialized(), 'creating a tensor did not initialize'\n"
        "assert torch.openreg.initial_seed() == 7, 'queued seed was not applied'\n"
        "expected = torch.randn(3, generator=torch.Generator().manual_seed(7))\n"
        "assert torch.equal(a.cpu(), expected), (a.cpu(), expected)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    try:\n"
        "        torch.openreg.init()\n"
        "    except RuntimeError as exc:\n"
        "        os._exit(3 if 'forked subprocess' in str(exc) else 4)\n"
        "    os._exit(5)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "print('child', os.waitstatus_to_exitcode(status))\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "child 3"


# ---------------------------------------------------------------------------------------------
# torch.accelerator and torch.get_device_module
# ---------------------------------------------------------------------------------------------


def test_accelerator_is_openreg():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("openreg")
    assert torch.accelerator.current_accelerator().type == "openreg"
    assert torch.accelerator.device_count() == torch.openreg.device_count()


def test_accelerator_device_index(two_devices):
    assert torch.accelerator.current_device_index() == 0
    torch.accelerator.set_device_index(1)
    assert torch.accelerator.current_device_index() == 1
    assert torch.openreg.current_device() == 1
    torch.accelerator.set_device_index(0)
    with torch.accelerator.device_index(1):
        assert torch.openreg.current_device() == 1
    assert torch.openreg.current_device() == 0


def test_accelerator_synchronize_and_current_stream(two_devices):
    s = torch.accelerator.current_stream()
    assert isinstance(s, torch.Stream)
    assert s.device == torch.device("openreg", 0)
    assert s == torch.openreg.current_stream() == torch.openreg.default_stream()
    assert torch.accelerator.current_stream(1).device_index == 1
    x = torch.randn(64, 64, device="openreg")
    y = x @ x
    torch.accelerator.synchronize()
    torch.accelerator.synchronize(1)
    assert torch.openreg.current_stream().query()
    torch.testing.assert_close(y.cpu(), x.cpu() @ x.cpu())


def test_get_device_module():
    assert torch.get_device_module("openreg") is torch.openreg
    assert torch.get_device_module(torch.device("openreg", 0)) is torch.openreg
    assert torch.get_device_module() is torch.openreg  # the current accelerator


# ---------------------------------------------------------------------------------------------
# Generated methods
# ---------------------------------------------------------------------------------------------


def test_tensor_methods(two_devices):
    t = torch.arange(4.0)
    assert not t.is_openreg
    d = t.openreg()
    assert d.is_openreg and d.device == torch.device("openreg", 0)
    torch.testing.assert_close(d.cpu(), t)
    assert t.openreg(1).device == torch.device("openreg", 1)
    assert t.openreg("openreg:1").device.index == 1
    assert d.openreg() is d  # already there: no copy


def test_module_method(two_devices):
    m = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    state = {k: v.clone() for k, v in m.state_dict().items()}
    assert m.openreg() is m
    for name, value in m.state_dict().items():
        assert value.device == torch.device("openreg", 0), name
        torch.testing.assert_close(value.cpu(), state[name])
    m.openreg(1)
    assert all(p.device.index == 1 for p in m.parameters())


def test_storage_methods():
    s = torch.UntypedStorage(8)
    assert not s.is_openreg
    d = s.openreg()
    assert d.is_openreg and d.device == torch.device("openreg", 0)
    assert d.nbytes() == 8
    t = torch.tensor([1, 2, 3], dtype=torch.int16)
    ds = t.untyped_storage().openreg()
    assert ds.is_openreg
    back = torch.empty(3, dtype=torch.int16, device="openreg").set_(ds, 0, (3,), (1,))
    assert back.cpu().tolist() == [1, 2, 3]


# ---------------------------------------------------------------------------------------------
# Random numbers
# ---------------------------------------------------------------------------------------------


def test_generator_reproducibility():
    g = torch.Generator(device="openreg")
    assert g.device == torch.device("openreg", 0)
    g.manual_seed(123)
    a = torch.randn(16, device="openreg", generator=g)
    b = torch.rand(4, 4, device="openreg", generator=g)
    g.manual_seed(123)
    a2 = torch.randn(16, device="openreg", generator=g)
    b2 = torch.rand(4, 4, device="openreg", generator=g)
    assert a.device.type == "openreg"
    assert torch.equal(a.cpu(), a2.cpu()) and torch.equal(b.cpu(), b2.cpu())
    assert not torch.equal(a.cpu()[:4], b.cpu()[0])
    state = g.get_state()
    c = torch.randn(8, device="openreg", generator=g)
    g.set_state(state)
    assert torch.equal(torch.randn(8, device="openreg", generator=g).cpu(), c.cpu())


def test_generator_does_not_touch_default_generators():
    torch.manual_seed(0)
    expected = torch.randn(5, device="openreg").cpu()
    torch.manual_seed(0)
    g = torch.Generator(device="openreg").manual_seed(99)
    torch.randn(5, device="openreg", generator=g)
    torch.randn(5, generator=torch.Generator().manual_seed(1))
    assert torch.equal(torch.randn(5, device="openreg").cpu(), expected)


def test_manual_seed_reproducibility():
    def run():
        torch.manual_seed(2024)
        x = torch.randn(3, 5, device="openreg")
        y = torch.rand(7, device="openreg")
        z = torch.randint(0, 100, (6,), device="openreg")
        p = torch.randperm(10, device="openreg")
        d = torch.nn.functional.dropout(torch.ones(20, device="openreg"), 0.5)
        n = torch.empty(4, device="openreg").normal_(2.0, 3.0)
        return [t.cpu() for t in (x, y, z, p, d, n)]

    first, second = run(), run()
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    torch.manual_seed(2025)
    assert not torch.equal(torch.randn(3, 5, device="openreg").cpu(), first[0])


def _keep_stream_busy():
    """Queue enough work that a kernel launched next is still waiting when the host moves on."""
    big = torch.randn(256, 256, device="openreg")
    y = big
    for _ in range(10):
        y = torch.tanh(y @ big)


def test_seeding_applies_to_work_already_queued():
    """Random ops draw in program order: reseeding after a launch does not change what it draws."""
    torch.manual_seed(0)
    _keep_stream_busy()
    a = torch.randn(8, device="openreg")  # queued behind the busy work
    torch.manual_seed(0)  # the host reseeds while that launch may still be queued
    _keep_stream_busy()
    b = torch.randn(8, device="openreg")
    assert torch.equal(a.cpu(), b.cpu())

    g = torch.Generator(device="openreg").manual_seed(1)
    _keep_stream_busy()
    c = torch.empty(8, device="openreg").uniform_(generator=g)
    state = g.get_state()  # taken after c's draw, in program order
    d = torch.rand(8, device="openreg", generator=g)
    g.set_state(state)
    assert torch.equal(torch.rand(8, device="openreg", generator=g).cpu(), d.cpu())
    assert not torch.equal(c.cpu(), d.cpu())


def test_seeding_functions_and_rng_state(two_devices):
    torch.openreg.manual_seed_all(11)
    a0 = torch.randn(4, device="openreg:0").cpu()
    a1 = torch.randn(4, device="openreg:1").cpu()
    assert torch.equal(a0, a1)  # same seed on every device
    torch.openreg.manual_seed(5)
    assert torch.openreg.initial_seed() == 5
    state = torch.openreg.get_rng_state()
    x = torch.randn(6, device="openreg").cpu()
    torch.openreg.set_rng_state(state)
    assert torch.equal(torch.randn(6, device="openreg").cpu(), x)
    states = torch.openreg.get_rng_state_all()
    assert len(states) == torch.openreg.device_count()
    assert len(torch.openreg.default_generators) == torch.openreg.device_count()
    assert torch.openreg.default_generators[1].device == torch.device("openreg", 1)


def test_fork_rng_on_openreg():
    torch.manual_seed(3)
    with torch.random.fork_rng(devices=range(torch.openreg.device_count()), device_type="openreg"):
        inside = torch.randn(4, device="openreg").cpu()
    after = torch.randn(4, device="openreg").cpu()
    assert torch.equal(inside, after)  # fork_rng restored the openreg state


def test_cuda_style_helpers():
    import openreg

    x = torch.ones(2, device="openreg:1") if torch.openreg.device_count() > 1 else torch.ones(2, device="openreg")
    with torch.openreg.device_of(x):
        assert torch.openreg.current_device() == x.get_device()
    assert torch.openreg.current_device() == 0
    assert torch.openreg.is_bf16_supported()
    runtime_stream = openreg.Stream(0)  # created outside PyTorch
    external = torch.openreg.ExternalStream(runtime_stream.id)
    assert external.stream_id == runtime_stream.id and external.device_index == 0
    with torch.openreg.StreamContext(external):
        assert torch.openreg.current_stream().stream_id == runtime_stream.id
        y = torch.arange(4.0, device="openreg") * 2
    external.synchronize()
    torch.testing.assert_close(y.cpu(), torch.arange(4.0) * 2)
    with pytest.raises(RuntimeError, match="no live stream"):
        torch.openreg.ExternalStream(10**9)
