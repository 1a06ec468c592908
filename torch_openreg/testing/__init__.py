"""Testing helpers for openreg: the OpInfo conformance runner (:mod:`torch_openreg.testing.opinfo`)."""
