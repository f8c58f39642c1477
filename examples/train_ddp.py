"""DDP training with DataLoaderX: each rank reads its part of every epoch, and a restart resumes mid-epoch.

Run (CPU, gloo; with GPUs it uses nccl and cuda:LOCAL_RANK)::

    torchrun --nproc_per_node 2 examples/train_ddp.py --checkpoint /tmp/ddp.pt --stop-after 5
    torchrun --nproc_per_node 2 examples/train_ddp.py --checkpoint /tmp/ddp.pt   # resumes at step 5

The loader is split across ranks automatically (no DistributedSampler to write), its epoch advances by
itself (no ``set_epoch``), and ``loader.state_dict()`` (a few ints) goes into the checkpoint next to
the model. After a restart, even with another ``--nproc_per_node``, the rest of the epoch is read with
nothing lost or repeated.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

from fastloader import DataLoaderX


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--stop-after", type=int, default=0, help="simulate a crash after this many steps")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")

    generator = torch.Generator().manual_seed(0)
    inputs = torch.randn(256, 8, generator=generator)
    dataset = TensorDataset(inputs, inputs.sum(dim=1, keepdim=True))
    # Workers from a fork server, not forked from this process while its process group's threads run
    # (a hazard on CPython before 3.11.10: see the distributed guide). The dataset must pickle. The server
    # imports this script and torch once, so that each worker forks with them instead of importing them.
    multiprocessing.set_forkserver_preload(["__main__", "torch", "fastloader"])
    loader = DataLoaderX(
        dataset,
        batch_size=16,
        shuffle=True,
        num_workers=1,
        local_rank=local_rank,
        seed=0,
        multiprocessing_context="forkserver",
    )
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Linear(8, 1).to(device), device_ids=[local_rank] if cuda else None
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    step, start_epoch = 0, 0
    if args.checkpoint.exists():
        checkpoint = torch.load(args.checkpoint, map_location=device, weights_only=True)
        model.module.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        loader.load_state_dict(checkpoint["loader"])  # applies to the next iter(): the rest of the epoch
        step, start_epoch = checkpoint["step"], checkpoint["loader"]["epoch"]
        print(f"rank {dist.get_rank()}: resumed at step {step}, epoch {start_epoch}", flush=True)

    for epoch in range(start_epoch, args.epochs):
        total = 0.0
        for features, targets in loader:
            loss = torch.nn.functional.mse_loss(model(features), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step, total = step + 1, total + loss.item()
            if args.stop_after and step == args.stop_after:
                save(args.checkpoint, model, optimizer, loader, step)
                print(f"rank {dist.get_rank()}: stopped at step {step}", flush=True)
                dist.destroy_process_group()
                return
        print(f"rank {dist.get_rank()}: epoch {epoch}: loss {total:.4f}, step {step}", flush=True)
    dist.destroy_process_group()


def save(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoaderX, step: int) -> None:
    # Ranks advance in lockstep, so rank 0's loader state describes every rank's position.
    state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}
    state.update(loader=loader.state_dict(), step=step)
    if dist.get_rank() == 0:
        torch.save(state, path)
    dist.barrier()


if __name__ == "__main__":
    main()
