"""The device test base PyTorch's own test files use for openreg: ``TORCH_TEST_DEVICES=<this file>``.

PyTorch's ``common_device_type`` runs each file named in ``TORCH_TEST_DEVICES`` (with its own module
globals, ``PrivateUse1TestBase`` among them) and adds the file's ``TEST_CLASS`` to the device bases.
Ours is ``PrivateUse1TestBase`` plus what a backend with asynchronous kernels needs so that one
test's failure never lands in another's:

- after each test, every openreg device is synchronized, so a kernel error the test caused is
  reported against that test (an error in its ``tearDown``), not at the next test's first host read;
- before each test, an error still pending from code that ran outside any test is printed and
  dropped rather than charged to the test;
- ``largeTensorTest`` asks openreg how much device memory is free (PyTorch's check knows only
  cpu, mps, cuda and xpu and skips any other device as "Unknown device type").

The file takes the autoloaded ``PrivateUse1TestBase`` out of ``common_device_type``'s list of bases
(the same list object its globals hold), so each test runs once, in the generated class
``<TestClass>PRIVATEUSE1``. Usage::

    TORCH_TEST_DEVICES=$(python -c "import torch_openreg.testing as t; print(t.DEVICE_BASE)") \\
    PYTORCH_TESTING_DEVICE_ONLY_FOR=openreg python test/test_indexing.py
"""

import sys

if "PrivateUse1TestBase" not in globals():  # imported as a module rather than run by common_device_type
    from torch.testing._internal.common_device_type import PrivateUse1TestBase

import torch

_CDT = "torch.testing._internal.common_device_type"


def _synchronize_all() -> BaseException | None:
    """Synchronize every openreg device; return the first error reported (all devices are drained)."""
    first = None
    for index in range(torch.openreg.device_count()):
        try:
            torch.openreg.synchronize(index)
        except Exception as error:  # noqa: BLE001 - returned to the caller, which decides
            first = first or error
    return first


def _openreg_memory_check(fallback):
    """``_has_sufficient_memory`` that answers for openreg devices from their free memory."""

    def has_sufficient_memory(device, size) -> bool:
        device = torch.device(device)
        if device.type != torch._C._get_privateuse1_backend_name():
            return fallback(device, size)
        torch.openreg.empty_cache()
        free, _ = torch.openreg.mem_get_info(device.index or 0)
        return free >= size

    has_sufficient_memory.__openreg_wrapped__ = fallback
    return has_sufficient_memory


# LITERALINCLUDE START: OPENREG TEST BASE
class OpenRegTestBase(PrivateUse1TestBase):
    """``PrivateUse1TestBase`` whose tests each answer for their own asynchronous kernel errors."""

    @classmethod
    def setUpClass(cls) -> None:
        super().setUpClass()
        module = sys.modules[_CDT]
        if not hasattr(module._has_sufficient_memory, "__openreg_wrapped__"):
            module._has_sufficient_memory = _openreg_memory_check(module._has_sufficient_memory)

    def setUp(self) -> None:
        stale = _synchronize_all()
        if stale is not None:
            print(f"openreg: dropped an asynchronous error raised outside any test: {stale}", file=sys.stderr)
        super().setUp()

    def tearDown(self) -> None:
        try:
            super().tearDown()
        finally:
            error = _synchronize_all()
            if error is not None:
                raise error  # this test launched the failing kernel: it fails, the next one starts clean
# LITERALINCLUDE END: OPENREG TEST BASE


TEST_CLASS = OpenRegTestBase
# Instead of the autoloaded PrivateUse1TestBase, not beside it: each test would run twice, and both
# generated classes would be named <TestClass>PRIVATEUSE1.
if "device_type_test_bases" in globals() and PrivateUse1TestBase in device_type_test_bases:  # noqa: F821
    device_type_test_bases.remove(PrivateUse1TestBase)  # noqa: F821 - common_device_type's own list
