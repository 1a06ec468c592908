"""Random numbers on openreg: the torch.openreg RNG API, reproducibility, fork_rng, clear errors.

openreg generators keep a CPU (MT19937) state, so for one seed openreg draws the same numbers as
the CPU: every reproducibility test also compares against the CPU.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

# name -> function(device, generator or None) drawing random numbers
DRAWS = {
    "rand": lambda d, g: torch.rand(5, 3, device=d, generator=g),
    "randn": lambda d, g: torch.randn(7, device=d, generator=g),
    "randint": lambda d, g: torch.randint(-5, 100, (9,), device=d, generator=g),
    "normal_": lambda d, g: torch.empty(6, device=d).normal_(2.0, 3.0, generator=g),
    "uniform_": lambda d, g: torch.empty(6, device=d).uniform_(-1, 1, generator=g),
    "bernoulli_": lambda d, g: torch.empty(16, device=d).bernoulli_(0.3, generator=g),
    "bernoulli": lambda d, g: torch.bernoulli(torch.full((16,), 0.6, device=d), generator=g),
    "randperm": lambda d, g: torch.randperm(20, device=d, generator=g),
    "multinomial": lambda d, g: torch.multinomial(torch.arange(1.0, 9.0, device=d), 5, generator=g),
    "exponential_": lambda d, g: torch.empty(5, device=d).exponential_(generator=g),
}


# name -> function(device) drawing from the default generator (seeded with torch.manual_seed)
SEEDED = {
    "rand_like": lambda d: torch.rand_like(torch.empty(5, device=d)),
    "randn_like": lambda d: torch.randn_like(torch.empty(5, device=d)),
    "randint_like": lambda d: torch.randint_like(torch.empty(5, device=d), 10),
    "poisson": lambda d: torch.poisson(torch.full((5,), 3.0, device=d)),
    "trunc_normal_": lambda d: torch.nn.init.trunc_normal_(torch.empty(5, device=d)),
    "kaiming_uniform_": lambda d: torch.nn.init.kaiming_uniform_(torch.empty(3, 5, device=d)),
    "rrelu": lambda d: F.rrelu(-torch.ones(6, device=d), training=True),
    "dropout2d": lambda d: F.dropout2d(torch.ones(1, 4, 2, 2, device=d)),
    "alpha_dropout": lambda d: F.alpha_dropout(torch.ones(8, device=d), 0.5, training=True),
    "random_": lambda d: torch.empty(5, device=d).random_(0, 100),
    "cauchy_": lambda d: torch.empty(5, device=d).cauchy_(),
    "geometric_": lambda d: torch.empty(5, device=d).geometric_(0.3),
    "log_normal_": lambda d: torch.empty(5, device=d).log_normal_(),
    "normal(Tensor, Tensor)": lambda d: torch.normal(torch.zeros(5, device=d), torch.ones(5, device=d)),
}


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_default_generator_ops_reproducible_and_match_cpu(name):
    torch.manual_seed(3)
    a = SEEDED[name]("openreg").cpu()
    torch.manual_seed(3)
    assert_close(SEEDED[name]("openreg").cpu(), a, rtol=0, atol=0)
    torch.manual_seed(3)
    assert_close(SEEDED[name]("cpu"), a, rtol=0, atol=0)


def _dropout(device: str) -> torch.Tensor:  # dropout takes no generator: it uses the default one
    return F.dropout(torch.ones(32, device=device), p=0.4, training=True)


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_same_seed_same_numbers_and_matches_cpu(name):
    draw = DRAWS[name]
    torch.openreg.manual_seed(1234)
    first = draw("openreg", None).cpu()
    torch.openreg.manual_seed(1234)
    second = draw("openreg", None).cpu()
    assert_close(first, second, rtol=0, atol=0)
    cpu = draw("cpu", torch.Generator().manual_seed(1234))
    assert_close(first, cpu, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(DRAWS))
def test_explicit_generator(name):
    draw = DRAWS[name]
    g = torch.Generator(device="openreg")
    assert g.device == torch.device("openreg", 0)
    g.manual_seed(99)
    a = draw("openreg", g).cpu()
    g.manual_seed(99)
    assert_close(draw("openreg", g).cpu(), a, rtol=0, atol=0)
    assert_close(a, draw("cpu", torch.Generator().manual_seed(99)), rtol=0, atol=0)


def test_dropout_reproducible():
    torch.openreg.manual_seed(5)
    a = _dropout("openreg").cpu()
    torch.openreg.manual_seed(5)
    assert_close(_dropout("openreg").cpu(), a, rtol=0, atol=0)
    torch.manual_seed(5)  # seeds the CPU and every openreg device
    assert_close(_dropout("cpu"), a, rtol=0, atol=0)
    assert set(a.unique().tolist()) <= {0.0, torch.tensor(1 / 0.6).item()}


def test_dropout_backward_matches_cpu():
    x = torch.randn(20, requires_grad=True)
    xo = x.detach().to("openreg").requires_grad_()
    torch.manual_seed(6)
    F.dropout(x, p=0.3).sum().backward()
    torch.manual_seed(6)
    F.dropout(xo, p=0.3).sum().backward()
    assert_close(xo.grad.cpu(), x.grad)


def test_restoring_state_replays():
    torch.openreg.manual_seed(0)
    torch.randn(3, device="openreg")
    state = torch.openreg.get_rng_state()
    assert state.device.type == "cpu" and state.dtype == torch.uint8
    first = [DRAWS[n]("openreg", None).cpu() for n in sorted(DRAWS)] + [_dropout("openreg").cpu()]
    torch.openreg.set_rng_state(state)
    second = [DRAWS[n]("openreg", None).cpu() for n in sorted(DRAWS)] + [_dropout("openreg").cpu()]
    for a, b in zip(first, second):
        assert_close(a, b, rtol=0, atol=0)


def test_generator_state_roundtrip():
    g = torch.Generator(device="openreg").manual_seed(8)
    state = g.get_state()
    a = torch.randn(4, device="openreg", generator=g).cpu()
    g.set_state(state)
    assert_close(torch.randn(4, device="openreg", generator=g).cpu(), a, rtol=0, atol=0)
    clone = g.clone_state()
    assert clone.device == g.device
    assert torch.equal(clone.get_state(), g.get_state())


def test_per_device_generators(two_devices):
    torch.openreg.manual_seed_all(11)
    a0 = torch.randn(4, device="openreg:0").cpu()
    a1 = torch.randn(4, device="openreg:1").cpu()
    assert_close(a0, a1, rtol=0, atol=0)
    with torch.openreg.device(1):
        torch.openreg.manual_seed(12)  # only the current device
        assert torch.openreg.initial_seed() == 12
    assert torch.openreg.initial_seed() == 11
    states = torch.openreg.get_rng_state_all()
    x = [torch.randn(3, device=f"openreg:{i}").cpu() for i in range(2)]
    torch.openreg.set_rng_state_all(states)
    y = [torch.randn(3, device=f"openreg:{i}").cpu() for i in range(2)]
    for a, b in zip(x, y):
        assert_close(a, b, rtol=0, atol=0)
    torch.openreg.set_rng_state(states[1], device="openreg:1")
    assert_close(torch.randn(3, device="openreg:1").cpu(), x[1], rtol=0, atol=0)


def test_seed_and_seed_all():
    torch.openreg.manual_seed(1)
    torch.openreg.seed()  # a non-deterministic seed: 1 again has probability 2**-64
    assert torch.openreg.initial_seed() != 1
    torch.openreg.seed_all()
    seeds = [g.initial_seed() for g in torch.openreg.default_generators]
    assert len(set(seeds)) == 1  # seed_all gives every device the same new seed


def test_fork_rng_restores_openreg_state():
    torch.openreg.manual_seed(3)
    before = torch.openreg.get_rng_state()
    with torch.random.fork_rng(devices=[0], device_type="openreg"):
        torch.openreg.manual_seed(77)
        torch.randn(10, device="openreg")
    assert torch.equal(torch.openreg.get_rng_state(), before)


def test_fork_rng_default_devices_warns_and_restores():
    before = torch.openreg.get_rng_state_all()
    with pytest.warns(UserWarning, match="OPENREG"):
        with torch.random.fork_rng(device_type="openreg"):
            torch.randn(10, device="openreg")
    for a, b in zip(torch.openreg.get_rng_state_all(), before):
        assert torch.equal(a, b)


def test_offset_is_a_clear_error():
    g = torch.Generator(device="openreg")
    with pytest.raises(RuntimeError, match="openreg generators have no offset"):
        g.get_offset()
    with pytest.raises(RuntimeError, match="openreg generators have no offset"):
        g.set_offset(4)
    with pytest.raises(RuntimeError, match="openreg generators have no graph-safe state"):
        g.graphsafe_get_state()


def test_seeding_before_init_is_queued(run_python):
    code = (
        "import torch\n"
        "torch.openreg.manual_seed_all(21)\n"
        "assert not torch.openreg.is_initialized()\n"
        "a = torch.rand(4, device='openreg:1').cpu()\n"
        "b = torch.rand(4, generator=torch.Generator().manual_seed(21))\n"
        "assert torch.equal(a, b), (a, b)\n"
        "print('ok')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_rng_api_surface():
    for name in ("manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state",
                 "set_rng_state", "get_rng_state_all", "set_rng_state_all", "default_generators"):
        assert hasattr(torch.openreg, name), name
        assert name in torch.openreg.__all__, name
