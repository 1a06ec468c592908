"""A PyTorch-style device-generic file (run as a script) for the mechanisms PyTorch's own suites exercise.

Written the way ``test_indexing.py``, ``test_reductions.py`` and ``test_shape_ops.py`` write their tests,
for any device: argument errors raised by the call itself with the CPU's exception type and message,
warnings delivered to Python's ``warnings`` at the call, results equal to the CPU's, an ``out=`` on the
wrong device refused. ``tests/torch/test_device_generic.py`` runs it on the CPU and on openreg (through
openreg's device base) and requires every test to pass on both. CI cannot fetch PyTorch's own files, so
this file and ``isolation_cases.py`` are the CI slice of them.
"""

import warnings

import torch
from torch.testing._internal.common_device_type import dtypes, instantiate_device_type_tests, onlyNativeDeviceTypes
from torch.testing._internal.common_utils import TestCase, run_tests


class TestCalls(TestCase):
    # Checks that live in a CPU kernel's host code: raised by the call, before anything is synchronized.
    def test_index_put_shape_mismatch(self, device):
        a = torch.zeros(5, device=device)
        with self.assertRaisesRegex(RuntimeError, "shape mismatch"):
            a[[0, 1]] = torch.ones(3, device=device)
        self.assertEqual(a, torch.zeros(5))  # nothing was written

    @dtypes(torch.float32, torch.int64)
    def test_out_dtype_refused(self, device, dtype):
        x = torch.ones(3, 4, device=device, dtype=dtype)
        with self.assertRaisesRegex(RuntimeError, "all only supports bool tensor for result, got"):
            torch.all(x, 0, out=torch.empty(4, device=device, dtype=dtype))
        with self.assertRaisesRegex(RuntimeError, r"torch\.frexp\(\) expects exponent to have int dtype"):
            torch.frexp(x.float(), out=(torch.empty_like(x.float()), torch.empty_like(x.float())))

    def test_more_than_64_dims(self, device):
        x = torch.randn([1] * 65, device=device)
        for op in (torch.sum, torch.mean, torch.std, torch.logsumexp):
            with self.assertRaisesRegex(RuntimeError, "only tensors with up to 64 dims are supported"):
                op(x, dim=0)

    def test_index_errors_are_index_errors(self, device):
        x = torch.arange(0, 100, device=device).view(2, 5, 10)
        with self.assertRaisesRegex(IndexError, "index 5 is out of bounds for dimension 1 with size 5"):
            x[0, 5]
        with self.assertRaises(TypeError):
            x[0.0:2.0]
        with self.assertRaisesRegex(IndexError, "Dimension out of range"):
            torch.movedim(x, 5, 0)

    def test_out_on_another_device(self, device):
        if torch.device(device).type == "cpu":
            self.skipTest("the CPU has no other device to refuse")
        x = torch.tensor([0.0, 1.0, 2.0], device=device)
        with self.assertRaisesRegex(RuntimeError, "on the same device"):
            torch.nonzero(x, out=torch.empty([], dtype=torch.long))

    # TORCH_WARN in a kernel reaches Python's warnings at the call, every time, as on the CPU.
    @dtypes(torch.float32, torch.float64)
    def test_warnings_at_the_call(self, device, dtype):
        t = torch.randn(10, 20, device=device, dtype=dtype)
        for _ in range(2):
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                torch.var(t, dim=-1, correction=20)
            self.assertIn("degrees of freedom is <= 0", str(w[0].message))
        v = torch.randn(5, 7, device=device)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            self.assertEqual(v[torch.tensor([1, 0, 1, 1, 0], dtype=torch.uint8, device=device)].shape, (3, 7))
        self.assertTrue(any("uint8" in str(m.message) for m in w))

    # Results equal to the CPU's where the meta kernel and the CPU kernel disagree, or a kernel is special.
    @onlyNativeDeviceTypes
    def test_results_like_the_cpu(self, device):
        x = torch.randn(2, 3, device=device)
        self.assertEqual(torch.nansum(x, dim=[]), torch.nansum(x.cpu(), dim=[]))
        m = torch.tensor([[1, 1, 2], [3, 3, 3]], device=device)
        values, indices = torch.empty(0, device=device, dtype=m.dtype), torch.empty(0, device=device, dtype=torch.long)
        torch.mode(m, -1, out=(values, indices))
        self.assertEqual((values, indices), torch.mode(m.cpu(), -1))
        rows = [x[i].sin() for i in range(x.shape[0])]  # the slices of one tensor: one call shape
        self.assertEqual(torch.stack(rows), x.cpu().sin())


instantiate_device_type_tests(TestCalls, globals())

if __name__ == "__main__":
    run_tests()
