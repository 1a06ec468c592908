"""Fixtures shared by the runtime suite and the PyTorch suite (torch-free: the runtime suite never imports torch)."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported (torch, transformers, the test modules) lives for the whole run: freezing it
    keeps every later ``gc.collect()`` (the leak checks make hundreds) from walking it again."""
    gc.collect()
    gc.freeze()


def _no_core_dumps() -> None:
    """Child processes that are meant to crash must not write core files."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@pytest.fixture(scope="session")
def run_python():
    """Run ``code`` in a fresh interpreter, in the repository, with ``env`` over a clean environment.

    Clean means no OPENREG_* settings and no TORCH_DEVICE_BACKEND_AUTOLOAD from the calling shell, and
    the repository first on PYTHONPATH.
    """

    def run(code: str, env: dict[str, str] | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess:
        full_env = {
            k: v for k, v in os.environ.items() if not k.startswith("OPENREG_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"
        }
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        full_env.update(env or {})
        return subprocess.run(
            [sys.executable, "-c", code], env=full_env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
            preexec_fn=_no_core_dumps,
        )

    return run


@pytest.fixture
def deliberate_race():
    """For a test that races streams on purpose (to show what a missing synchronization does): the stream
    sanitizer (``openreg.sanitizer``) is off while it runs, whatever ``OPENREG_STREAM_SANITIZER`` says."""
    from openreg import sanitizer

    with sanitizer.sanitizing(False):
        yield
