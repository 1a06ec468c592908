"""torch.save / torch.load of openreg tensors, modules, optimizer state, map_location (metadata: test_backend_meta)."""

from __future__ import annotations

import io
import pickle
import zipfile

import pytest
import torch
from torch.testing import assert_close


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def test_tensor_roundtrip_keeps_device_dtype_and_values():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.complex64):
        cpu = (torch.randn(3, 4) * 10).to(dtype)
        x = cpu.to("openreg")
        y = _roundtrip(x)
        assert y.device == torch.device("openreg", 0) and y.dtype == dtype
        assert_close(y.cpu(), cpu)


def test_views_share_storage_after_load():
    base = torch.arange(10.0, device="openreg")
    view = base[2:6]
    a, b = _roundtrip([base, view])
    assert b.untyped_storage().data_ptr() == a.untyped_storage().data_ptr()
    assert b.storage_offset() == 2
    b.fill_(0)
    assert_close(a.cpu()[2:6], torch.zeros(4))


def test_storage_location_tags(two_devices, tmp_path):
    path = tmp_path / "t.pt"
    torch.save({"a": torch.ones(2, device="openreg:0"), "b": torch.ones(2, device="openreg:1")}, path)
    with zipfile.ZipFile(path) as z:
        pkl = next(n for n in z.namelist() if n.endswith("data.pkl"))
        data = z.read(pkl)
    assert b"openreg:0" in data and b"openreg:1" in data  # persistent ids carry the location tag
    assert torch.serialization.location_tag(torch.ones(1, device="openreg:1").untyped_storage()) == "openreg:1"
    loaded = torch.load(path)
    assert loaded["a"].device == torch.device("openreg", 0)
    assert loaded["b"].device == torch.device("openreg", 1)


@pytest.mark.parametrize(("map_location", "expected"), [
    ("cpu", "cpu"), ("openreg", "openreg:0"), ("openreg:1", "openreg:1"), (torch.device("openreg", 1), "openreg:1"),
    ({"openreg:0": "openreg:1"}, "openreg:1"), (lambda storage, location: storage.cpu(), "cpu"),
])
def test_map_location(two_devices, map_location, expected):
    x = torch.arange(6.0, device="openreg:0")
    y = _roundtrip(x, map_location=map_location)
    assert y.device == torch.device(expected)
    assert_close(y.cpu(), torch.arange(6.0))


def test_cpu_checkpoint_to_openreg():
    y = _roundtrip(torch.arange(3.0), map_location="openreg")
    assert y.device.type == "openreg"
    assert_close(y.cpu(), torch.arange(3.0))


def test_weights_only_load():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("openreg")
    state = _roundtrip(model.state_dict(), weights_only=True)
    assert all(v.device.type == "openreg" for v in state.values())
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3)).to("openreg")
    fresh.load_state_dict(state)
    for (k, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert_close(a.cpu(), b.cpu(), msg=k)


def test_whole_module_roundtrip():
    model = torch.nn.Linear(3, 2).to("openreg")
    loaded = _roundtrip(model, weights_only=False)
    assert loaded.weight.device.type == "openreg"
    x = torch.randn(4, 3, device="openreg")
    assert_close(loaded(x).cpu(), model(x).cpu())


def test_optimizer_state_roundtrip_resumes_identically():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to("openreg")
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4, device="openreg"), torch.randn(8, 1, device="openreg")

    def step(m, o):
        o.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        o.step()

    step(model, opt)
    ckpt = _roundtrip({"model": model.state_dict(), "opt": opt.state_dict()}, weights_only=True)
    exp_avg = ckpt["opt"]["state"][0]["exp_avg"]
    assert exp_avg.device.type == "openreg"
    model2 = torch.nn.Linear(4, 1).to("openreg")
    model2.load_state_dict(ckpt["model"])
    opt2 = torch.optim.Adam(model2.parameters(), lr=0.1)
    opt2.load_state_dict(ckpt["opt"])
    step(model, opt)
    step(model2, opt2)
    assert_close(model2.weight.cpu(), model.weight.cpu())


def test_pickle_of_openreg_tensor():
    x = torch.arange(3.0, device="openreg")
    y = pickle.loads(pickle.dumps(x))
    assert y.device.type == "openreg"
    assert_close(y.cpu(), x.cpu())


def test_load_without_the_backend_is_a_clear_error(run_python, tmp_path):
    path = tmp_path / "ckpt.pt"
    torch.save({"w": torch.ones(2, device="openreg")}, path)
    code = (
        "import torch\n"
        "assert not hasattr(torch, 'openreg')\n"
        f"torch.load({str(path)!r})\n"
    )
    proc = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last == ("RuntimeError: don't know how to restore data location of torch.storage.UntypedStorage "
                    "(tagged with openreg:0)"), proc.stderr
    # with map_location the same checkpoint loads on a machine without openreg
    code = (
        "import torch\n"
        f"print(torch.load({str(path)!r}, map_location='cpu')['w'].tolist())\n"
    )
    proc = run_python(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[1.0, 1.0]"


def test_load_on_a_missing_device_index(two_devices, run_python, tmp_path):
    path = tmp_path / "on1.pt"
    torch.save(torch.ones(2, device="openreg:1"), path)
    proc = run_python(f"import torch\ntorch.load({str(path)!r})\n", env={"OPENREG_DEVICE_COUNT": "1"})
    assert proc.returncode != 0
    assert ("Attempting to deserialize object on OPENREG device 1 but torch.openreg.device_count() is 1"
            in proc.stderr), proc.stderr
    proc = run_python(f"import torch\nprint(torch.load({str(path)!r}, map_location='openreg:0').device)\n",
                      env={"OPENREG_DEVICE_COUNT": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "openreg:0"
