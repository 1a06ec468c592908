"""A vendor's per-tensor metadata (``c10::BackendMeta``) through PyTorch's metadata hooks.

``torch._utils.set_tensor_metadata`` / ``get_tensor_metadata`` reach openreg's registered functions
(``csrc/serialization.cpp``); the metadata follows the tensor through ``detach``, ``torch.save`` /
``torch.load``, ``pickle`` and the fake tensors ``torch.compile`` traces with (``compat.py``). The
data always round-trips exactly as the CPU's does.
"""

from __future__ import annotations

import io
import pickle

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch._subclasses.functional_tensor import FunctionalTensor, FunctionalTensorMode
from torch.testing import assert_close

from torch_openreg import _C

get, set_ = torch._utils.get_tensor_metadata, torch._utils.set_tensor_metadata
# A storage format tag and a layout version, numbers carried in the flags' names (the values are bools).
META = {"openreg_format=29": True, "openreg_version=1": True}


def _roundtrip(obj, **load_kwargs):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, **load_kwargs)


def _tagged(device: str = "openreg", meta: dict = META) -> tuple[torch.Tensor, torch.Tensor]:
    cpu = torch.randn(3, 4)
    t = cpu.to(device)
    set_(t, meta)
    return t, cpu


# LITERALINCLUDE START: TEST BACKEND META
def test_set_and_get_round_trip():
    t = torch.empty(3, 3, device="openreg")
    assert get(t) == {}  # nothing until the vendor sets it, like a CPU tensor
    for meta in (META, {"version_number": True, "format_number": True}, {"channels_last_blocked": False}):
        set_(t, meta)
        assert get(t) == meta
        assert get(t.detach()) == meta  # TensorImpl copies clone the BackendMeta
    set_(t, {})  # no backend entries: the tensor keeps what it has
    assert get(t) == {"channels_last_blocked": False}


def test_pytorchs_own_bits_travel_beside_it():
    x = torch.randn(3, dtype=torch.complex64)
    for t in (x.conj(), x.to("openreg").conj()):
        set_(t, META)
        expected = {"conj": True, **META} if t.device.type == "openreg" else {"conj": True}  # the CPU has no hook
        assert get(t) == expected
    y = torch.randn(3, dtype=torch.complex64, device="openreg")
    set_(y, {"conj": True, **META})
    assert y.is_conj() and get(y) == {"conj": True, **META}


@pytest.mark.parametrize("load", [
    {}, {"weights_only": True}, {"map_location": "openreg:1"}, {"map_location": {"openreg:0": "openreg:1"}},
], ids=["default", "weights_only", "to-openreg:1", "dict"])
def test_save_and_load_keep_it(load, two_devices):
    t, cpu = _tagged()
    plain = torch.randn(2, device="openreg")
    loaded = _roundtrip({"tagged": t, "plain": plain, "view": t[1:]}, **load)
    assert get(loaded["tagged"]) == META and get(loaded["plain"]) == {}
    assert_close(loaded["tagged"].cpu(), cpu, rtol=0, atol=0)
    assert loaded["view"].untyped_storage().data_ptr() == loaded["tagged"].untyped_storage().data_ptr()
# LITERALINCLUDE END: TEST BACKEND META


def test_loading_on_the_cpu_drops_it_and_pickle_keeps_it():
    t, cpu = _tagged()
    on_cpu = _roundtrip(t, map_location="cpu")
    assert on_cpu.device.type == "cpu" and get(on_cpu) == {}  # the CPU has no backend metadata
    assert_close(on_cpu, cpu, rtol=0, atol=0)
    unpickled = pickle.loads(pickle.dumps(t))
    assert get(unpickled) == META
    assert_close(unpickled.cpu(), cpu, rtol=0, atol=0)


def test_copy_backend_meta_clones():
    src, _ = _tagged()
    dst = torch.empty(2, device="openreg")
    _C._copy_backend_meta(src, dst)
    assert get(dst) == META
    set_(src, {"openreg_format=3": True})
    assert get(dst) == META  # a copy, not shared
    _C._copy_backend_meta(torch.empty(1, device="openreg"), dst)
    assert get(dst) == {}
    with pytest.raises(RuntimeError, match="needs an openreg tensor"):
        _C._copy_backend_meta(torch.ones(1), dst)


def test_fake_tensors_carry_it():
    t, _ = _tagged()
    with FakeTensorMode() as mode:
        fake = mode.from_tensor(t)
        plain = mode.from_tensor(torch.empty(2, device="openreg"))
        cpu_fake = mode.from_tensor(torch.empty(2))
    assert isinstance(fake, FakeTensor) and fake.device == t.device
    assert get(fake) == META and get(plain) == {} and get(cpu_fake) == {}

    with FunctionalTensorMode():  # the wrapper has no metadata of its own: the tensor inside does
        functional = FunctionalTensor.to_functional(t)
        assert get(functional) == {}
        with FakeTensorMode() as mode:
            fake = mode.from_tensor(functional)
    assert get(fake) == META


def test_torch_compile_traces_with_it():
    t, cpu = _tagged()
    seen = []

    def backend(gm, example_inputs):
        seen.extend(get(n.meta["example_value"]) for n in gm.graph.nodes if n.op == "placeholder")
        return gm.forward

    out = torch.compile(lambda x: x * 2 + 1, backend=backend)(t)
    assert seen == [META]
    assert_close(out.cpu(), cpu * 2 + 1)
