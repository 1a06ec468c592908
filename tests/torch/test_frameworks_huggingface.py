"""Hugging Face ``Trainer`` and ``accelerate`` train on openreg like on the CPU (docs/frameworks.md).

Both pick their device from a fixed list of vendors; ``ACCELERATE_TORCH_DEVICE=openreg`` (read by
``accelerate.PartialState`` and by ``TrainingArguments._setup_devices``) puts them on openreg. Every
run is compared with the same run on the CPU. GPT-2 is built from a config (nothing is downloaded),
with dropout off: openreg has its own generator, as CUDA has, so dropout masks draw from another
stream of numbers than the CPU's once the data loader has drawn from the CPU generator.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.testing import assert_close

transformers = pytest.importorskip("transformers")
accelerate = pytest.importorskip("accelerate")

from accelerate.state import AcceleratorState  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_accelerate_state(monkeypatch):
    """accelerate keeps its device in a process-wide singleton: start and end every test without one."""
    for name in ("ACCELERATE_TORCH_DEVICE", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_USE_CPU"):
        monkeypatch.delenv(name, raising=False)
    AcceleratorState._reset_state(reset_partial_state=True)
    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def _gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32, bos_token_id=0,
                        eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    return GPT2LMHeadModel(config)


def _dataset() -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (32, 16), generator=g)
    return [{"input_ids": row, "labels": row} for row in ids]


class _Losses(TrainerCallback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


# LITERALINCLUDE START: TEST HF TRAINER
def _train(tmp_path, monkeypatch, device: str, bf16: bool = False):
    """Six steps of ``Trainer`` on ``device``; returns the losses, the model and the device of its forward calls."""
    if device == "openreg":
        monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "openreg")  # the documented setting
        if bf16:  # TrainingArguments(bf16=True) is refused on openreg: see test_bf16_argument_is_refused
            monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=4, max_steps=6, learning_rate=1e-3,
                             logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True, seed=0,
                             use_cpu=device == "cpu", bf16=bf16 and device == "cpu")
    model = _gpt2()
    seen = set()
    model.transformer.h[0].mlp.c_fc.register_forward_hook(lambda m, i, out: seen.add((out.device.type, out.dtype)))
    callback = _Losses()
    Trainer(model=model, args=args, train_dataset=_dataset(), callbacks=[callback]).train()
    return callback.losses, model, seen


def test_trainer_trains_gpt2_like_the_cpu(tmp_path, monkeypatch):
    cpu_losses, cpu_model, cpu_seen = _train(tmp_path, monkeypatch, "cpu")
    losses, model, seen = _train(tmp_path, monkeypatch, "openreg")
    assert seen == {("openreg", torch.float32)} and cpu_seen == {("cpu", torch.float32)}
    assert len(losses) == 6
    assert_close(losses, cpu_losses)
    for (name, p), q in zip(model.named_parameters(), cpu_model.parameters()):
        assert p.device.type == "openreg", name
        assert_close(p.detach().cpu(), q.detach(), msg=name)
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied after Trainer moved the model


def test_trainer_bf16_autocasts_on_openreg(tmp_path, monkeypatch):
    cpu_losses, _, cpu_seen = _train(tmp_path, monkeypatch, "cpu", bf16=True)
    losses, _, seen = _train(tmp_path, monkeypatch, "openreg", bf16=True)
    assert seen == {("openreg", torch.bfloat16)} and cpu_seen == {("cpu", torch.bfloat16)}
    # the CPU's autocast lists differ from CUDA's (which openreg uses) for a few operators
    assert_close(losses, cpu_losses, rtol=0, atol=1e-2)
# LITERALINCLUDE END: TEST HF TRAINER


def test_without_the_setting_trainer_stays_on_the_cpu(tmp_path):
    """The upstream limitation the setting works around: openreg is not on transformers' list of devices."""
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none")
    assert args.device == torch.device("cpu")


def test_bf16_argument_is_refused(tmp_path, monkeypatch):
    """``TrainingArguments.__post_init__`` asks ``is_torch_bf16_gpu_available()``, which lists vendors by name."""
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "openreg")
    with pytest.raises(ValueError, match="doesn't support bf16"):
        TrainingArguments(output_dir=str(tmp_path), bf16=True, report_to="none")


def test_from_pretrained_loads_safetensors_onto_openreg(tmp_path):
    model = _gpt2()
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    for device_map, device in (("openreg", "openreg:0"), ("openreg:1", "openreg:1"), ({"": 1}, "openreg:1")):
        loaded = GPT2LMHeadModel.from_pretrained(tmp_path, device_map=device_map)
        assert loaded.lm_head.weight is loaded.transformer.wte.weight
        for (name, p), q in zip(loaded.named_parameters(), model.parameters()):
            assert p.device == torch.device(device), name
            assert_close(p.detach().cpu(), q.detach(), rtol=0, atol=0)


# LITERALINCLUDE START: TEST ACCELERATE
def _accelerate_run(device: str, mixed_precision: str = "no") -> tuple[list[float], torch.nn.Module, set]:
    """The standard ``prepare(model, optimizer, dataloader)`` flow; the optimizer is built before ``prepare``."""
    AcceleratorState._reset_state(reset_partial_state=True)
    acc = accelerate.Accelerator(cpu=device == "cpu", mixed_precision=mixed_precision)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True,
                                         generator=torch.Generator().manual_seed(2))
    model, opt, loader = acc.prepare(model, opt, loader)
    seen, losses = set(), []
    acc.unwrap_model(model)[0].register_forward_hook(lambda m, i, out: seen.add((out.device.type, out.dtype)))
    for _ in range(2):
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb).float(), yb)
            opt.zero_grad()
            acc.backward(loss)
            opt.step()
            losses.append(loss.item())
    return losses, acc.unwrap_model(model), seen


def test_accelerate_prepare_trains_like_the_cpu(monkeypatch):
    cpu_losses, cpu_model, cpu_seen = _accelerate_run("cpu")
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "openreg")
    losses, model, seen = _accelerate_run("openreg")
    assert seen == {("openreg", torch.float32)} and cpu_seen == {("cpu", torch.float32)}
    assert_close(losses, cpu_losses)
    for p, q in zip(model.parameters(), cpu_model.parameters()):
        assert p.device.type == "openreg"
        assert_close(p.detach().cpu(), q.detach())
# LITERALINCLUDE END: TEST ACCELERATE


def test_accelerate_bf16_autocasts_on_openreg(monkeypatch):
    cpu_losses, _, cpu_seen = _accelerate_run("cpu", "bf16")
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "openreg")
    losses, _, seen = _accelerate_run("openreg", "bf16")
    assert seen == {("openreg", torch.bfloat16)} and cpu_seen == {("cpu", torch.bfloat16)}
    assert_close(losses, cpu_losses, rtol=0, atol=1e-2)


def test_accelerate_fp16_is_refused_by_name(monkeypatch):
    """``Accelerator.__init__`` allows fp16 on a fixed list of device types."""
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "openreg")
    with pytest.raises(ValueError, match="fp16 mixed precision requires a device in .*not 'openreg'"):
        accelerate.Accelerator(mixed_precision="fp16")


def test_accelerate_without_the_setting_picks_the_cpu():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert accelerate.Accelerator().device == torch.device("cpu")
