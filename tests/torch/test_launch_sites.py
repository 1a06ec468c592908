"""A torch-side launch site reaches the optional features without reading their switches: it hands the launch
a function that lists what it writes or prices it, and only a feature that is on calls it (issue 31)."""

from __future__ import annotations

import torch

import openreg
from torch_openreg.aten.launch import host_view, launch


def _add_one(v: torch.Tensor) -> None:
    v.add_(1)


def test_a_launch_asks_what_it_writes_only_while_the_sanitizer_is_on():
    t = torch.zeros(4, device="openreg")
    asked = []

    def writes() -> list:
        asked.append(1)
        return [t]

    with openreg.sanitizer.sanitizing(False):
        launch(0, _add_one, host_view(t), tensors=(t,), name="k", writes=writes)
        torch.openreg.synchronize()
    assert asked == []
    with openreg.sanitizer.sanitizing(True):
        launch(0, _add_one, host_view(t), tensors=(t,), name="k", writes=writes)
        torch.openreg.synchronize()
    assert asked == [1]
    torch.testing.assert_close(t.cpu(), torch.full((4,), 2.0))


def test_a_launch_is_priced_by_its_sites_function_only_while_the_timing_model_prices():
    t = torch.zeros(4, device="openreg")
    priced = []
    previous = openreg.timing.set_profile(None)
    try:
        launch(0, _add_one, host_view(t), tensors=(t,), name="k", cost=lambda *a: priced.append(a), cost_args=(7,))
        torch.openreg.synchronize()
        assert priced == []
        openreg.timing.set_profile("h100-sxm")
        launch(0, _add_one, host_view(t), tensors=(t,), name="k", cost=lambda *a: priced.append(a), cost_args=(7,))
        torch.openreg.synchronize()
        assert priced == [(7,)]
    finally:
        openreg.timing.set_profile(previous)
    torch.testing.assert_close(t.cpu(), torch.full((4,), 2.0))
