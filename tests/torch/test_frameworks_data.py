"""Data around training on openreg: safetensors files, torchmetrics metrics, DataLoader pinning and workers.

Each result is compared with the CPU's (docs/frameworks.md).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from torch.testing import assert_close

pytest.importorskip("safetensors")
torchmetrics = pytest.importorskip("torchmetrics")

import safetensors  # noqa: E402
import safetensors.torch  # noqa: E402
from safetensors import SafetensorError  # noqa: E402

from torch_openreg.integrations import safetensors as openreg_safetensors  # noqa: E402


def _tensors(device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    cpu = {
        "weight": torch.randn(5, 3, generator=g),
        "half": torch.randn(4, generator=g).bfloat16(),
        "ids": torch.randint(0, 100, (2, 3), generator=g),
        "mask": torch.rand(6, generator=g) > 0.5,
    }
    return {k: v.to(device) for k, v in cpu.items()}


# LITERALINCLUDE START: TEST SAFETENSORS
def test_safetensors_round_trip(tmp_path, two_devices):
    tensors = _tensors("openreg")
    path = tmp_path / "t.safetensors"
    safetensors.torch.save_file(tensors, path)  # saving needs nothing: the bytes are the CPU's
    assert path.read_bytes() == safetensors.torch.save(_tensors("cpu"))
    for device, expected in (("openreg", "openreg:0"), ("openreg:1", "openreg:1"),
                             (torch.device("openreg", 1), "openreg:1"), (1, "openreg:1"), ("cpu", "cpu")):
        loaded = openreg_safetensors.load_file(path, device)
        assert loaded.keys() == tensors.keys()
        for k, v in loaded.items():
            assert v.device == torch.device(expected) and v.dtype == tensors[k].dtype, k
            assert_close(v.cpu(), tensors[k].cpu(), rtol=0, atol=0)


def test_upstream_names_refused_and_the_index_route(tmp_path):
    """safetensors' Rust side lists device names; a bare index goes to PyTorch's current accelerator."""
    path = tmp_path / "t.safetensors"
    safetensors.torch.save_file(_tensors("cpu"), path)
    for name in ("openreg", "openreg:0", torch.device("openreg", 0)):
        with pytest.raises(SafetensorError, match="is invalid"):
            safetensors.torch.load_file(path, device=name)
    assert {v.device for v in safetensors.torch.load_file(path, device=0).values()} == {torch.device("openreg", 0)}
# LITERALINCLUDE END: TEST SAFETENSORS


def test_safe_open_reads_tensors_and_slices_onto_openreg(tmp_path):
    tensors = _tensors("cpu")
    path = tmp_path / "t.safetensors"
    safetensors.torch.save_file(tensors, path)
    with openreg_safetensors.safe_open(path, "openreg:0") as f:
        weight = f.get_tensor("weight")
        part = f.get_slice("weight")[1:4, :2]
    assert weight.device == part.device == torch.device("openreg", 0)
    assert_close(weight.cpu(), tensors["weight"], rtol=0, atol=0)
    assert_close(part.cpu(), tensors["weight"][1:4, :2], rtol=0, atol=0)


def test_load_model_onto_openreg(tmp_path):
    torch.manual_seed(0)
    cpu = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    path = tmp_path / "m.safetensors"
    safetensors.torch.save_model(cpu, path)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3)).to("openreg")
    safetensors.torch.load_model(model, path, device=openreg_safetensors.device_argument("openreg"))
    x = torch.randn(2, 4)
    assert_close(model(x.to("openreg")).cpu(), cpu(x))


@pytest.mark.parametrize("device,error,message", [
    ("openreg:7", ValueError, "openreg:7: openreg has"),
    ("openreg:-1", RuntimeError, "Invalid device string"),
    ("nonsense", RuntimeError, "Expected one of"),
])
def test_bad_devices_get_clear_errors(tmp_path, device, error, message, no_leak):
    path = tmp_path / "t.safetensors"
    safetensors.torch.save_file(_tensors("cpu"), path)
    with pytest.raises(error, match=message):
        openreg_safetensors.load_file(path, device)


# LITERALINCLUDE START: TEST TORCHMETRICS
def _metrics() -> torchmetrics.MetricCollection:
    return torchmetrics.MetricCollection({
        "accuracy": torchmetrics.classification.MulticlassAccuracy(num_classes=5),
        "f1": torchmetrics.classification.MulticlassF1Score(num_classes=5, average="macro"),
        "auroc": torchmetrics.classification.MulticlassAUROC(num_classes=5, thresholds=None),  # list states
        "confusion": torchmetrics.classification.MulticlassConfusionMatrix(num_classes=5),
        "calibration": torchmetrics.classification.MulticlassCalibrationError(num_classes=5),
    })


def test_torchmetrics_accumulate_on_openreg_like_the_cpu(no_leak):
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 5, generator=g).softmax(-1), torch.randint(0, 5, (16,), generator=g)) for _ in range(4)]
    cpu, dev = _metrics(), _metrics().to("openreg")
    cpu_mse = torchmetrics.regression.MeanSquaredError()
    dev_mse = torchmetrics.regression.MeanSquaredError().to("openreg")
    for probs, target in batches:
        cpu.update(probs, target)
        cpu_mse.update(probs[:, 0], target / 4)
        probs, target = probs.to("openreg"), target.to("openreg")
        dev.update(probs, target)
        dev_mse.update(probs[:, 0], target / 4)
    expected, result = {**cpu.compute(), "mse": cpu_mse.compute()}, {**dev.compute(), "mse": dev_mse.compute()}
    assert expected.keys() == result.keys()
    for name, value in result.items():
        assert value.device.type == "openreg", name
        assert_close(value.cpu(), expected[name], msg=name)
    del dev, dev_mse, result, value
# LITERALINCLUDE END: TEST TORCHMETRICS


# LITERALINCLUDE START: TEST DATALOADER
def test_dataloader_pins_batches_and_spawned_workers_keep_the_order():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(24, 3, generator=g), torch.arange(24)
    dataset = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(dataset, batch_size=4, pin_memory=True, num_workers=2,
                                         multiprocessing_context="spawn")
    batches = []
    for xb, yb in loader:
        assert xb.is_pinned() and yb.is_pinned()  # pinned by openreg's host allocator (the current accelerator)
        batches.append((xb.to("openreg", non_blocking=True), yb.to("openreg", non_blocking=True)))
    assert_close(torch.cat([b[0] for b in batches]).cpu(), x, rtol=0, atol=0)
    assert_close(torch.cat([b[1] for b in batches]).cpu(), y, rtol=0, atol=0)
# LITERALINCLUDE END: TEST DATALOADER


def test_import_torch_loads_no_framework():
    """The frameworks are optional: ``import torch`` (which loads openreg) imports none of them nor the integrations."""
    code = ("import sys, torch; torch.ones(1, device='openreg'); "
            "print(sorted(m for m in ('lightning', 'transformers', 'accelerate', 'torchmetrics', 'safetensors', "
            "'torch_openreg.integrations') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
