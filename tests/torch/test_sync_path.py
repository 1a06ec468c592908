"""The synchronous path: small results read back without a kernel and without opening device pages."""

from __future__ import annotations

import pytest
import torch

import openreg
from openreg import memory


@pytest.fixture
def grants(monkeypatch):
    """Every page range the runtime opens to the host, from now on."""
    opened = []
    real = memory.grant

    def counting(spans):
        opened.extend(spans)
        real(spans)

    monkeypatch.setattr(memory, "grant", counting)
    return opened


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.bool, torch.complex64])
def test_contiguous_reads_open_no_page(dtype, grants, no_leak):
    if not openreg.copy._engine.available:
        pytest.skip("no copy engine here (/proc/self/mem cannot be opened): copies run as kernels")
    x = (torch.randn(3, 5) * 4).to(dtype)
    d = x.to("openreg")
    torch.openreg.synchronize()
    grants.clear()
    got, row, item = d.cpu(), d[1].cpu(), d[2, 3].item()
    assert grants == []
    torch.testing.assert_close(got, x, rtol=0, atol=0)
    torch.testing.assert_close(row, x[1], rtol=0, atol=0)
    assert item == x[2, 3].item()


def test_a_read_after_queued_work_sees_it_and_leaves_the_pages_closed(grants, no_leak):
    a = torch.arange(16.0, device="openreg")
    b = (a * 2 + 1).sum()  # queued kernels: the read runs them first
    assert b.item() == float((torch.arange(16.0) * 2 + 1).sum())
    torch.testing.assert_close((a + a).cpu(), torch.arange(16.0) * 2)
    assert grants  # the kernels had their pages opened ...
    assert all(not span[0].open for span in grants)  # ... and closed again by the time the host had its result
