"""The long ``torch.compile`` sweep on openreg: real models, export, AOTInductor, ONNX, each against the CPU.

Each compile with Inductor takes seconds to tens of seconds on a small machine, so CI runs a
representative part of these cases (``tests/torch/test_compile*.py`` call them) and this command runs
them all::

    python -m torch_openreg.compiler.check            # every case
    python -m torch_openreg.compiler.check gpt2_train  # some cases, by name
    python -m torch_openreg.compiler.check --list

Models are built from config classes (no downloads). Every case computes the same thing on the CPU in
eager mode and compiled on openreg, and compares them with ``torch.testing.assert_close``; it raises
``AssertionError`` on a mismatch. Hugging Face ``transformers`` and ``onnx``/``onnxruntime``/``onnxscript``
come with the ``compile`` extra (``pip install .[compile]``).
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable

import torch
from torch import nn

DEVICE = "openreg"
TOL = {"atol": 1e-4, "rtol": 1e-4}
CASES: dict[str, Callable[[], str]] = {}


def case(fn: Callable[[], str]) -> Callable[[], str]:
    """Register a case: it raises on a mismatch and returns a one-line note."""
    CASES[fn.__name__] = fn
    return fn


def _train_step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                loss_fn: Callable) -> torch.Tensor:
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss.detach()


def compare_training(make: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, loss_fn: Callable,
                     steps: int = 2, fullgraph: bool = True, **tol: float) -> None:
    """Eager training steps on the CPU against compiled steps on openreg (model, loss, backward, optimizer).

    SGD with momentum: Adam divides each gradient by its running magnitude, which turns the rounding noise
    of gradients that are zero in exact arithmetic (a bias before batch norm, an attention key bias) into
    full-size steps on either side.
    """
    torch.manual_seed(0)
    cpu = make()
    dev = copy.deepcopy(cpu).to(DEVICE)
    opt_cpu = torch.optim.SGD(cpu.parameters(), lr=1e-2, momentum=0.9)
    opt_dev = torch.optim.SGD(dev.parameters(), lr=1e-2, momentum=0.9)
    compiled = torch.compile(dev, fullgraph=fullgraph)
    step = torch.compile(opt_dev.step)
    for _ in range(steps):
        expected = _train_step(cpu, opt_cpu, x, y, loss_fn)
        opt_dev.zero_grad(set_to_none=True)
        loss = loss_fn(compiled(x.to(DEVICE)), y.to(DEVICE))
        loss.backward()
        step()
        torch.testing.assert_close(loss.detach().cpu(), expected, **(tol or TOL))
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **(tol or TOL))


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8))


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(8, 16, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


@case
def mlp_train() -> str:
    torch.manual_seed(0)
    compare_training(mlp, torch.randn(16, 32), torch.randn(16, 8), nn.functional.mse_loss)
    return "MLP: compiled forward, backward and optimizer step match eager CPU (fullgraph)"


@case
def cnn_train() -> str:
    torch.manual_seed(0)
    compare_training(cnn, torch.randn(4, 3, 16, 16), torch.randint(0, 10, (4,)), nn.functional.cross_entropy)
    return "CNN (conv, batch norm, pooling): compiled training steps match eager CPU (fullgraph)"


@case
def encoder_train() -> str:
    torch.manual_seed(0)
    x = torch.randn(2, 10, 32)
    compare_training(encoder, x, x, nn.functional.mse_loss)
    return "transformer encoder (SDPA): compiled training steps match eager CPU (fullgraph)"


def _gpt2(train: bool) -> tuple[nn.Module, nn.Module]:
    """A small GPT-2 from its config, on the CPU and on openreg with the same weights (tied as built)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=128, n_positions=64, bos_token_id=0,
                     eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(0)
    cpu = GPT2LMHeadModel(cfg).train(train)
    with torch.device(DEVICE):  # built on the device: ``Module.to`` would untie lm_head from wte
        dev = GPT2LMHeadModel(cfg).train(train)
    dev.load_state_dict(cpu.state_dict())
    return cpu, dev


@case
def gpt2_forward() -> str:
    cpu, dev = _gpt2(train=False)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    got = torch.compile(dev, fullgraph=True)(ids.to(DEVICE)).logits
    torch.testing.assert_close(got.cpu(), cpu(ids).logits, **TOL)
    return "GPT-2 forward (fullgraph) matches eager CPU"


