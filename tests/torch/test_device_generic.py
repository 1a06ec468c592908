"""PyTorch's device-generic test machinery, instantiated for openreg through ``PrivateUse1TestBase``.

``instantiate_device_type_tests(..., only_for="openreg")`` turns the generic class below into one
class for the PrivateUse1 device: every ``test_*(self, device, ...)`` gets ``device="openreg:0"``,
``@dtypes`` and ``@ops`` expand it per dtype and operator, ``@deviceCountAtLeast`` hands it every
openreg device, and ``@onlyCUDA`` tests run too because the class sets ``bypass_device_restrictions``.
The last test checks that the generated class is the openreg one and that its tests really ran.
"""

from __future__ import annotations

import unittest

import pytest
import torch
from torch.testing._internal.common_device_type import (
    PrivateUse1TestBase,
    deviceCountAtLeast,
    dtypes,
    instantiate_device_type_tests,
    onlyCUDA,
    ops,
)
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase

from torch_openreg.testing.opinfo import run_sample

# LITERALINCLUDE START: DEVICE GENERIC TESTS
OPS = ("add", "mul", "sum", "mm", "softmax", "index_select", "nonzero", "nn.functional.conv2d")


class TestOpenRegDeviceGeneric(TestCase):
    def test_device_is_openreg(self, device):
        self.assertEqual(torch.device(device).type, "openreg")
        self.assertEqual(torch.ones(2, device=device).device.type, "openreg")

    @dtypes(torch.float32, torch.bfloat16, torch.int64)
    def test_arange_sum(self, device, dtype):
        t = torch.arange(10, device=device, dtype=dtype)
        self.assertEqual(t.sum().cpu(), torch.arange(10, dtype=dtype).sum())

    @deviceCountAtLeast(2)
    def test_copy_between_devices(self, devices):
        a = torch.arange(4.0, device=devices[0])
        self.assertEqual(a.to(devices[1]).cpu(), a.cpu())

    @onlyCUDA  # runs on openreg only because the class sets bypass_device_restrictions
    def test_cuda_only_test_bypassed(self, device):
        self.assertEqual(torch.device(device).type, "openreg")

    @ops([op for op in op_db if op.name in OPS], allowed_dtypes=(torch.float32,))
    def test_matches_cpu(self, device, dtype, op):
        for sample in op.sample_inputs(device, dtype, requires_grad=op.supports_autograd):
            status, message = run_sample(op, sample, dtype, check_grad=op.supports_autograd)
            self.assertIn(status, ("pass", "skip"), message)


instantiate_device_type_tests(TestOpenRegDeviceGeneric, globals(), only_for="openreg")
# LITERALINCLUDE END: DEVICE GENERIC TESTS

GENERATED = [
    c for c in list(globals().values())
    if isinstance(c, type) and issubclass(c, PrivateUse1TestBase) and c is not PrivateUse1TestBase
]
for cls in GENERATED:
    cls.bypass_device_restrictions = True  # let @onlyCUDA (and other device-only) tests run on openreg


def test_instantiated_for_openreg_only() -> None:
    """One class was generated, for PrivateUse1, and no CPU one (``only_for="openreg"``)."""
    assert len(GENERATED) == 1
    cls = GENERATED[0]
    assert cls.__name__ in ("TestOpenRegDeviceGenericPRIVATEUSE1", "TestOpenRegDeviceGenericOPENREG")
    assert not any(name.endswith("CPU") for name in globals() if name.startswith("TestOpenRegDeviceGeneric"))
    names = {n for n in dir(cls) if n.startswith("test_")}
    expected = {
        "test_device_is_openreg_openreg",
        "test_arange_sum_openreg_float32", "test_arange_sum_openreg_bfloat16", "test_arange_sum_openreg_int64",
        "test_copy_between_devices_openreg", "test_cuda_only_test_bypassed_openreg",
        *(f"test_matches_cpu_{op.formatted_name}_openreg_float32" for op in op_db if op.name in OPS),
    }
    assert expected <= names, sorted(expected - names)


def test_generated_tests_run_on_openreg() -> None:
    """Run the generated class with unittest: every test executes (none skipped) and passes."""
    (cls,) = GENERATED
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
    result = unittest.TestResult()
    suite.run(result)
    assert result.testsRun >= 6 + len(OPS), result.testsRun
    assert not result.failures and not result.errors, result.failures + result.errors
    skipped = [(str(t), why) for t, why in result.skipped]
    if torch.openreg.device_count() >= 2:
        assert not skipped, skipped
    assert cls.device_type == "openreg"


