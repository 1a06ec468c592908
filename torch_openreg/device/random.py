"""Random number state of the openreg devices (``torch.cuda.random``'s surface).

Each device has a default generator (created by the bridge). As in CUDA, calls that change the state
before the device is initialized (seeding, ``set_rng_state``) are queued and applied at
initialization, and calls that read it (``get_rng_state``, ``initial_seed``) initialize the device
first, so a read always sees the seeds set before it, in either order.
"""

from __future__ import annotations

from typing import Any

import torch

import openreg
from torch_openreg import _C

from .state import _index, _lazy_call, _lazy_init


# LITERALINCLUDE START: RANDOM STATE
class _DefaultGenerators(tuple):
    """``torch.openreg.default_generators``: one ``torch.Generator`` per device."""


default_generators = _DefaultGenerators(_C._default_generator(i) for i in range(openreg.device_count()))


def _device_index(device: Any) -> int:
    """The index ``device`` names, without initializing (``"openreg"``: the calling thread's current device)."""
    if isinstance(device, str):
        device = torch.device(device)
    if isinstance(device, torch.device) and device.type == "openreg" and device.index is None:
        return openreg.get_device()
    index = _index(device)
    if not 0 <= index < len(default_generators):
        raise ValueError(f"invalid openreg device {device!r}: openreg has {len(default_generators)} device(s)")
    return index


def _queue(fn, *, seed_all: bool = False) -> None:
    """Run ``fn`` now if initialized, else at initialization, in program order (``_lazy_call``).

    A queued call that seeds every device supersedes the state calls queued before it, so seeding in
    a loop before initialization does not grow the queue (CUDA keeps only the last seed for that).
    """
    _lazy_call(fn, rng="all" if seed_all else "one")


def get_rng_state(device: Any = "openreg") -> torch.Tensor:
    """The RNG state of a device as a CPU ByteTensor (initializes the device, applying queued seeds)."""
    _lazy_init()
    return default_generators[_device_index(device)].get_state()


def get_rng_state_all() -> list[torch.Tensor]:
    """RNG states of all devices."""
    return [get_rng_state(i) for i in range(len(default_generators))]


def set_rng_state(new_state: torch.Tensor, device: Any = "openreg") -> None:
    """Restore a device's RNG state (queued until initialization)."""
    if not isinstance(new_state, torch.Tensor) or new_state.dtype != torch.uint8 or new_state.device.type != "cpu":
        raise TypeError("set_rng_state expects a CPU torch.ByteTensor from get_rng_state, got "
                        f"{type(new_state).__name__}" + (f" of {new_state.dtype} on {new_state.device}"
                                                         if isinstance(new_state, torch.Tensor) else ""))
    state = new_state.clone(memory_format=torch.contiguous_format)
    index = _device_index(device)
    _queue(lambda: default_generators[index].set_state(state))


def set_rng_state_all(new_states: list[torch.Tensor]) -> None:
    """Restore the RNG states of all devices."""
    for i, state in enumerate(new_states):
        set_rng_state(state, i)


def manual_seed(seed: int) -> None:
    """Seed the current device's generator (queued until initialization)."""
    seed = int(seed)
    index = _device_index("openreg")
    _queue(lambda: default_generators[index].manual_seed(seed))


def manual_seed_all(seed: int) -> None:
    """Seed every device's generator (queued until initialization)."""
    seed = int(seed)
    _queue(lambda: [g.manual_seed(seed) for g in default_generators], seed_all=True)


def seed() -> None:
    """Seed the current device's generator with a non-deterministic number."""
    index = _device_index("openreg")
    _queue(lambda: default_generators[index].seed())


def seed_all() -> None:
    """Seed every device's generator with one non-deterministic number."""

    def run() -> None:
        value = default_generators[0].seed()
        for g in default_generators[1:]:
            g.manual_seed(value)

    _queue(run, seed_all=True)


def initial_seed() -> int:
    """The current device's seed (initializes the device, applying queued seeds)."""
    _lazy_init()
    return default_generators[_device_index(None)].initial_seed()
# LITERALINCLUDE END: RANDOM STATE


def _get_rng_state_offset(device: Any = "openreg") -> int:
    """CUDA's Philox offset: openreg's generator has none, and says so (``Generator.get_offset``)."""
    _lazy_init()
    return default_generators[_device_index(device)].get_offset()


def _set_rng_state_offset(offset: int, device: Any = "openreg") -> None:
    """CUDA's Philox offset: openreg's generator has none, and says so (``Generator.set_offset``)."""
    _lazy_init()
    default_generators[_device_index(device)].set_offset(offset)
