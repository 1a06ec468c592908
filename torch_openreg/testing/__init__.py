"""Testing helpers for openreg: the OpInfo conformance runner (:mod:`torch_openreg.testing.opinfo`) and
the device test base for PyTorch's own test files (``TORCH_TEST_DEVICES=DEVICE_BASE``)."""

import os

#: The file to name in ``TORCH_TEST_DEVICES`` (see :mod:`torch_openreg.testing.device_base`).
DEVICE_BASE = os.path.join(os.path.dirname(__file__), "device_base.py")
