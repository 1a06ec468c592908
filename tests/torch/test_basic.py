"""The first things a user does: make a tensor on openreg, compute, print, bring it back."""

from __future__ import annotations

import torch


def test_readme_example():
    x = torch.tensor([1.0, 2.0, 3.0], device="openreg")
    y = x + 2
    assert y.device == torch.device("openreg", 0)
    assert "device='openreg:0'" in repr(y)
    back = y.cpu()
    assert back.device.type == "cpu"
    torch.testing.assert_close(back, torch.tensor([3.0, 4.0, 5.0]))


def test_device_type_is_openreg():
    t = torch.ones(2, device="openreg")
    assert t.device.type == "openreg"
    assert t.device.index == 0
    assert t.is_openreg
    assert torch._C._get_privateuse1_backend_name() == "openreg"


def test_is_available():
    assert torch.openreg.is_available() is True
    assert torch.openreg.device_count() >= 1


def test_repr_of_openreg_tensor_shows_values():
    t = torch.arange(4, device="openreg")
    text = repr(t)
    assert "tensor([0, 1, 2, 3], device='openreg:0')" == text


def test_roundtrip_keeps_values_and_dtype():
    src = torch.randn(3, 5, dtype=torch.float64)
    dev = src.to("openreg")
    assert dev.dtype == torch.float64
    assert dev.shape == (3, 5)
    torch.testing.assert_close(dev.cpu(), src, rtol=0, atol=0)


def test_item_and_tolist():
    t = torch.tensor([[1, 2], [3, 4]], device="openreg")
    assert t.sum().item() == 10
    assert t.tolist() == [[1, 2], [3, 4]]
    assert float(torch.tensor(2.5, device="openreg")) == 2.5
    assert bool(torch.tensor(True, device="openreg"))


def test_autoload_and_exit_with_work_still_queued(run_python):
    """``import torch`` alone loads openreg; leaving with work still queued on a stream exits cleanly."""
    code = (
        "import sys, torch\n"
        "t = torch.ones(1, device='openreg')\n"
        "assert 'torch_openreg' in sys.modules\n"
        "print(t.device, (t + 1).cpu().item())\n"
        "s = torch.openreg.Stream()\n"
        "big = torch.randn(256, 256, device='openreg')\n"
        "with torch.openreg.stream(s):\n"
        "    y = big\n"
        "    for _ in range(40):\n"
        "        y = torch.tanh(y @ big)\n"
        "print('leaving')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, f"rc={proc.returncode} stderr={proc.stderr}"
    assert proc.stdout.split() == ["openreg:0", "2.0", "leaving"]
    assert "terminate called" not in proc.stderr


def test_autoload_disabled_then_explicit_import(run_python):
    """With TORCH_DEVICE_BACKEND_AUTOLOAD=0 openreg is not registered until ``import torch_openreg``."""
    code = (
        "import sys, torch\n"
        "assert 'torch_openreg' not in sys.modules, 'torch_openreg was imported'\n"
        "assert not hasattr(torch, 'openreg'), 'torch.openreg exists'\n"
        "assert torch._C._get_privateuse1_backend_name() == 'privateuseone'\n"
        "try:\n"
        "    torch.ones(1, device='openreg')\n"
        "except RuntimeError as exc:\n"
        "    print('refused:', exc)\n"
        "else:\n"
        "    raise SystemExit('openreg tensor created with autoload disabled')\n"
        "import torch_openreg\n"
        "print('after import:', (torch.ones(2, device='openreg') * 3).sum().item())\n"
    )
    proc = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("refused:")
    assert lines[-1] == "after import: 6.0"


def test_import_torch_openreg_before_torch(run_python):
    proc = run_python("import torch_openreg\nimport torch\nprint(torch.ones(1, device='openreg').device)\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "openreg:0"
