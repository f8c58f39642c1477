"""Lightning with ``limit_train_batches=0.5`` restoring a checkpoint taken at the last batch of the cut epoch,
with DataLoaderX and torch's DataLoader; run by test_integrations.py, in one process or under torchrun
(2 ranks, DDP on the CPU), as a restarted job would be:

    python tests/integrations/lightning_cut_epoch.py OUTDIR first  # an uninterrupted run, then a run that
                            # checkpoints at the cut epoch's last batch (ModelCheckpoint) and crashes 2 steps later
    python tests/integrations/lightning_cut_epoch.py OUTDIR rest   # a new process: fit(ckpt_path=...)

Every variant writes the samples its training_step saw, per epoch, of each run to
OUTDIR/<variant>_rank<r>.json: {"full": {epoch: [...]}, "first": {...}, "rest": {...}}.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, DistributedSampler

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fastloader import DataLoaderX  # noqa: E402
from tests.helpers import preload_worker_modules  # noqa: E402
from tests.integrations.common import Items, make_loader  # noqa: E402
from tests.integrations.lightning_common import Crash, Recorder, trainer  # noqa: E402

BATCH = 4  # 26 batches an epoch on one process (13 kept), 13 per rank on two (6 kept)
LIMIT = 0.5

# (name, use_distributed_sampler, order, kind, num_workers). torch's loader is the control where it is exact:
# an order that is a function of the epoch (DistributedSampler), without workers (with workers its iterator,
# made before Lightning sets the sampler's epoch, has already drawn the cut epoch's order). shuffle=True on
# one process: torch's loader draws a fresh order in the new process; DataLoaderX must go on as uninterrupted.
SINGLE = [
    (f"single_{flag}_{order}_{kind}_w{workers}", flag == "ds", order, kind, workers)
    for flag in ("ds", "nods")
    for order in ("distributed", "global", "generator")
    for kind, workers in (("torch", 0), ("fastloader", 0), ("fastloader", 2))
    if kind == "fastloader" or order == "distributed"
]
# DDP: Lightning inserts its DistributedSampler; the user passes torch's; DataLoaderX splits by local_rank.
# Without workers: where they start from a fork server (tests.helpers) each epoch's start takes seconds.
DDP = [
    (f"ddp_{name}_{kind}_w0", flag, order, kind, 0)
    for name, flag, order in (("lightning", True, None), ("user", False, "sampler"), ("local", False, "local_rank"))
    for kind in ("torch", "fastloader")
]


def loader(order: str | None, kind: str, workers: int) -> Any:
    if order in ("distributed", "global", "generator"):  # one process
        cls = DataLoaderX if kind == "fastloader" else DataLoader
        dataset = Items()
        if order == "distributed":
            sampler = DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True, seed=5)
            return cls(dataset, batch_size=BATCH, sampler=sampler, num_workers=workers)
        extra = {"generator": torch.Generator().manual_seed(3)} if order == "generator" else {}
        return cls(dataset, batch_size=BATCH, shuffle=True, num_workers=workers, **extra)
    return make_loader(kind, order, batch_size=BATCH, num_workers=workers)


def main() -> None:
    preload_worker_modules()
    outdir, mode = Path(sys.argv[1]), sys.argv[2]
    ddp = "RANK" in os.environ
    rank = int(os.environ.get("RANK", 0))
    steps = 6 if ddp else 13  # the cut epoch's batches: the checkpoint is at its last one
    warnings.filterwarnings("ignore")
    for name, use_distributed_sampler, order, kind, workers in DDP if ddp else SINGLE:
        record_path, ckpt = outdir / f"{name}_rank{rank}.json", outdir / f"{name}.ckpt"
        record = json.loads(record_path.read_text()) if record_path.exists() else {}
        options: dict[str, Any] = {"max_epochs": 3, "limit_train_batches": LIMIT}
        options["use_distributed_sampler"] = use_distributed_sampler
        if ddp:
            options.update(strategy="ddp", devices=2)
        torch.manual_seed(0)  # the same script start every time (the model's init, then the loader)
        model = Recorder()
        if mode == "first":
            trainer(**options).fit(model, train_dataloaders=loader(order, kind, workers))
            record["full"] = model.seen
            torch.manual_seed(0)
            model = Recorder(crash_at=steps + 2)
            checkpoint = ModelCheckpoint(
                dirpath=outdir, filename=name, every_n_train_steps=steps, save_top_k=1, save_on_train_epoch_end=False
            )
            try:
                trainer(callbacks=[checkpoint], enable_checkpointing=True, **options).fit(
                    model, train_dataloaders=loader(order, kind, workers)
                )
            except Crash:
                pass
            record["first"] = model.seen
        else:
            trainer(**options).fit(model, train_dataloaders=loader(order, kind, workers), ckpt_path=ckpt)
            record["rest"] = model.seen
        record_path.write_text(json.dumps(record))


if __name__ == "__main__":
    main()
