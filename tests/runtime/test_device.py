"""Devices: count and capacity from the environment, sizes, properties, the thread-local current device."""

from __future__ import annotations

import dataclasses
import os
import threading

import pytest

import openreg
from openreg.errors import ErrorCode, OpenRegError
from openreg.settings import parse_size

GiB = 1 << 30
MiB = 1 << 20


# -- configuration, read once at import: check it in fresh interpreters ---------------------------


def test_default_configuration(run_python):
    proc = run_python("import openreg; print(openreg.device_count(), openreg.device_capacity(0))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2", str(4 * GiB)]


@pytest.mark.parametrize("count", [1, 3, 5])
def test_device_count_from_environment(run_python, count):
    code = (
        "import openreg\n"
        "print(openreg.device_count())\n"
        f"openreg.get_device_properties({count - 1})\n"
        "try:\n"
        f"    openreg.get_device_properties({count})\n"
        "except openreg.OpenRegError as e:\n"
        "    print(e.code.name)\n"
    )
    proc = run_python(code, env={"OPENREG_DEVICE_COUNT": str(count)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(count), "INVALID_DEVICE"]


def test_device_memory_from_environment(run_python):
    code = (
        "import openreg\n"
        "for d in range(openreg.device_count()):\n"
        "    print(openreg.device_capacity(d), openreg.get_device_properties(d).total_memory,"
        " *openreg.mem_get_info(d))\n"
    )
    proc = run_python(code, env={"OPENREG_DEVICE_MEMORY": "512MiB", "OPENREG_DEVICE_COUNT": "2"})
    assert proc.returncode == 0, proc.stderr
    expected = " ".join([str(512 * MiB)] * 4)
    assert proc.stdout.splitlines() == [expected, expected]


@pytest.mark.parametrize(
    "name, value",
    [("OPENREG_DEVICE_COUNT", "two"), ("OPENREG_DEVICE_COUNT", "-1"), ("OPENREG_DEVICE_MEMORY", "lots")],
)
def test_bad_configuration_fails_at_import(run_python, name, value):
    proc = run_python("import openreg", env={name: value})
    assert proc.returncode == 1
    assert "OpenRegError" in proc.stderr and "INVALID_VALUE" in proc.stderr
    assert repr(value) in proc.stderr


def test_zero_devices(run_python):
    code = (
        "import openreg\n"
        "print(openreg.device_count())\n"
        "try:\n"
        "    openreg.set_device(0)\n"
        "except openreg.OpenRegError as e:\n"
        "    print(e.code.name, e.message)\n"
    )
    proc = run_python(code, env={"OPENREG_DEVICE_COUNT": "0"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["0", "INVALID_DEVICE invalid device ordinal 0: openreg has 0 device(s)"]


def test_in_process_configuration_matches_environment():
    assert openreg.device_count() == int(os.environ.get("OPENREG_DEVICE_COUNT", "2"))
    assert openreg.device_capacity(0) == parse_size(os.environ.get("OPENREG_DEVICE_MEMORY", "4GiB"))


# -- sizes ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, size",
    [
        ("1048576", 1048576),
        ("0", 0),
        ("10B", 10),
        ("1k", 1024),
        ("2K", 2048),
        ("2KiB", 2048),
        ("512M", 512 * MiB),
        ("512MiB", 512 * MiB),
        ("512mb", 512 * MiB),
        ("4GiB", 4 * GiB),
        ("4G", 4 * GiB),
        (" 3 GiB ", 3 * GiB),
        ("1TiB", 1 << 40),
    ],
)
def test_parse_size(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "GiB", "-1", "1.5G", "4 PiB", "four", "4GiBs"])
def test_parse_size_rejects(text):
    with pytest.raises(OpenRegError) as info:
        parse_size(text)
    assert info.value.code == ErrorCode.INVALID_VALUE
    assert repr(text) in info.value.message


# -- properties ----------------------------------------------------------------------------------


def test_properties():
    for index in range(openreg.device_count()):
        props = openreg.get_device_properties(index)
        assert props.index == index
        assert props.name == "OpenReg Simulated Device"
        assert props.total_memory == openreg.device_capacity(index) == openreg.mem_get_info(index)[1]
        assert (props.major, props.minor) == (1, 0)
        assert props.multi_processor_count == (os.cpu_count() or 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        props.total_memory = 1


# -- the current device --------------------------------------------------------------------------


def test_set_and_exchange_device(two_devices):
    assert openreg.get_device() == 0
    openreg.set_device(1)
    assert openreg.get_device() == 1
    assert openreg.exchange_device(0) == 1
    assert openreg.get_device() == 0
    assert openreg.exchange_device(0) == 0
    assert openreg.get_device() == 0


def test_current_device_is_thread_local(two_devices):
    openreg.set_device(1)
    seen = {}

    def worker():
        seen["initial"] = openreg.get_device()  # a fresh thread starts on device 0
        openreg.set_device(1)
        seen["after_set"] = openreg.get_device()
        openreg.set_device(0)
        seen["final"] = openreg.get_device()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    assert seen == {"initial": 0, "after_set": 1, "final": 0}
    assert openreg.get_device() == 1  # the worker's set_device(0) did not leak into this thread


def test_new_thread_starts_on_device_zero_even_if_main_moved(two_devices):
    openreg.set_device(1)
    seen = []
    thread = threading.Thread(target=lambda: seen.append(openreg.get_device()))
    thread.start()
    thread.join()
    assert seen == [0]


@pytest.mark.parametrize("bad", [-1, "count", 99, True, "0", 1.0, None])
def test_invalid_device(bad):
    if bad == "count":
        bad = openreg.device_count()
    with pytest.raises(OpenRegError) as info:
        openreg.set_device(bad)
    err = info.value
    assert err.code == ErrorCode.INVALID_DEVICE
    assert int(err.code) == 101  # cudaErrorInvalidDevice
    assert f"invalid device ordinal {bad!r}" in err.message
    assert f"openreg has {openreg.device_count()} device(s)" in err.message
    assert str(err).startswith("openreg error INVALID_DEVICE (101): ")
    assert openreg.get_device() == 0  # a failed set leaves the current device alone


def test_invalid_device_everywhere():
    bad = openreg.device_count()
    calls = [
        lambda: openreg.get_device_properties(bad),
        lambda: openreg.device_capacity(bad),
        lambda: openreg.exchange_device(bad),
        lambda: openreg.malloc(16, bad),
        lambda: openreg.memory_used(bad),
        lambda: openreg.mem_get_info(bad),
        lambda: openreg.Stream(bad),
        lambda: openreg.default_stream(bad),
        lambda: openreg.current_stream(bad),
        lambda: openreg.get_stream(bad, 0),
        lambda: openreg.synchronize(bad),
        lambda: openreg.Event(device=bad),
    ]
    for call in calls:
        with pytest.raises(OpenRegError) as info:
            call()
        assert info.value.code == ErrorCode.INVALID_DEVICE
        assert f"ordinal {bad}" in info.value.message
    assert openreg.get_device() == 0


def test_error_type():
    err = OpenRegError(ErrorCode.OUT_OF_MEMORY, "details")
    assert isinstance(err, RuntimeError)
    assert err.code is ErrorCode.OUT_OF_MEMORY and err.message == "details"
    assert str(err) == "openreg error OUT_OF_MEMORY (2): details"
    assert OpenRegError(719, "x").code is ErrorCode.LAUNCH_FAILURE
