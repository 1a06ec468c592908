"""A PyTorch-style device-generic file (run as a script) for the device base's isolation tests.

``test_a`` leaves an asynchronous kernel error behind; ``test_b`` is clean. With openreg's device base
(``TORCH_TEST_DEVICES``) the error is ``test_a``'s; with the plain ``PrivateUse1TestBase`` it lands in
``test_b``. ``largeTensorTest`` runs or skips from openreg's free memory.
"""

import torch
from torch.testing._internal.common_device_type import instantiate_device_type_tests, largeTensorTest
from torch.testing._internal.common_utils import TestCase, run_tests


class TestIsolation(TestCase):
    def test_a_leaves_a_kernel_error(self, device):
        t = torch.ones(3, device=device)
        for _ in range(2):  # valid calls: the first two of a call shape run at the call, the next one is queued
            t[torch.tensor([0], device=device)]
        t[torch.tensor([7], device=device)]  # out of bounds: found by the kernel, after the call returned

    def test_b_clean(self, device):
        self.assertEqual(torch.ones(2, device=device).sum().item(), 2.0)

    @largeTensorTest("1GB")
    def test_c_fits_in_device_memory(self, device):
        self.assertEqual(torch.empty(2**28, device=device).numel(), 2**28)

    @largeTensorTest("64GB")
    def test_d_needs_more_than_the_device_has(self, device):
        raise AssertionError("largeTensorTest must skip this on a 4 GiB device")


instantiate_device_type_tests(TestIsolation, globals())

if __name__ == "__main__":
    run_tests()