def test_pytorch_style_run_with_env(run_python) -> None:
    """examples/device_generic_tests.py, run as PyTorch's own test files are run, instantiates for openreg only."""
    result = run_python(
        "import runpy, sys; sys.argv = ['device_generic_tests.py', '-v']; "
        "runpy.run_path('examples/device_generic_tests.py', run_name='__main__')",
        # CI="" : under CI, PyTorch's run_tests writes XML reports (and needs the xmlrunner package)
        env={"PYTORCH_TESTING_DEVICE_ONLY_FOR": "openreg", "CI": ""},
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("test_device_openreg", "test_cuda_only_openreg", "test_op_runs_add_openreg_float32",
                 "test_op_runs_mul_openreg_float32", "test_op_runs_sum_openreg_float32"):
        assert f"{name} (" in result.stderr and "ok" in result.stderr, name
    assert "test_not_for_openreg" not in result.stderr
    assert "CPU" not in "".join(line for line in result.stderr.splitlines() if line.startswith("test_"))
    assert "Ran 5 tests" in result.stderr


def _run_isolation_cases(run_python, with_device_base: bool) -> str:
    env = {"PYTORCH_TESTING_DEVICE_ONLY_FOR": "openreg", "CI": ""}
    if with_device_base:
        import torch_openreg.testing

        env["TORCH_TEST_DEVICES"] = torch_openreg.testing.DEVICE_BASE
    result = run_python(
        "import runpy, sys; sys.argv = ['isolation_cases.py', '-v']; "
        "runpy.run_path('tests/torch/pytorch_style/isolation_cases.py', run_name='__main__')",
        env=env, timeout=240,
    )
    return result.stderr


def _outcome(output: str, test: str) -> str:
    (line,) = [line for line in output.splitlines() if line.startswith(f"{test}_openreg (")]
    return line.rsplit("... ", 1)[1]


def test_device_base_charges_a_kernel_error_to_the_test_that_caused_it(run_python) -> None:
    """With TORCH_TEST_DEVICES naming openreg's device base, the asynchronous error fails the test that
    launched the kernel (in its tearDown), the next test passes, and largeTensorTest asks openreg."""
    output = _run_isolation_cases(run_python, with_device_base=True)
    assert _outcome(output, "test_a_leaves_a_kernel_error") == "ERROR", output[-3000:]
    assert _outcome(output, "test_b_clean") == "ok", output[-3000:]
    assert _outcome(output, "test_c_fits_in_device_memory") == "ok", output[-3000:]
    assert _outcome(output, "test_d_needs_more_than_the_device_has") == "skipped 'Insufficient openreg:0 memory'"
    assert "Ran 4 tests" in output  # one generated class, not the autoloaded base's as well
    assert "aten::index.Tensor" in output and "out of bounds" in output


def test_without_the_device_base_the_error_lands_in_the_next_test(run_python) -> None:
    """What the device base fixes: PyTorch's plain PrivateUse1TestBase reports the error at the next
    test's first host read, and skips largeTensorTest as an unknown device."""
    output = _run_isolation_cases(run_python, with_device_base=False)
    assert _outcome(output, "test_a_leaves_a_kernel_error") == "ok", output[-3000:]
    assert _outcome(output, "test_b_clean") == "ERROR", output[-3000:]
    assert _outcome(output, "test_c_fits_in_device_memory") == "skipped 'Unknown device type'"


def _run_call_cases(run_python, device: str) -> str:
    import torch_openreg.testing

    env = {"PYTORCH_TESTING_DEVICE_ONLY_FOR": device, "CI": "", "TORCH_TEST_DEVICES": torch_openreg.testing.DEVICE_BASE}
    result = run_python(
        "import runpy, sys; sys.argv = ['call_cases.py', '-v']; "
        "runpy.run_path('tests/torch/pytorch_style/call_cases.py', run_name='__main__')",
        env=env, timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stderr


@pytest.mark.parametrize("device", ["cpu", "openreg"])
def test_pytorch_style_calls_behave_as_on_the_cpu(run_python, device) -> None:
    """The PyTorch-style file of call errors, warnings and CPU-equal results passes on the CPU and on openreg
    alike: every check raises (with the CPU's type and message) or warns at the call on both."""
    output = _run_call_cases(run_python, device)
    assert "Ran 9 tests" in output and "FAILED" not in output, output[-3000:]
    outcomes = {line.split(" (")[0]: line.rsplit("... ", 1)[1] for line in output.splitlines()
                if line.startswith("test_") and "... " in line}
    suffix = "openreg" if device == "openreg" else "cpu"
    expected_skip = {f"test_out_on_another_device_{suffix}"} if device == "cpu" else set()
    assert {t for t, o in outcomes.items() if o.startswith("skipped")} == expected_skip, outcomes
    assert all(o == "ok" for t, o in outcomes.items() if t not in expected_skip), outcomes
