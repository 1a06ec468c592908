"""The host's Python work, counted for the timing model: what a real eager step spends outside its
operators (``nn.Module.__call__``, an optimizer's bookkeeping, autocast) is Python function calls.

While ``simulate`` runs, a profile function (``sys.setprofile``, the calling thread) counts the calls
the program makes into PyTorch's Python code (``torch.nn``, ``torch.optim``, ``torch.autograd``, ...) and
charges each the profile's ``host_us["python"]`` on the simulated host. The program's own functions are
not counted (a benchmark's step function costs next to nothing), nor the simulator's own calls
(``openreg``, ``torch_openreg``, and whatever they call).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import torch

import openreg

_OWN = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep for m in (openreg,))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_PROGRAMS = (os.path.join("torch_openreg", "timing", "workloads.py"),)  # the standard workloads: programs
_own_codes: dict = {}


def _kind(code) -> int:
    """1: the simulator's own code, 2: PyTorch's Python code, 0: the program's."""
    kind = _own_codes.get(code)
    if kind is None:
        name = code.co_filename
        own = (name.startswith(_OWN) or "torch_openreg" + os.sep in name) and not name.endswith(_PROGRAMS)
        kind = 1 if own else 2 if name.startswith(_TORCH) else 0
        _own_codes[code] = kind
    return kind


class Counter:
    """A ``sys.setprofile`` function: every Python call of the program costs the simulated host."""

    def __init__(self) -> None:
        self.inside = 0  # depth of the simulator's own frames on the stack
        self.calls = 0
        self.previous: Callable | None = None

    def __call__(self, frame, event: str, arg) -> None:
        if event == "call":
            if self.inside:
                self.inside += 1
                return
            kind = _kind(frame.f_code)
            if kind == 1:
                self.inside += 1
            elif kind == 2:
                self.calls += 1
                openreg.timing.host_spends("python")
        elif event == "return" and self.inside:
            self.inside -= 1

    def start(self) -> bool:
        """Install it, unless a profiler or debugger holds the hook already (then nothing is counted)."""
        if sys.getprofile() is not None:
            return False
        sys.setprofile(self)
        return True

    def stop(self) -> None:
        if sys.getprofile() is self:
            sys.setprofile(None)
