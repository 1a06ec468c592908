"""Random number state of the openreg devices (``torch.cuda.random``'s surface).

Each device has a default generator (created by the bridge); seeding before
initialization is queued and applied at init, as in CUDA.
"""

from __future__ import annotations

from typing import Any

import torch

import openreg as _rt
from torch_openreg import _C


# LITERALINCLUDE START: RANDOM STATE
class _DefaultGenerators(tuple):
    """``torch.openreg.default_generators``: one ``torch.Generator`` per device."""


default_generators = _DefaultGenerators(_C._default_generator(i) for i in range(_rt.device_count()))


def _gen(device: Any) -> torch.Generator:
    from . import _index

    return default_generators[_index(device)]


def _call(fn) -> None:
    from . import _lazy_call

    _lazy_call(fn)


def get_rng_state(device: Any = "openreg") -> torch.Tensor:
    """The RNG state of a device as a CPU ByteTensor."""
    return _gen(device).get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    """RNG states of all devices."""
    return [g.get_state() for g in default_generators]


def set_rng_state(new_state: torch.Tensor, device: Any = "openreg") -> None:
    """Restore a device's RNG state."""
    state = new_state.clone(memory_format=torch.contiguous_format)
    _call(lambda: _gen(device).set_state(state))


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    """Restore the RNG states of all devices."""
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    """Seed the current device's generator."""
    seed = int(seed)
    _call(lambda: _gen(None).manual_seed(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator."""
    seed = int(seed)
    _call(lambda: [g.manual_seed(seed) for g in default_generators])
# LITERALINCLUDE END: RANDOM STATE


def seed() -> None:
    """Seed the current device's generator with a random number."""
    _call(lambda: _gen(None).seed())


def seed_all() -> None:
    """Seed all generators with one random number."""

    def run() -> None:
        value = default_generators[0].seed()
        for g in default_generators[1:]:
            g.manual_seed(value)

    _call(run)


def initial_seed() -> int:
    """The current device's seed."""
    from . import _lazy_init

    _lazy_init()
    return _gen(None).initial_seed()
