"""Fork safety and multiprocessing: a child forked after initialization refuses openreg; spawn works.

Every scenario runs in a fresh interpreter (``run_python``) so that the test process's own runtime
state is irrelevant; the child reports through its exit code and stdout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

MESSAGE = ("Cannot re-initialize OpenReg in forked subprocess. To use OpenReg with multiprocessing, "
           "you must use the 'spawn' start method")

# In the child, every call below must raise a RuntimeError carrying MESSAGE.
CHILD_CALLS = {
    "torch.openreg.init": "torch.openreg.init()",
    "torch.openreg.current_device": "torch.openreg.current_device()",
    "torch.openreg.synchronize": "torch.openreg.synchronize()",
    "torch.openreg.set_device": "torch.openreg.set_device(0)",
    "torch.openreg.Stream": "torch.openreg.Stream()",
    "torch.openreg.memory_allocated": "torch.openreg.memory_allocated()",
    "factory": "torch.ones(2, device='openreg')",
    "op on a parent tensor": "x + 1",
    "copy to cpu": "x.cpu()",
    "copy to device": "torch.ones(2).to('openreg')",
    "random": "torch.randn(2, device='openreg')",
    "item": "x.sum().item()",
    "item of a ready tensor": "x[0].item()",  # (no launch: the read's wait itself refuses)
}


def _fork_script(calls: dict[str, str], init_in_parent: bool) -> str:
    return textwrap.dedent(f"""
        import os, sys, torch
        calls = {calls!r}
        if {init_in_parent!r}:
            x = torch.ones(2, device='openreg')
            torch.openreg.synchronize()
        pid = os.fork()
        if pid == 0:
            failures = []
            for name, code in calls.items():
                try:
                    exec(code)
                except RuntimeError as exc:
                    if {MESSAGE!r} not in str(exc):
                        failures.append(f"{{name}}: wrong message {{exc}}")
                except Exception as exc:
                    failures.append(f"{{name}}: {{type(exc).__name__}} {{exc}}")
                else:
                    failures.append(f"{{name}}: no error")
            print("\\n".join(failures) or "all refused", flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        if {init_in_parent!r}:
            assert (x * 2).cpu().tolist() == [2.0, 2.0]  # the parent is unaffected
    """)


def test_forked_child_refuses_every_openreg_call(run_python):
    proc = run_python(_fork_script(CHILD_CALLS, init_in_parent=True), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "all refused"


def test_fork_before_init_is_fine(run_python):
    code = textwrap.dedent("""
        import os, torch
        torch.openreg.manual_seed(3)  # queued: does not initialize
        assert not torch.openreg.is_initialized()
        pid = os.fork()
        if pid == 0:
            ok = torch.arange(3.0, device='openreg').mul(2).cpu().tolist() == [0.0, 2.0, 4.0]
            os._exit(0 if ok and torch.openreg.initial_seed() == 3 else 5)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
        print(torch.ones(1, device='openreg').item())
    """)
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["0", "1.0"]


def test_is_initialized_false_in_forked_child(run_python):
    code = textwrap.dedent("""
        import os, torch
        torch.openreg.init()
        torch.ones(1, device='openreg')
        pid = os.fork()
        if pid == 0:
            os._exit(0 if not torch.openreg.is_initialized() else 6)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "0"


def test_multiprocessing_fork_pool_worker_gets_the_error(run_python):
    code = textwrap.dedent("""
        import multiprocessing as mp, torch

        def work(_):
            try:
                torch.ones(1, device='openreg')
            except RuntimeError as exc:
                return str(exc)
            return "no error"

        if __name__ == '__main__':
            torch.ones(1, device='openreg')
            with mp.get_context('fork').Pool(1) as pool:
                print(pool.map(work, [0])[0])
    """)
    proc = run_python(code, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert MESSAGE in proc.stdout


def _spawn_script(tmp_path) -> str:
    script = tmp_path / "spawn_main.py"
    script.write_text(textwrap.dedent("""
        import torch
        import torch.multiprocessing as mp

        def worker(rank, results):
            torch.openreg.set_device(rank)
            torch.openreg.manual_seed(rank)
            x = torch.arange(4.0, device=f'openreg:{rank}') * (rank + 1)
            results.put((rank, x.device.index, x.sum().item(), torch.openreg.current_device()))

        if __name__ == '__main__':
            torch.ones(1, device='openreg')  # the parent is initialized: children must not be forked
            ctx = mp.get_context('spawn')
            results = ctx.SimpleQueue()
            mp.spawn(worker, args=(results,), nprocs=2, join=True)
            print(sorted(results.get() for _ in range(2)))
    """))
    return str(script)


def test_torch_multiprocessing_spawn_works(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env = {k: v for k, v in env.items() if not k.startswith("OPENREG_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    proc = subprocess.run([sys.executable, _spawn_script(tmp_path)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[(0, 0, 6.0, 0), (1, 1, 12.0, 1)]"


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_process_start_methods_other_than_fork(tmp_path, method):
    script = tmp_path / "start_main.py"
    script.write_text(textwrap.dedent(f"""
        import multiprocessing as mp, torch

        def work(q):
            q.put(torch.full((2,), 5.0, device='openreg').sum().item())

        if __name__ == '__main__':
            torch.ones(1, device='openreg')
            ctx = mp.get_context({method!r})
            q = ctx.Queue()
            p = ctx.Process(target=work, args=(q,))
            p.start()
            print(q.get(timeout=120))
            p.join()
            assert p.exitcode == 0
    """))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env = {k: v for k, v in env.items() if not k.startswith("OPENREG_") and k != "TORCH_DEVICE_BACKEND_AUTOLOAD"}
    proc = subprocess.run([sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "10.0"
