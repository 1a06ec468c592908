"""Seeding before the device is initialized: each case runs in a process of its own.

In a new process ``torch.openreg`` is not initialized until the first openreg tensor (or a call that
reads device state). Seeds and states set before that are queued and applied at initialization, in
program order; reads (``get_rng_state``, ``initial_seed``, ``fork_rng``) initialize first. Every case
compares the numbers with the CPU's for the same seed (openreg generators keep a CPU state).
"""

from __future__ import annotations

import json
import textwrap

import pytest

PRELUDE = """
import warnings
import torch
from torch.testing import assert_close

def cpu(seed, n=4):
    return torch.rand(n, generator=torch.Generator().manual_seed(seed))

def dev(index=0, n=4):
    return torch.rand(n, device=f"openreg:{index}").cpu()

assert not torch.openreg.is_initialized()
"""

# LITERALINCLUDE START: TEST RNG BEFORE INIT
CASES = {
    "fork_rng restores a seed set before init": """
        torch.openreg.manual_seed(11)
        assert not torch.openreg.is_initialized()  # seeding is queued, it does not start the device
        with torch.random.fork_rng(device_type="openreg", devices=[0]):
            inside = dev()
        after = dev()
        assert_close(inside, cpu(11), rtol=0, atol=0)
        assert_close(after, inside, rtol=0, atol=0)  # fork_rng restored the seeded state
    """,
    "fork_rng without devices (all of them, with PyTorch's warning)": """
        torch.openreg.manual_seed_all(12)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with torch.random.fork_rng(device_type="openreg"):
                inside = [dev(0), dev(1)]
        assert any("available devices" in str(w.message) for w in caught)
        assert_close([dev(0), dev(1)], inside, rtol=0, atol=0)
        assert_close(inside, [cpu(12), cpu(12)], rtol=0, atol=0)
    """,
    "torch.manual_seed before init": """
        torch.manual_seed(13)
        assert_close(dev(1), cpu(13), rtol=0, atol=0)
    """,
    "manual_seed_all then manual_seed": """
        torch.openreg.manual_seed_all(7)
        torch.openreg.manual_seed(5)  # current device only
        assert_close([dev(0), dev(1)], [cpu(5), cpu(7)], rtol=0, atol=0)
    """,
    "manual_seed then manual_seed_all": """
        torch.openreg.manual_seed(5)
        torch.openreg.manual_seed_all(7)
        assert_close([dev(0), dev(1)], [cpu(7), cpu(7)], rtol=0, atol=0)
    """,
    "get_rng_state sees the queued seed": """
        torch.openreg.manual_seed(3)
        state = torch.openreg.get_rng_state(0)  # an index, as fork_rng passes it
        assert torch.openreg.is_initialized()
        assert torch.equal(state, torch.Generator().manual_seed(3).get_state())
        assert torch.equal(torch.openreg.get_rng_state_all()[0], state)
    """,
    "set_rng_state then manual_seed": """
        torch.openreg.set_rng_state(torch.Generator().manual_seed(9).get_state())
        torch.openreg.manual_seed(1)
        assert_close(dev(), cpu(1), rtol=0, atol=0)
    """,
    "manual_seed then set_rng_state": """
        torch.openreg.manual_seed(1)
        torch.openreg.set_rng_state(torch.Generator().manual_seed(9).get_state())
        torch.openreg.set_rng_state(torch.Generator().manual_seed(8).get_state(), 1)
        assert_close([dev(0), dev(1)], [cpu(9), cpu(8)], rtol=0, atol=0)
    """,
    "initial_seed after a queued seed": """
        torch.openreg.manual_seed_all(42)
        assert torch.openreg.initial_seed() == 42
        assert_close(dev(), cpu(42), rtol=0, atol=0)
    """,
    "seed and seed_all before init": """
        torch.openreg.seed()
        first = torch.openreg.initial_seed()
        assert first != torch.Generator().initial_seed()  # not the default seed any more
        assert_close(dev(), cpu(first), rtol=0, atol=0)
        torch.openreg.seed_all()
        with torch.openreg.device(1):
            assert torch.openreg.initial_seed() == torch.openreg.default_generators[0].initial_seed() != first
    """,
    "seeding in a loop before init keeps the queue short": """
        import torch_openreg.device as module
        for i in range(1000):
            torch.openreg.manual_seed_all(i)
        assert len(module._queued_calls) <= 2
        assert_close(dev(1), cpu(999), rtol=0, atol=0)
    """,
}
# LITERALINCLUDE END: TEST RNG BEFORE INIT


def _script(body: str) -> str:
    return PRELUDE + textwrap.dedent(body) + "\nprint('ok')\n"


# One interpreter imports torch (which loads openreg without initializing it), then forks a child per
# case: each child starts from that pristine state, as a new process would, without paying the import.
FORK_EACH = """
import json, os, traceback
import torch
assert not torch.openreg.is_initialized()
cases = json.loads(CASES_JSON)
results = {}
for name, code in cases.items():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            exec(compile(code, name, "exec"), {"__name__": "__case__"})
            report = "ok"
        except BaseException:
            report = traceback.format_exc()
        os.write(write, report.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        report = pipe.read().decode()
    os.waitpid(pid, 0)
    results[name] = report or "the case's process died"
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def outcomes(run_python) -> dict[str, str]:
    cases = json.dumps({name: PRELUDE + textwrap.dedent(body) for name, body in CASES.items()})
    result = run_python(FORK_EACH.replace("CASES_JSON", repr(cases)), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", sorted(CASES))
def test_before_initialization(name, outcomes):
    assert outcomes[name] == "ok", outcomes[name]


def test_bad_state_is_refused_at_the_call(run_python):
    code = _script("""
        import pytest
        with pytest.raises(TypeError, match="CPU torch.ByteTensor"):
            torch.openreg.set_rng_state(torch.zeros(4))
        with pytest.raises(ValueError, match="invalid openreg device"):
            torch.openreg.set_rng_state(torch.Generator().get_state(), 5)
        assert not torch.openreg.is_initialized()
        with pytest.raises(RuntimeError, match="openreg generators have no offset"):
            torch.openreg._get_rng_state_offset()
    """)
    result = run_python(code, timeout=120)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), result.stderr[-3000:]
