"""PyTorch's device-generic test machinery on openreg, configured the way a backend runs PyTorch's own tests.

Run it like one of PyTorch's test files (``test/test_ops.py`` and friends from a PyTorch source
checkout of the installed version are run the same way)::

    PYTORCH_TESTING_DEVICE_ONLY_FOR=openreg python examples/device_generic_tests.py -v

``import torch`` loads openreg (autoload), ``PrivateUse1TestBase`` is then one of the device bases,
and the environment variable keeps only it (no CPU classes). Before instantiating, the backend
configures the base: which OpInfos generate tests, which tests to exclude, and whether tests
restricted to another device (``@onlyCUDA``) run anyway.
"""

import torch
from torch.testing._internal.common_device_type import (
    PrivateUse1TestBase,
    instantiate_device_type_tests,
    onlyCUDA,
    ops,
)
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.common_utils import TestCase, run_tests

# LITERALINCLUDE START: PRIVATEUSE1 TEST CONFIG
PrivateUse1TestBase.set_test_configs(
    op_allowlist={"add", "mul", "sum"},  # only these OpInfos generate @ops tests
    test_exclusions={"TestExample": ["test_not_for_openreg"]},  # per class: test names, or "*"
)
PrivateUse1TestBase.bypass_device_restrictions = True  # run @onlyCUDA-style tests on openreg too
# LITERALINCLUDE END: PRIVATEUSE1 TEST CONFIG


class TestExample(TestCase):
    def test_device(self, device):
        self.assertEqual(torch.device(device).type, "openreg")

    def test_not_for_openreg(self, device):
        raise AssertionError("excluded by test_exclusions: never instantiated")

    @onlyCUDA
    def test_cuda_only(self, device):
        self.assertEqual(torch.ones(1, device=device).device.type, "openreg")

    @ops(op_db, allowed_dtypes=(torch.float32,))
    def test_op_runs(self, device, dtype, op):
        for sample in op.sample_inputs(device, dtype):
            op(sample.input, *sample.args, **sample.kwargs)
        torch.openreg.synchronize()


instantiate_device_type_tests(TestExample, globals())

if __name__ == "__main__":
    run_tests()
