"""Lightning's ``Trainer`` on openreg, checked against the same training by ``Trainer(accelerator="cpu")``.

    python examples/lightning_train.py                            # one openreg device
    python examples/lightning_train.py --precision bf16-mixed     # autocast on openreg
    python examples/lightning_train.py --devices 2                # DDP over occl, one process per device

With ``--devices 2`` Lightning's default ``"ddp"`` strategy starts the second process itself (it runs
this script again with ``LOCAL_RANK=1``); each process trains on ``openreg:{rank}`` with half of every
batch, and DDP averages the gradients over ``occl``. The reference is one process on the CPU with the
whole batch, which a correct data-parallel run matches. ``--json PATH`` writes each rank's results to
``PATH.<rank>`` (the tests read them); the script exits with an error when openreg and the CPU differ.
"""

from __future__ import annotations

import argparse
import json

import lightning as L
import torch

import torch_openreg.integrations.lightning  # noqa: F401  (registers accelerator="openreg")


class Regression(L.LightningModule):
    """A small MLP; records the device and dtype each training step saw, and its loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.seen: set[tuple[str, str]] = set()
        self.losses: list[float] = []
        self.wrapper: dict = {}

    def on_train_start(self) -> None:
        wrapped = self.trainer.strategy.model  # DistributedDataParallel under DDP
        self.wrapper = {"type": type(wrapped).__name__, "device_ids": getattr(wrapped, "device_ids", None)}

    def training_step(self, batch: list[torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        out = self.net(x)
        self.seen.add((str(out.device), str(out.dtype)))
        loss = torch.nn.functional.mse_loss(out.float(), y)
        self.log("loss", loss, sync_dist=True)  # the mean over the ranks: an all_reduce of an openreg tensor
        self.losses.append(loss.item())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def data(batch: int, ddp_order: bool = False) -> torch.utils.data.DataLoader:
    """64 samples in order; ``ddp_order``: in the order Lightning's DDP sampler deals them out, whole batches.

    Under DDP Lightning samples with ``DistributedSampler(shuffle=True, seed=0)``, which gives rank ``r`` every
    ``world``-th sample of one permutation per epoch: the ranks' batches at a step make up one contiguous
    slice of that permutation, which is what the same sampler with a single replica yields.
    """
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=g)
    y = x.sum(dim=1, keepdim=True).sin()
    dataset = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, seed=0) if ddp_order else None
    return torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler)


def fit(accelerator: str, devices: int, precision: str, loader: torch.utils.data.DataLoader) -> tuple[L.Trainer,
                                                                                                     Regression]:
    model = Regression()
    trainer = L.Trainer(accelerator=accelerator, devices=devices, precision=precision, max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    return trainer, model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--precision", default="32-true", choices=["32-true", "bf16-mixed"])
    parser.add_argument("--batch", type=int, default=8, help="per device")
    parser.add_argument("--json", help="write each rank's results to JSON.<rank>")
    args = parser.parse_args()

    # the CPU reference: one process, the whole batch
    _, reference = fit("cpu", 1, args.precision, data(args.batch * args.devices, ddp_order=args.devices > 1))
    trainer, model = fit("openreg", args.devices, args.precision, data(args.batch))  # starts the other ranks
    result = {
        "rank": trainer.global_rank,
        "world": trainer.world_size,
        "strategy": type(trainer.strategy).__name__,
        "root_device": str(trainer.strategy.root_device),
        "seen": sorted(model.seen),
        "wrapper": model.wrapper,
        "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
        "logged_loss": float(trainer.callback_metrics["loss"]),
        "losses": model.losses,
        "params": [p.detach().cpu().flatten().tolist() for p in model.parameters()],
        "reference_losses": reference.losses,
        "reference_params": [p.detach().flatten().tolist() for p in reference.parameters()],
    }
    if args.json:
        with open(f"{args.json}.{trainer.global_rank}", "w") as f:
            json.dump(result, f)
    tolerance = {"rtol": 1e-5, "atol": 1e-6} if args.precision == "32-true" else {"rtol": 2e-2, "atol": 2e-2}
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), **tolerance)
    print(f"rank {result['rank']}/{result['world']} on {result['root_device']} ({result['strategy']}, "
          f"{args.precision}): final loss {result['logged_loss']:.6f}, parameters match the CPU's")


if __name__ == "__main__":
    main()
