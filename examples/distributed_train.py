"""Data-parallel training on openreg devices, one process per device, launched by torchrun.

    torchrun --nproc-per-node 2 examples/distributed_train.py
    torchrun --standalone --nproc-per-node 4 examples/distributed_train.py --steps 20   # OPENREG_DEVICE_COUNT=4

Each rank drives ``openreg:{LOCAL_RANK}``; CPU tensors (object collectives, the barrier) use gloo and
openreg tensors use occl. Every rank also trains the same model on the whole batch in one process on
the CPU and checks that the data-parallel model ends with the same parameters.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=32, help="global batch, split across the ranks")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])  # set by torchrun, with RANK, WORLD_SIZE, MASTER_ADDR/PORT
    torch.openreg.set_device(local_rank)
    dist.init_process_group("cpu:gloo,openreg:occl")  # PyTorch 2.13: name both backends
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("openreg", local_rank)
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} is not divisible by the world size {world}")

    net = DDP(model().to(device))
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    reference = model()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(1)
    per = args.batch // world
    for step in range(args.steps):
        x = torch.randn(args.batch, 16, generator=data)
        y = x.sum(dim=1, keepdim=True).sin()
        part = slice(rank * per, (rank + 1) * per)
        loss = torch.nn.functional.mse_loss(net(x[part].to(device)), y[part].to(device))
        opt.zero_grad()
        loss.backward()  # DDP averages the gradients over the ranks (all_reduce on occl)
        opt.step()
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x), y).backward()
        ref_opt.step()
        losses = [None] * world
        dist.all_gather_object(losses, loss.item())  # a CPU collective (gloo)
        if rank == 0 and (step % 5 == 0 or step == args.steps - 1):
            print(f"step {step}: loss per rank {[round(v, 4) for v in losses]}", flush=True)

    for p, r in zip(net.module.parameters(), reference.parameters()):
        torch.testing.assert_close(p.detach().cpu(), r.detach(), rtol=1e-4, atol=1e-5)
    dist.barrier()
    if rank == 0:
        print(f"ok: {world} ranks on openreg match the single-process CPU training after {args.steps} steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