@case
def gpt2_generate() -> str:
    cpu, dev = _gpt2(train=False)
    ids = torch.randint(0, 128, (1, 4), generator=torch.Generator().manual_seed(0))
    expected = cpu.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=0)
    dev.forward = torch.compile(dev.forward)
    got = dev.generate(ids.to(DEVICE), max_new_tokens=6, do_sample=False, pad_token_id=0)
    assert torch.equal(got.cpu(), expected), (got, expected)
    return "GPT-2 greedy generate with a compiled forward (key/value cache) gives the CPU's tokens"


@case
def gpt2_train() -> str:
    cpu, dev = _gpt2(train=True)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    opt_cpu = torch.optim.AdamW(cpu.parameters(), lr=1e-3)
    opt_dev = torch.optim.AdamW(dev.parameters(), lr=1e-3)

    def step(model: nn.Module, ids: torch.Tensor, opt: torch.optim.Optimizer) -> torch.Tensor:
        opt.zero_grad()
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss.detach()

    compiled = torch.compile(step)
    for _ in range(2):
        torch.testing.assert_close(compiled(dev, ids.to(DEVICE), opt_dev).cpu(), step(cpu, ids, opt_cpu), **TOL)
    for p, q in zip(cpu.parameters(), dev.parameters()):
        torch.testing.assert_close(q.detach().cpu(), p.detach(), **TOL)
    return "GPT-2 training steps (compiled step: forward, backward, AdamW) match eager CPU"


class _Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.l2(self.l1(x).relu()).softmax(-1)


def small_model() -> tuple[nn.Module, nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    cpu = _Small().eval()
    return cpu, copy.deepcopy(cpu).to(DEVICE), torch.randn(3, 8)


@case
def export() -> str:
    cpu, dev, x = small_model()
    program = torch.export.export(dev, (x.to(DEVICE),))
    devices = {n.meta["val"].device for n in program.graph.nodes if n.op == "placeholder"}
    assert devices == {torch.device(DEVICE, 0)}, devices
    torch.testing.assert_close(program.module()(x.to(DEVICE)).cpu(), cpu(x), **TOL)
    return "torch.export of a model on openreg: openreg placeholders, the exported module runs on openreg"


@case
def aoti() -> str:
    """Partial: AOTInductor needs a C++ wrapper; openreg refuses it at compile time with the reason."""
    _, dev, x = small_model()
    program = torch.export.export(dev, (x.to(DEVICE),))
    with tempfile.TemporaryDirectory() as tmp:
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=os.path.join(tmp, "model.pt2"))
        except Exception as exc:  # noqa: BLE001 - the refusal is the expected outcome
            if "openreg has no C++ or FX wrapper" not in str(exc):
                raise
            return "AOTInductor: refused at compile time with the reason (partial, see docs/compiler.md)"
    raise AssertionError("AOTInductor compiled an openreg model: update the docs and this case")


@case
def onnx() -> str:
    import onnxruntime

    cpu, dev, x = small_model()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        # optimize=False: onnxscript's rewriter keeps the last graph it matched (and the openreg weights in it)
        torch.onnx.export(dev, (x.to(DEVICE),), path, dynamo=True, optimize=False, verbose=False)
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
    torch.testing.assert_close(torch.from_numpy(out), dev(x.to(DEVICE)).cpu(), **TOL)
    torch.testing.assert_close(torch.from_numpy(out), cpu(x), **TOL)
    return "ONNX export (dynamo=True) of a model on openreg, run by onnxruntime, matches openreg and CPU"


def run(names: list[str]) -> int:
    """Run cases; print one line each; return the number of failures."""
    failures = 0
    for name in names:
        start = time.perf_counter()
        try:
            note = CASES[name]()
        except Exception:  # noqa: BLE001 - report and go on with the next case
            failures += 1
            print(f"FAIL {name} ({time.perf_counter() - start:.1f} s)\n{traceback.format_exc()}", flush=True)
        else:
            print(f"ok   {name} ({time.perf_counter() - start:.1f} s): {note}", flush=True)
    return failures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cases", nargs="*", help="case names (default: all)")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(CASES))
        return 0
    unknown = [n for n in args.cases if n not in CASES]
    if unknown:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    failures = run(args.cases or list(CASES))
    print(f"{failures} failed" if failures else "all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
