"""OPENREG_MEMCHECK=1: each launch opens only the views of the buffers it names, reference counted across
streams, and closes them when it has run (a setting read at import: each test runs its own process)."""

from __future__ import annotations

import pytest

_PRELUDE = """
import ctypes, threading
import openreg
from openreg import platform
assert openreg.memcheck.enabled
G = platform.GRANULE
view = openreg.view_address

def prot(addr):
    with open("/proc/self/maps") as maps:
        for line in maps:
            span, perms = line.split()[:2]
            lo, hi = (int(x, 16) for x in span.split("-"))
            if lo <= addr < hi:
                return perms[:3]
"""


def _run(run_python, body: str) -> list[str]:
    proc = run_python(_PRELUDE + body, env={"OPENREG_MEMCHECK": "1"})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_a_launch_opens_the_views_it_names_and_closes_them_after(run_python):
    out = _run(run_python, """
p, other = openreg.malloc(64), openreg.malloc(64)
print(prot(view(p)))
seen = []
openreg.launch(lambda: seen.append((prot(p), prot(view(p)), prot(view(other)))), buffers=[p])
openreg.synchronize()
print(*seen[0], prot(view(p)))
""")
    assert out == ["---", "---", "rw-", "---", "---"]  # the device address stays closed throughout


def test_an_extent_opens_only_its_granules(run_python):
    out = _run(run_python, """
p = openreg.malloc(4 * G)
seen = []
openreg.launch(lambda: seen.extend(prot(view(p) + i * G) for i in range(4)), buffers=[(p + G + 8, G)])
openreg.synchronize()
print(*seen, *(prot(view(p) + i * G) for i in range(4)))
""")
    assert out == ["---", "rw-", "rw-", "---"] + ["---"] * 4


def test_overlapping_extents_on_two_streams_are_reference_counted(run_python):
    out = _run(run_python, """
p = openreg.malloc(3 * G)
started, gate, seen = threading.Event(), threading.Event(), {}
def long_kernel():
    started.set()
    gate.wait(10)
    seen["long"] = [prot(view(p) + i * G) for i in range(3)]
a, b = openreg.Stream(), openreg.Stream()
a.launch(long_kernel, buffers=[(p, 2 * G)])
started.wait(10)
b.launch(lambda: None, buffers=[(p + G, 2 * G)])
b.synchronize()
seen["between"] = [prot(view(p) + i * G) for i in range(3)]
gate.set()
a.synchronize()
print(*seen["between"], *seen["long"], *(prot(view(p) + i * G) for i in range(3)))
""")
    assert out == ["rw-", "rw-", "---"] * 2 + ["---"] * 3


@pytest.mark.parametrize("granule", ["", "16KiB"])
def test_the_copy_engine_and_copies_work_and_leave_every_view_closed(run_python, granule):
    env_granule = f"import os; assert os.environ.get('OPENREG_PROTECTION_GRANULE', '') == {granule!r}\n"
    body = env_granule + """
p = openreg.malloc(100)
openreg.memcpy_htod(p, b"abcdefgh")
q = openreg.malloc(100)
openreg.memcpy(q, p, 8, openreg.MemcpyKind.DEVICE_TO_DEVICE)
print(bytes(openreg.memcpy_dtoh(q, 8)).decode(), prot(view(p)), prot(view(q)), G >= platform.PAGE)
openreg.free(p)
openreg.free(q)
print(prot(view(p)))
"""
    env = {"OPENREG_MEMCHECK": "1"}
    if granule:
        env["OPENREG_PROTECTION_GRANULE"] = granule
    proc = run_python(_PRELUDE + body, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["abcdefgh", "---", "---", "True", "---"]
