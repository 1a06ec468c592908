"""Lightning's ``Trainer`` on openreg (``torch_openreg.integrations.lightning``), against the same runs on the CPU.

The training runs use ``examples/lightning_train.py`` (the chapter's example); DDP over two openreg
devices runs it as a script, since Lightning's ``"ddp"`` strategy starts its second process by running
the script again.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

L = pytest.importorskip("lightning")

from lightning.fabric.utilities.exceptions import MisconfigurationException  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy  # noqa: E402

from torch_openreg.integrations import lightning as openreg_lightning  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lightning_train.py"
_spec = importlib.util.spec_from_file_location("lightning_train", EXAMPLE)
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


def _trainer(**kwargs) -> L.Trainer:
    kwargs = {"logger": False, "enable_checkpointing": False, "enable_progress_bar": False,
              "enable_model_summary": False, **kwargs}
    return L.Trainer(**kwargs)


# LITERALINCLUDE START: TEST LIGHTNING
def test_trainer_trains_on_openreg_like_the_cpu():
    cpu_trainer, cpu = example.fit("cpu", 1, "32-true", example.data(8))
    trainer, model = example.fit("openreg", 1, "32-true", example.data(8))
    assert isinstance(trainer.accelerator, openreg_lightning.OpenRegAccelerator)
    assert isinstance(trainer.strategy, SingleDeviceStrategy)
    assert trainer.strategy.root_device == torch.device("openreg", 0)
    assert model.seen == {("openreg:0", "torch.float32")} and cpu.seen == {("cpu", "torch.float32")}
    assert len(model.losses) == 16
    assert_close(model.losses, cpu.losses)
    for p, q in zip(model.parameters(), cpu.parameters()):  # Lightning moves the model back to the CPU at the end
        assert_close(p.detach(), q.detach())


def test_bf16_mixed_autocasts_on_openreg():
    _, cpu = example.fit("cpu", 1, "bf16-mixed", example.data(8))
    trainer, model = example.fit("openreg", 1, "bf16-mixed", example.data(8))
    assert trainer.precision_plugin.device == "openreg"
    assert model.seen == {("openreg:0", "torch.bfloat16")} and cpu.seen == {("cpu", "torch.bfloat16")}
    assert_close(model.losses, cpu.losses)
# LITERALINCLUDE END: TEST LIGHTNING


def test_16_mixed_scales_like_a_hand_written_amp_loop():
    """``"16-mixed"``: float16 autocast and ``GradScaler("openreg")``, step for step like the same loop on the CPU."""
    trainer, model = example.fit("openreg", 1, "16-mixed", example.data(8))
    assert trainer.precision_plugin.device == "openreg" and trainer.precision_plugin.scaler is not None
    assert model.seen == {("openreg:0", "torch.float16")}
    reference = example.Regression()
    opt = reference.configure_optimizers()
    scaler = torch.amp.GradScaler("cpu")
    losses = []
    for _ in range(2):
        for x, y in example.data(8):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(reference.net(x).float(), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
    assert_close(model.losses, losses)
    assert trainer.precision_plugin.scaler.get_scale() == scaler.get_scale()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_close(p.detach(), q.detach())


def test_checkpoint_and_resume_continue_like_one_run(tmp_path):
    """``ModelCheckpoint`` saves the openreg model and optimizer; ``fit(ckpt_path=...)`` resumes exactly."""
    _, whole = example.fit("openreg", 1, "32-true", example.data(8))
    first = _trainer(accelerator="openreg", devices=1, max_epochs=1, enable_checkpointing=True,
                     default_root_dir=tmp_path)
    first.fit(example.Regression(), example.data(8))
    path = first.checkpoint_callback.best_model_path
    assert torch.load(path, weights_only=False)["state_dict"]["net.0.weight"].device.type == "openreg"
    resumed = example.Regression()
    _trainer(accelerator="openreg", devices=1, max_epochs=2, default_root_dir=tmp_path).fit(
        resumed, example.data(8), ckpt_path=path)
    assert_close(resumed.losses, whole.losses[8:])
    for p, q in zip(resumed.parameters(), whole.parameters()):
        assert_close(p, q)


def test_auto_picks_openreg_where_lightning_would_pick_the_cpu():
    trainer = _trainer(devices=1)
    assert isinstance(trainer.accelerator, openreg_lightning.OpenRegAccelerator)
    assert trainer.strategy.root_device == torch.device("openreg", 0)


def test_devices_by_index_and_the_cpu_unchanged(two_devices):
    trainer = _trainer(accelerator="openreg", devices=[1])
    assert trainer.strategy.root_device == torch.device("openreg", 1)
    trainer = _trainer(accelerator="openreg", devices="1,")
    assert trainer.strategy.root_device == torch.device("openreg", 1)
    cpu = _trainer(accelerator="cpu", devices=1, precision="bf16-mixed")
    assert cpu.strategy.root_device == torch.device("cpu") and cpu.precision_plugin.device == "cpu"


@pytest.mark.parametrize("strategy,start_method", [("auto", "popen"), ("ddp", "popen"), ("ddp_spawn", "spawn"),
                                                    ("ddp_find_unused_parameters_true", "popen")])
def test_ddp_family_gets_openregs_strategy(strategy, start_method, two_devices):
    trainer = _trainer(accelerator="openreg", devices=2, strategy=strategy)
    assert type(trainer.strategy) is openreg_lightning.OpenRegDDPStrategy
    assert trainer.strategy._start_method == start_method
    assert trainer.strategy.parallel_devices == [torch.device("openreg", 0), torch.device("openreg", 1)]
    assert trainer.strategy._get_process_group_backend() == "cpu:gloo,openreg:occl"


@pytest.mark.parametrize("devices,message", [
    (3, "more openreg devices than"), (-2, "is not a device count"), ("two", "neither a device count"),
    ([0, 0], "distinct openreg device indices"), ([5], r"\[5\] are not"), (1.5, "must be an int"),
])
def test_bad_devices_are_refused(devices, message, two_devices):
    if devices == 3 and torch.openreg.device_count() > 2:
        pytest.skip("needs exactly two openreg devices")
    with pytest.raises(MisconfigurationException, match=message):
        _trainer(accelerator="openreg", devices=devices)


def test_a_plain_ddp_strategy_instance_is_refused_with_the_fix(two_devices):
    with pytest.raises(MisconfigurationException, match="OpenRegDDPStrategy"):
        _trainer(accelerator="openreg", devices=2, strategy=DDPStrategy())


def test_importing_twice_wraps_once():
    connector = openreg_lightning._AcceleratorConnector
    wrapped = connector._choose_strategy
    openreg_lightning.install()
    assert connector._choose_strategy.__openreg_wrapped__ is wrapped.__openreg_wrapped__


# LITERALINCLUDE START: TEST LIGHTNING DDP
def test_ddp_on_two_devices_matches_one_cpu_process(tmp_path, two_devices):
    """``devices=2``: Lightning starts rank 1, DDP averages gradients over occl; the reference is one CPU process."""
    out = tmp_path / "result"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(EXAMPLE), "--devices", "2", "--json", str(out)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"result.{r}").read_text()) for r in range(2)]
    for rank, result in enumerate(ranks):
        assert result["world"] == 2 and result["strategy"] == "OpenRegDDPStrategy"
        assert result["root_device"] == f"openreg:{rank}" and result["seen"] == [[f"openreg:{rank}", "torch.float32"]]
        assert result["wrapper"] == {"type": "DistributedDataParallel", "device_ids": [rank]}
        assert result["backend"] == "cpu:gloo,openreg:occl"
        for p, q in zip(result["params"], result["reference_params"]):
            assert_close(torch.tensor(p), torch.tensor(q), rtol=1e-5, atol=1e-6)
    # each rank saw half of every batch: their mean loss is the whole batch's; sync_dist logged that mean
    assert_close([(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"])], ranks[0]["reference_losses"])
    assert_close(ranks[0]["logged_loss"], ranks[0]["reference_losses"][-1])
    assert ranks[0]["losses"] != ranks[1]["losses"]
# LITERALINCLUDE END: TEST LIGHTNING DDP
