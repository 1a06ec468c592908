"""The optional features on the launch path are launch hooks (openreg/hooks.py): each one's switch is read
in few modules, none in the stream or its worker, and a feature that is off puts nothing on the path."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

import openreg
from openreg import hooks

ROOT = Path(__file__).resolve().parents[2]

# Each switch: the pattern of a read outside its own module, and the most modules that may read it (issue 31: 3).
# A feature reaches the other modules through its launch hook (openreg/hooks.py: the allocators walk
# ``hooks.allocated``, the copy engine ``hooks.host_access``), a cost or write set handed to the launch as a
# function it calls only while the feature is on (torch_openreg/aten/launch.py), or one function of its own
# (``sync_debug.run_reported``). Graph capture's public query, ``openreg.is_capturing`` (CUDA's
# ``cudaStreamIsCapturing``), is the program's API, not the feature's switch.
SWITCHES = {
    "timing.active": (r"\btiming\.active\b", 3),
    "memcheck.enabled": (r"\bmemcheck\.enabled\b", 3),
    "graph capture (a stream's capture)": (r"\b_?q\.capture\b", 3),
    "launch blocking": (r"\bLAUNCH_BLOCKING\b", 3),
    "timing.pricing": (r"\btiming\.pricing\b", 3),
    "sanitizer.enabled": (r"\bsanitizer\.enabled\b", 3),
    "sync_debug.mode": (r"\bsync_debug\.mode\b", 3),
}
LAUNCH_PATH = ("openreg/stream.py", "openreg/worker.py")


def _code(path: Path) -> str:
    """A module's code without its comments and strings (a docstring naming a switch does not read it)."""
    kept = []
    for tok in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.STRING):
            kept.append(tok.string)
    return " ".join(kept).replace(" . ", ".")


def readers(pattern: str) -> list[str]:
    """The modules of openreg/ and torch_openreg/ whose code matches ``pattern``."""
    found = []
    for package in ("openreg", "torch_openreg"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "openreg" / "settings.py":
                continue  # where every setting is read from the environment
            if re.search(pattern, _code(path)):
                found.append(str(path.relative_to(ROOT)))
    return found


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_switch_read_in_few_modules(switch):
    pattern, most = SWITCHES[switch]
    found = readers(pattern)
    assert len(found) <= most, f"{switch} is read in {len(found)} modules (at most {most}): {found}"


@pytest.mark.parametrize("switch", list(SWITCHES))
def test_the_launch_path_reads_no_switch(switch):
    found = [path for path in readers(SWITCHES[switch][0]) if path in LAUNCH_PATH]
    assert found == [], f"{switch} is read on the launch path: {found}"


def test_the_count_sees_a_read(tmp_path):
    """The scan finds a read in code and ignores one in a comment or a string."""
    sample = tmp_path / "sample.py"
    sample.write_text('"""timing.active"""\n# sanitizer.enabled\nif openreg.sanitizer . enabled:\n    pass\n')
    code = _code(sample)
    assert re.search(SWITCHES["sanitizer.enabled"][0], code)
    assert not re.search(SWITCHES["timing.active"][0], code)


_ALL_OFF = """
import openreg
from openreg import hooks, memory
assert hooks.registered() == [], hooks.registered()
for point in hooks.POINTS:
    assert getattr(hooks, point) == (), point
ptr = openreg.malloc(64)
s = openreg.Stream()
s.launch(lambda: None, buffers=(ptr,))
s.synchronize()
openreg.free(ptr)
print("ok")
"""


def test_features_off_put_nothing_on_the_launch_path():
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENREG_STREAM_SANITIZER", "OPENREG_MEMCHECK", "OPENREG_LAUNCH_BLOCKING",
                        "OPENREG_DEVICE_PROFILE", "OPENREG_LAUNCH_SITES")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", _ALL_OFF], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_feature_registers_its_hook_while_on():
    was = openreg.sanitizer.enabled
    with openreg.sanitizer.sanitizing(True):
        assert openreg.sanitizer._hook in hooks.registered()
        assert openreg.sanitizer._hook.check in hooks.check
        # the allocators and the copy engine reach the sanitizer through its hook, not its switch
        assert hooks.allocated and hooks.cached and hooks.host_access
    with openreg.sanitizer.sanitizing(False):
        assert openreg.sanitizer._hook not in hooks.registered()
        assert hooks.allocated == hooks.cached == hooks.host_access == ()
        assert all(getattr(h, "__self__", None) is not openreg.sanitizer._hook for h in hooks.check)
    assert openreg.sanitizer.enabled == was


def test_hooks_run_in_order_and_only_where_they_override():
    seen = []

    class Late(hooks.LaunchHook):
        order = 90

        def queued(self, stream, item, buffers, cost):
            seen.append(("late", item.name))

    class Early(hooks.LaunchHook):
        order = -5

        def queued(self, stream, item, buffers, cost):
            seen.append(("early", item.name))

    late, early = Late(), Early()
    hooks.add(late)
    hooks.add(early)
    try:
        assert early.queued in hooks.queued and late.queued in hooks.queued
        assert all(getattr(h, "__self__", None) not in (late, early) for h in hooks.check)  # not overridden
        s = openreg.Stream()
        s.launch(lambda: None, name="k")
        s.synchronize()
    finally:
        hooks.remove(late)
        hooks.remove(early)
    assert seen == [("early", "k"), ("late", "k")]
    assert late not in hooks.registered() and early not in hooks.registered()


def test_a_cost_function_is_called_only_while_simulated_time_is_on():
    calls = []

    def cost():
        calls.append(1)
        return openreg.timing.Cost("elementwise", bytes=64.0)

    s = openreg.Stream()
    previous = openreg.timing.set_profile(None)
    try:
        s.launch(lambda: None, name="k", cost=cost)
        s.synchronize()
        assert calls == []
        openreg.timing.set_profile("h100-sxm")
        start = openreg.timing.stream_time(s)
        s.launch(lambda: None, name="k", cost=cost)
        s.synchronize()
        assert calls == [1]
        assert openreg.timing.stream_time(s) > start
    finally:
        openreg.timing.set_profile(previous)
